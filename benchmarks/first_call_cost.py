"""Host cost of liger-aot's first calls in a fresh process, on a CPU: no GPU needed.

A cold training step pays, besides the kernels, for importing the op modules, finding each
variant in the artifact set (the manifest's parse, the integrity checks, the binary's read)
and building each variant's launcher. This times those parts, per op, in fresh processes,
for the ops and launch shapes of one of end_to_end.py's models:

  python benchmarks/first_call_cost.py --artifacts DIR [--model qwen2_5_0_5b] [--repeats 5]
      [--out DIR]

DIR holds <arch>/manifest.json (`liger-aot build --arch sm90 --out DIR`). What is real and
what is a stand-in is as in host_microbench.py: the driver is a do-nothing stand-in, the arch
is sm90 (132 multiprocessors), tensors are CPU tensors that report device 0, and no kernel
runs; the registry's lookups, integrity checks and binary reads are the real ones, and each
binary is copied into the buffer the driver would load it from. The matmuls of fused linear
cross entropy run for real on the CPU, on a hidden size of 64 (the variants depend on the
vocabulary only), and torch's first-use costs (autograd, a bf16 matmul, a bf16 backward) are
paid before the timing starts: the baseline eager step pays them too.

Phases (ms, medians over the fresh processes):
  import         the op modules the model's patch uses, after torch and torch._dynamo
                 (a Hugging Face modeling module imports both, so the custom ops are lazy)
  <op> first     the op's first forward+backward
  <op> again     the same call once more (the warm host cost)
and inside the first calls, summed over all ops:
  manifest       reading and checking the artifact set's manifest (once)
  find_variant   the registry's lookups, manifest included, launchers excluded
  launchers      building the launchers (driver.Launcher)
  variants       how many variants the first calls looked up

liger_aot is byte-compiled first, as a pip install leaves it (end_to_end.py does the same).
Prints a table and writes first_call_cost.csv and first_call_cost.json under --out.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# how a model's gated activation (its config's) maps to liger-aot's fused MLP op
GATED_OPS = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu"}
OPS = ("rms_norm", "rope", "mlp", "linear_ce")
TOKENS = 16  # rows a call: the variants depend on the row length, not on the row count
LINEAR_CE_HIDDEN = 64


def launch_shape(model: str) -> dict:
    """The launch shapes of end_to_end.py's `model` (its MODELS entry), as its patched step
    calls the ops: sizes and softcap from the model's config, the RMSNorm offset and casting
    from liger-aot's patch table for its model type. Computed in the parent: the patch
    table's import would fall inside the child's timed import."""
    import end_to_end
    from liger_aot.transformers.monkey_patch import _RMS_STYLE, MODEL_PATCHES

    spec = end_to_end.MODELS[model]
    c = spec["config"]
    offset, casting = _RMS_STYLE[MODEL_PATCHES[spec["model_type"]].rms_norm_style]
    activation = c.get("hidden_act") or c.get("hidden_activation")
    return dict(hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
                vocab=c["vocab_size"], act=GATED_OPS[activation], offset=offset,
                casting=casting, softcap=c.get("final_logit_softcapping"))


def child(shape: dict) -> dict:
    t_start = time.perf_counter()
    import torch
    import torch._dynamo  # noqa: F401  (what a patched HF model has imported)

    # torch's own first-use costs, which an eager step pays as well
    w = torch.randn(8, 8, dtype=torch.bfloat16, requires_grad=True)
    (w @ w).float().sum().backward()
    result = {"torch": (time.perf_counter() - t_start) * 1e3}

    t = time.perf_counter()
    from liger_aot.ops import fused_linear_cross_entropy as flce_mod
    from liger_aot.ops import geglu as geglu_mod
    from liger_aot.ops import rms_norm as rms_mod
    from liger_aot.ops import rope as rope_mod
    from liger_aot.ops import swiglu as swiglu_mod
    result["import"] = (time.perf_counter() - t) * 1e3

    import host_microbench  # beside this script, which Python puts first on sys.path

    counters = install_counting_stubs(host_microbench)
    dt = torch.bfloat16
    rows, h, inter = TOKENS, shape["hidden"], shape["intermediate"]
    x = torch.randn(rows, h, dtype=dt, requires_grad=True)
    weight = torch.ones(h, dtype=dt, requires_grad=True)

    def rms_norm():
        y = rms_mod.rms_norm(x, weight, 1e-6, shape["offset"], shape["casting"])
        y.backward(torch.ones_like(y))

    q = torch.randn(1, rows, shape["heads"], shape["head_dim"], dtype=dt).transpose(1, 2)
    k = torch.randn(1, rows, shape["kv_heads"], shape["head_dim"], dtype=dt).transpose(1, 2)
    q.requires_grad_()
    k.requires_grad_()
    cos = torch.randn(1, rows, shape["head_dim"], dtype=dt)
    sin = torch.randn(1, rows, shape["head_dim"], dtype=dt)

    def rope():
        qo, ko = rope_mod.liger_rotary_pos_emb(q, k, cos, sin)
        torch.autograd.backward((qo, ko), (torch.ones_like(qo), torch.ones_like(ko)))

    a = torch.randn(rows, inter, dtype=dt, requires_grad=True)
    b = torch.randn(rows, inter, dtype=dt, requires_grad=True)
    act = swiglu_mod.swiglu if shape["act"] == "swiglu" else geglu_mod.geglu

    def mlp():
        act(a, b).backward(torch.ones(rows, inter, dtype=dt))

    hidden = torch.randn(rows, LINEAR_CE_HIDDEN, dtype=dt, requires_grad=True)
    lm_head = torch.randn(shape["vocab"], LINEAR_CE_HIDDEN, dtype=dt, requires_grad=True)
    target = torch.randint(0, shape["vocab"], (rows,))

    def linear_ce():
        flce_mod.fused_linear_cross_entropy(hidden, lm_head, target,
                                            softcap=shape["softcap"]).backward()

    for name, fn in zip(OPS, (rms_norm, rope, mlp, linear_ce)):
        for when in ("first", "again"):
            t = time.perf_counter()
            fn()
            result[f"{name} {when}"] = (time.perf_counter() - t) * 1e3
    result.update(counters)
    return result


def install_counting_stubs(host_microbench) -> dict:
    """host_microbench's stand-in driver, with the registry's real lookups kept: the device
    arch and multiprocessor count are faked, each binary is copied into a buffer instead of
    being loaded. Returns the counters the patched registry fills in."""
    import ctypes

    import torch

    import liger_aot.runtime.driver as driver
    import liger_aot.runtime.registry as registry

    real_find, real_load_set, real_launcher = (registry.find_variant, registry.load_set,
                                               driver.Launcher)
    host_microbench.install_stubs()
    counters = {"manifest": 0.0, "find_variant": 0.0, "launchers": 0.0, "variants": 0}

    class Properties:
        multi_processor_count = 132
        name = "stand-in H200"
        major, minor = 9, 0

    class Module:  # LoadedModule without the driver: the image is copied as it would be
        def __init__(self, image, device_index):
            self.device_index = device_index
            self._image = ctypes.create_string_buffer(image, len(image))
            self.handle = 0

        def function(self, name, shared):
            return 0x1000

    def timed(fn, counter):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                counters[counter] += (time.perf_counter() - t) * 1e3
        return wrapper

    def find_variant(variant, device_index):
        counters["variants"] += 1
        t = time.perf_counter()
        launchers_before = counters["launchers"]
        try:
            return real_find(variant, device_index)
        finally:
            spent = (time.perf_counter() - t) * 1e3
            counters["find_variant"] += spent - (counters["launchers"] - launchers_before)

    torch.cuda.get_device_properties = lambda *args, **kwargs: Properties()
    registry.device_arch = lambda index: ("sm90", Properties.name)
    registry.find_variant = find_variant
    registry.load_set = timed(real_load_set, "manifest")
    driver.LoadedModule = Module
    driver.Launcher = timed(real_launcher, "launchers")
    return counters


def run_children(args) -> list:
    env = dict(os.environ, LIGER_AOT_ARTIFACT_DIR=os.path.abspath(args.artifacts),
               LIGER_AOT_STRICT="1", PYTHONPATH=os.pathsep.join(
                   p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.pop("TRITON_INTERPRET", None)
    shape = json.dumps(launch_shape(args.model))
    runs = []
    for i in range(args.repeats):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", shape],
                              env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"child {i + 1} failed (rc {proc.returncode}):\n{proc.stderr}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[-1].items()),
              flush=True)
    return runs


def main(argv=None):
    import end_to_end  # the models; its module level imports the standard library alone

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", help="artifact root holding sm90/manifest.json")
    parser.add_argument("--model", default="qwen2_5_0_5b", choices=sorted(end_to_end.MODELS))
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes (default 5)")
    parser.add_argument("--out", default="first_call_cost_out")
    parser.add_argument("--child", metavar="SHAPE_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if not args.artifacts:
        parser.error("--artifacts is required (a `liger-aot build --arch sm90 --out DIR` root)")
    manifest = os.path.join(args.artifacts, "sm90", "manifest.json")
    if not os.path.isfile(manifest):
        parser.error(f"--artifacts: {manifest} does not exist; build it with "
                     f"`liger-aot build --arch sm90 --out {args.artifacts}`")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    # the same byte-compilation as end_to_end.py's children get
    print("byte-compiled:", end_to_end.byte_compile_libraries(["liger-aot"]), flush=True)
    runs = run_children(args)
    keys = list(runs[0])
    medians = {k: statistics.median(r[k] for r in runs) for k in keys}
    print(f"\n{args.model}, {args.repeats} fresh processes, medians (ms; variants: a count)")
    for k in keys:
        print(f"  {k:18s} {medians[k]:9.2f}")
    firsts = sum(medians[f"{op} first"] - medians[f"{op} again"] for op in OPS)
    print(f"  {'first-call extra':18s} {firsts:9.2f}   (sum over ops of first - again)")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "first_call_cost.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run"] + keys)
        for i, r in enumerate(runs, 1):
            writer.writerow([i] + [f"{r[k]:.3f}" for k in keys])
        writer.writerow(["median"] + [f"{medians[k]:.3f}" for k in keys])
    with open(os.path.join(args.out, "first_call_cost.json"), "w") as f:
        json.dump({"model": args.model, "runs": runs, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()
