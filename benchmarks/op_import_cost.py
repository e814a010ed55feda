"""What a patched model's first forward pays to import liger-aot's op modules.

A patched model imports its op modules at its first call of each (liger_aot.transformers
patches lazily), so their import time is part of a cold first step. This measures it in a
fresh process in the state that first forward meets: torch, the model's transformers module,
the patch applied, the model built, AdamW created. Four ways, each in its own process:

  lazy  / eager   the compile path's custom ops defined at TorchDynamo's first compile (as
                  shipped) or at declaration (liger_aot.ops.define_custom_ops() first: the
                  behaviour before session 16)
  pyc   / source  liger_aot's modules loaded from .pyc files (what a pip install leaves) or
                  compiled from source (a source tree run without bytecode)

For the `source` runs the script deletes liger_aot's and kernel_src's __pycache__ folders, and
for the `pyc` runs it writes them (end_to_end.byte_compile_libraries); the children run with
PYTHONDONTWRITEBYTECODE=1 so neither changes under them.

  python benchmarks/op_import_cost.py [--model qwen2_5_0_5b] [--repeats 2] [--out DIR]
  python benchmarks/op_import_cost.py --device cpu --tiny --repeats 1   (plumbing check)

Prints one line a run and a table of medians; writes op_import_cost.json to --out.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARKER = "@@OP_IMPORT_COST@@ "
# The op modules each model family's patch imports in its first forward and backward.
OP_MODULES = {
    "llama": ("rms_norm", "rope", "swiglu", "fused_linear_cross_entropy"),
    "qwen2": ("rms_norm", "rope", "swiglu", "fused_linear_cross_entropy"),
    "gemma2": ("rms_norm", "rope", "geglu", "fused_linear_cross_entropy"),
}
WAYS = ("lazy-pyc", "eager-pyc", "lazy-source", "eager-source")


def child(spec: dict):
    sys.path[:0] = [HERE, ROOT]
    import torch

    device = spec["device"]
    if device == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
    import end_to_end as e2e
    from transformers import AutoModelForCausalLM

    model_type = e2e.MODELS[spec["model"]]["model_type"]
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    config = e2e.build_config(spec["model"], spec["tiny"], None)
    e2e.apply_patch("liger-aot", model_type)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=e2e.MODELS[spec["model"]]["attn"])
    torch.optim.AdamW(model.parameters(), lr=1e-4)
    import liger_aot.ops

    t = time.perf_counter()
    if spec["way"].startswith("eager"):
        liger_aot.ops.define_custom_ops()
    for name in OP_MODULES[model_type]:
        importlib.import_module(f"liger_aot.ops.{name}")
    seconds = time.perf_counter() - t
    from liger_aot.ops import _custom_ops

    print(MARKER + json.dumps(dict(way=spec["way"], seconds=seconds,
                                   defined=sum(op._op is not None for op in _custom_ops._declared),
                                   declared=len(_custom_ops._declared))), flush=True)


def set_bytecode(e2e, present: bool):
    if present:  # as end_to_end.py does before its children
        done = e2e.byte_compile_libraries(["liger-aot"])["liger_aot"]
        if done != "compiled":
            raise SystemExit(f"liger_aot {done}")
        return
    for top in e2e.LIGER_AOT_SOURCE_DIRS:
        for folder, subdirs, _ in os.walk(os.path.join(ROOT, top)):
            if "__pycache__" in subdirs:
                shutil.rmtree(os.path.join(folder, "__pycache__"))
                subdirs.remove("__pycache__")


def main(argv=None) -> int:
    sys.path.insert(0, HERE)
    import end_to_end as e2e

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2_5_0_5b", choices=sorted(e2e.MODELS))
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny config (plumbing checks)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each way (default 2)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="output directory")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if args.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    runs = []
    for phase in ("source", "pyc"):  # source first: the pyc phase leaves the tree compiled
        set_bytecode(e2e, phase == "pyc")
        for _ in range(args.repeats):
            for way in (w for w in WAYS if w.endswith(phase)):
                spec = dict(way=way, model=args.model, device=args.device, tiny=args.tiny)
                proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                      capture_output=True, text=True, env=env, timeout=600)
                line = next((x for x in proc.stdout.splitlines() if x.startswith(MARKER)), None)
                if line is None:
                    print(f"{way}: failed\n{proc.stderr[-2000:]}", flush=True)
                    return 1
                runs.append(json.loads(line[len(MARKER):]))
                r = runs[-1]
                print(f"{way:<13} {r['seconds'] * 1e3:7.1f} ms  custom ops defined "
                      f"{r['defined']}/{r['declared']}", flush=True)
    print(f"\n{args.model}: import of {', '.join(OP_MODULES[e2e.MODELS[args.model]['model_type']])}"
          f" (median of {args.repeats})")
    for way in WAYS:
        ms = statistics.median(r["seconds"] for r in runs if r["way"] == way) * 1e3
        print(f"  {way:<13} {ms:7.1f} ms")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "op_import_cost.json"), "w") as f:
        json.dump(dict(model=args.model, device=args.device, tiny=args.tiny, runs=runs), f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
