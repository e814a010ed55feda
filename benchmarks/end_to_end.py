"""End to end: cold start and steady-state training, Hugging Face eager against liger-aot and
Liger-Kernel, every run in a fresh process.

  python benchmarks/end_to_end.py [--models llama3_8b,qwen2_5_0_5b,gemma2_2b]
      [--modes hf,liger-aot,liger-kernel] [--steps 10] [--out DIR]
  python benchmarks/end_to_end.py --device cpu --tiny --modes hf,liger-aot   (plumbing smoke)
  python benchmarks/end_to_end.py --report DIR                  (re-print DIR/end_to_end.json)

Models (random init from configs built here, no downloads; bf16; AdamW; no gradient
checkpointing; use_cache off):
  llama3_8b     Llama-3-8B shapes, 4 layers: hidden 4096, intermediate 14336, 32 heads, 8 kv
                heads, vocab 128256, rope_theta 5e5, rms eps 1e-5; sdpa attention; 4 x 2048
  qwen2_5_0_5b  Qwen2.5-0.5B shapes: hidden 896, intermediate 4864, 14 heads, 2 kv heads,
                vocab 151936, 24 layers, tied embeddings, rope_theta 1e6; sdpa; 8 x 2048
  gemma2_2b     Gemma-2-2B shapes: hidden 2304, intermediate 9216, 8 heads, 4 kv heads, head_dim
                256, vocab 256000, 26 layers, softcapping final 30 / attention 50,
                query_pre_attn_scalar 256, sliding window 4096; eager attention; 4 x 2048

Modes, each one child process per model (the script re-invokes itself with --child):
  hf                 Hugging Face eager
  liger-aot          liger_aot.transformers.apply_liger_kernel_to_<type>() before the build;
                     the child runs with LIGER_AOT_STRICT=1 (a missing variant fails, no JIT
                     can hide) and reports whether triton was imported
  liger-kernel       liger_kernel.transformers.apply_liger_kernel_to_<type>(), with an empty
                     TRITON_CACHE_DIR: a real cold start (JIT compiles in the first step)
  liger-kernel-warm  Liger-Kernel again, reusing the cache the liger-kernel child filled
Modes always run in that order per model (hf first: it is the reference). Every child gets
its own empty TRITON_CACHE_DIR (except the warm one); the number of files it leaves there is
reported (jit files): anything but 0 for hf / liger-aot means something JIT-compiled.

What a child measures (time.perf_counter; on Linux CLOCK_MONOTONIC, shared by processes, so
the parent's spawn time gives the interpreter start-up too):
  startup      spawn -> first line of this script (interpreter start, site imports)
  torch        import torch
  cuda         CUDA context (torch.cuda.init, one allocation, synchronize)
  hf import    import transformers and the model's modeling module, build the config
  lib+patch    import the kernel library and patch (0 for hf)
  build        seeded random init directly on the device in bf16
  optim        AdamW (torch's default implementation) and the fixed batches on the device
  first step   forward with labels -> loss, backward, optimizer.step, zero_grad, synchronize
  to 1st done  spawn -> end of the first step
  step split   host seconds of the first and second steps by phase: forward to the loss,
               backward, optimizer step + zero_grad, then the wait for the GPU (no
               synchronization is added inside a step: a phase's host time, not its GPU time)
then --warmup more steps, then --steps timed steps: tok/s = batch * seq * steps / time;
peak = torch.cuda.max_memory_allocated over the whole run (GiB); the loss of every step.
Data: the same seeded batches in every mode (counting sequences from random starts, a
learnable task, so the loss falls and a wrong gradient shows; --data random for uniform
tokens).

Output: a cold-start table, a steady-state table and the issue's goals per model (liger-aot:
lib+patch+first step <= 1.1 x HF's first step; tok/s >= Liger-Kernel's; peak <= Liger-Kernel's;
losses within --loss-rtol of HF over the first --loss-steps steps, else MISMATCH, reported,
never asserted). end_to_end.json, end_to_end.csv and logs/<model>_<mode>.log go to --out,
rewritten after every child so a run cut short keeps what finished. A child that fails
(OOM, liger_kernel not installed, strict-mode refusal, timeout) is reported with the tail
of its stderr; the others still run. Exit status 1 when any child failed.

Time: each child's wall time is estimated before it runs (from BASELINES.md's H200 figures)
and measured; the default run (9 children) is estimated at ~4 minutes on an H200. --budget-s
(default 540) stops starting children once the run has used it (those are reported as
skipped), and each child is killed after --timeout seconds. --steps 0 measures the cold start
only. A throwaway child first imports torch, transformers and triton and runs a CUDA matmul
and attention, so every measured child finds the same warm OS file cache (--no-prewarm skips).
Before that the parent byte-compiles liger_aot (and liger_kernel, when importable), as pip
does when it installs a wheel: run from a source tree, or installed with --no-compile, each
child would otherwise compile the library's modules in its first step (40-60 ms for
liger-aot's op modules on the H200 host) while torch and transformers load their .pyc files.

Cold start is noisy (HF's Llama first step took 1.98, 0.57 and 0.75 s in three fresh
processes of one run):
--cold-repeats N runs hf and liger-aot N-1 more times per model, cold start only (--steps
0), interleaved; the cold goal then compares medians, and a table shows every run.
--profile-first-step writes a cProfile of each main child's first step to
profiles/<model>_<mode>.txt (the cold-only repeats stay unprofiled).

Liger-aot on the GPU needs its artifacts (LIGER_AOT_ARTIFACT_DIR or an installed arch wheel).
On --device cpu children set TRITON_INTERPRET=1 (liger-aot's kernels run in Triton's
interpreter); --tiny shrinks every model (2 layers, hidden 64, vocab 512, 2 x 64 tokens).
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()  # first thing: the child's clock starts here

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_MARKER = "@@END_TO_END_RESULT@@ "
MODES = ("hf", "liger-aot", "liger-kernel", "liger-kernel-warm")
GIB = float(2 ** 30)

# -- models ------------------------------------------------------------------------------------

MODELS = {
    "llama3_8b": dict(
        label="Llama-3-8B shapes, 4 layers", model_type="llama", batch=4, seq=2048,
        attn="sdpa",
        config=dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                    num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
                    hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False,
                    bos_token_id=128000, eos_token_id=128001)),
    "qwen2_5_0_5b": dict(
        label="Qwen2.5-0.5B shapes", model_type="qwen2", batch=8, seq=2048, attn="sdpa",
        config=dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
                    rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                    bos_token_id=151643, eos_token_id=151643)),
    "gemma2_2b": dict(
        label="Gemma-2-2B shapes", model_type="gemma2", batch=4, seq=2048, attn="eager",
        config=dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                    num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                    head_dim=256, hidden_activation="gelu_pytorch_tanh",
                    max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                    final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                    query_pre_attn_scalar=256, sliding_window=4096, tie_word_embeddings=True,
                    pad_token_id=0, eos_token_id=1, bos_token_id=2)),
}
# --tiny: same families and features, sizes the CPU interpreter handles in seconds.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            bos_token_id=1, eos_token_id=2)
TINY_PER_MODEL = {"llama3_8b": {}, "qwen2_5_0_5b": {},
                  "gemma2_2b": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=32)}
TINY_SHAPE = (2, 64)  # batch, seq
TINY_STEPS, TINY_WARMUP = 2, 1

# H200 figures from ../shared/BASELINES.md (HF, Liger tok/s; first step HF, Liger cold), used
# only to estimate wall times. Build seconds: a guess for seeded init on the GPU.
ESTIMATES = {
    "llama3_8b": dict(tok_s_hf=49671, tok_s_liger=52372, first_hf=2.7, first_lk_cold=4.0,
                      build=5.0),
    "qwen2_5_0_5b": dict(tok_s_hf=84077, tok_s_liger=101578, first_hf=1.5, first_lk_cold=5.4,
                         build=3.0),
    "gemma2_2b": dict(tok_s_hf=16024, tok_s_liger=18118, first_hf=1.0, first_lk_cold=5.3,
                      build=6.0),
}
STARTUP_ESTIMATE_S = 12.0  # interpreter + torch + CUDA context + transformers + teardown
PREWARM_ESTIMATE_S = 15.0
CPU_TINY_ESTIMATE_S = {"hf": 15.0, "liger-aot": 40.0}


def config_kwargs(name: str, tiny: bool = False, overrides: dict | None = None) -> dict:
    """The keyword arguments of a model's config (rope_theta as a plain key: build_config maps
    it onto the installed transformers' spelling). overrides win over everything."""
    spec = MODELS[name]
    kwargs = dict(spec["config"])
    if tiny:
        kwargs.update(TINY)
        kwargs.update(TINY_PER_MODEL[name])
    kwargs["use_cache"] = False
    kwargs.update(overrides or {})
    return kwargs


def build_config(name: str, tiny: bool = False, overrides: dict | None = None):
    """A transformers config object for `name` (MODELS), attention implementation set."""
    import inspect

    from transformers import AutoConfig, CONFIG_MAPPING

    spec = MODELS[name]
    kwargs = config_kwargs(name, tiny, overrides)
    config_cls = CONFIG_MAPPING[spec["model_type"]]
    params = inspect.signature(config_cls.__init__).parameters
    theta = kwargs.pop("rope_theta", None)
    if theta is not None:
        if "rope_parameters" in params and "rope_parameters" not in kwargs:  # transformers 5
            kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": float(theta)}
        elif "rope_parameters" not in kwargs:
            kwargs["rope_theta"] = theta
    config = AutoConfig.for_model(spec["model_type"], **kwargs)
    config._attn_implementation = spec["attn"]
    return config


def shape(name: str, tiny: bool, batch: int | None = None, seq: int | None = None) -> tuple:
    b, s = TINY_SHAPE if tiny else (MODELS[name]["batch"], MODELS[name]["seq"])
    return batch or b, seq or s


# -- child -------------------------------------------------------------------------------------

def _sync(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_batches(count: int, batch: int, seq: int, vocab: int, seed: int, kind: str):
    """`count` batches of token ids (count x batch x seq), identical for every mode."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    if kind == "random":
        return torch.randint(0, vocab, (count, batch, seq), generator=g)
    starts = torch.randint(0, vocab, (count, batch, 1), generator=g)
    return (starts + torch.arange(seq)) % vocab


def apply_patch(mode: str, model_type: str) -> str | None:
    """Import the mode's kernel library and patch the model family; its version."""
    if mode == "hf":
        return None
    if mode == "liger-aot":
        import liger_aot
        import liger_aot.transformers as lib
    else:
        import liger_kernel.transformers as lib

        liger_aot = None
    getattr(lib, f"apply_liger_kernel_to_{model_type}")()
    if liger_aot is not None:
        return liger_aot.__version__
    from importlib import metadata

    try:
        return metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        return "unknown"


class TritonImportWatch:
    """A meta-path finder that notes who first imports triton (torch's has_triton_package
    probe, pulled in by transformers' import of torch._dynamo, imports it in every mode when
    triton is installed) and, with block=True, refuses the import as an image without triton
    would (torch's probe then answers "absent")."""

    def __init__(self, block: bool = False):
        self.block = block
        self.importer = None
        self.blocked = []

    def find_spec(self, name, path=None, target=None):
        if name != "triton" and not name.startswith("triton."):
            return None
        if self.importer is None:
            import traceback

            frames = [f for f in traceback.extract_stack()[:-1]
                      if "importlib" not in f.filename and f.filename != __file__
                      and "/triton/" not in f.filename]
            if frames:
                f = frames[-1]
                where = "/".join(f.filename.replace(os.sep, "/").split("/")[-3:])
                self.importer = f"{where}:{f.lineno} ({f.name})"
            else:
                self.importer = "?"
        if self.block:
            self.blocked.append(name)
            raise ImportError(f"{name}: blocked by end_to_end.py --block-triton")
        return None


def child_main(spec: dict) -> int:
    """One measured run: print one RESULT_MARKER line of JSON; 0 when it finished."""
    watch = TritonImportWatch(block=bool(spec.get("block_triton")))
    sys.meta_path.insert(0, watch)
    marks = [("t0", _T0)]
    spawn = spec.get("spawn_time")
    startup = _T0 - spawn if spawn is not None and 0.0 <= _T0 - spawn < 300.0 else None
    result = dict(model=spec["model"], mode=spec["mode"], device=spec["device"],
                  tiny=spec["tiny"], status="failed", phases={}, startup_s=startup)
    triton_after = [None]

    def mark(name):
        marks.append((name, time.perf_counter()))
        result["phases"][name] = marks[-1][1] - marks[-2][1]
        if triton_after[0] is None and "triton" in sys.modules:
            triton_after[0] = name

    try:
        _child_run(spec, result, mark)
        result["status"] = "ok"
    except BaseException as e:  # report what was measured so far, then the error
        import traceback

        traceback.print_exc()
        oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e)
        result["status"] = "oom" if oom else "failed"
        result["error"] = f"{type(e).__name__}: {e}"[:2000]
    ends = dict(marks)
    if "first_step" in ends:
        result["first_step_s"] = result["phases"]["first_step"]
        result["to_first_step_done_s"] = ends["first_step"] - _T0 + (startup or 0.0)
    result["triton_imported"] = "triton" in sys.modules
    result["triton_imported_after"] = triton_after[0]
    result["triton_importer"] = watch.importer
    result["triton_blocked"] = sorted(set(watch.blocked)) if watch.block else None
    # liger-aot's @triton.jit sources: loaded only by its JIT fallback or the interpreter
    result["liger_aot_jit_modules"] = sorted(
        m for m in sys.modules if m.startswith("liger_aot.kernel_src.") and m.endswith(".kernels"))
    print(RESULT_MARKER + json.dumps(result), flush=True)
    return 0 if result["status"] == "ok" else 1


def _child_run(spec: dict, result: dict, mark):
    import torch

    mark("import_torch")
    device = spec["device"]
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        torch.cuda.init()
        torch.empty(1, device=device)
        torch.cuda.synchronize()
        result["gpu"] = torch.cuda.get_device_name()
    mark("cuda_init")

    import importlib

    import transformers
    from transformers import AutoModelForCausalLM

    name, mode = spec["model"], spec["mode"]
    model_type = MODELS[name]["model_type"]
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    config = build_config(name, spec["tiny"], spec.get("overrides"))
    mark("import_transformers")

    result["lib_version"] = apply_patch(mode, model_type)
    mark("lib_patch")

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    torch.manual_seed(spec["seed"])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 attn_implementation=MODELS[name]["attn"])
    model.train()
    _sync(device)
    mark("build_model")

    batch, seq = spec["batch"], spec["seq"]
    steps, warmup = spec["steps"], spec["warmup"]
    optim = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
    data = make_batches(1 + warmup + steps, batch, seq, config.vocab_size, spec["seed"],
                        spec["data"]).to(device)
    _sync(device)
    mark("optimizer_data")

    losses = []

    def train_step(ids, split=None):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if split is not None:  # host time per phase; no added synchronization
            split.update(forward=t1 - t0, backward=t2 - t1, optimizer=time.perf_counter() - t2)

    def timed_step(ids):
        split = {}
        train_step(ids, split)
        t = time.perf_counter()
        _sync(device)
        split["gpu_wait"] = time.perf_counter() - t
        return split

    if spec.get("profile_first_step"):
        result["step_split"] = {"first": _profiled(timed_step, data[0],
                                                   spec["profile_first_step"])}
    else:
        result["step_split"] = {"first": timed_step(data[0])}
    mark("first_step")

    for i in range(warmup):
        if i == 0:
            result["step_split"]["second"] = timed_step(data[1])
        else:
            train_step(data[1 + i])
    _sync(device)
    start = time.perf_counter()
    for i in range(steps):
        train_step(data[1 + warmup + i])
    _sync(device)
    elapsed = time.perf_counter() - start
    mark("steady")
    result.update(
        steady_s=elapsed if steps else None,
        tok_s=batch * seq * steps / elapsed if steps and elapsed > 0 else None,
        losses=[float(x) for x in torch.stack(losses).float().cpu()],
        params=sum(p.numel() for p in model.parameters()),
        liger_modules=sum(type(m).__name__.startswith("Liger") for m in model.modules()),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                      python=sys.version.split()[0]),
        batch=batch, seq=seq, steps=steps, warmup=warmup, dtype=spec["dtype"])
    if device.startswith("cuda"):
        result["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    if mode == "liger-aot":
        try:
            from liger_aot.runtime import registry

            result["artifact_sets"] = [
                dict(arch=s.arch, source=s.source, directory=s.directory, error=s.error)
                for sets in registry._sets.values() for s in sets]
        except Exception as e:  # informational only
            result["artifact_sets"] = f"unavailable: {e}"


def _profiled(fn, arg, path: str):
    """fn(arg) under cProfile; the statistics (top 60 by cumulative time, top 40 by own time)
    written to path."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        return fn(arg)
    finally:
        prof.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text).strip_dirs()
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(40)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text.getvalue())


def prewarm_main(spec: dict) -> int:
    """Untimed: read the libraries every child uses into the OS file cache."""
    import importlib
    import importlib.util

    import torch

    device = spec["device"]
    x = torch.randn(256, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    (x @ x).sum().backward()
    q = torch.randn(1, 2, 128, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    _sync(device)
    import transformers  # noqa: F401

    for name in spec["models"]:
        mt = MODELS[name]["model_type"]
        importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    if importlib.util.find_spec("triton") is not None and not device.startswith("cpu"):
        import triton  # noqa: F401
    print("prewarm done", flush=True)
    return 0


# -- parent ------------------------------------------------------------------------------------

def _csv_list(value: str) -> list:
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_override(item: str) -> tuple:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set wants key=value, got {item!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, from: {', '.join(MODELS)} (default: all)")
    p.add_argument("--modes", default="hf,liger-aot,liger-kernel",
                   help=f"comma-separated, from: {', '.join(MODES)} (default: "
                        "hf,liger-aot,liger-kernel); run in that canonical order")
    p.add_argument("--steps", type=int, default=None,
                   help=f"timed steady-state steps (default 10; {TINY_STEPS} with --tiny); 0: "
                        "cold start only")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed steps after the first (default 2; {TINY_WARMUP} with --tiny)")
    p.add_argument("--batch", type=int, default=None, help="override every model's batch")
    p.add_argument("--seq", type=int, default=None, help="override every model's length")
    p.add_argument("--set", dest="overrides", action="append", type=_parse_override,
                   default=[], metavar="KEY=VALUE",
                   help="config override for every model, JSON value (repeatable), e.g. "
                        "--set num_hidden_layers=2")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny configs (plumbing checks)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (1e-4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="counting", choices=("counting", "random"),
                   help="counting sequences from random starts (learnable) or uniform tokens")
    p.add_argument("--loss-steps", type=int, default=5,
                   help="losses shown and compared with HF (first N steps; default 5)")
    p.add_argument("--loss-rtol", type=float, default=1e-2,
                   help="relative loss difference from HF flagged MISMATCH (default 1e-2)")
    p.add_argument("--timeout", type=float, default=240.0,
                   help="seconds before a child is killed (default 240)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="start no child once the run has used this many seconds (default 540)")
    p.add_argument("--block-triton", action="store_true",
                   help="liger-aot children refuse every import of triton, as in an image "
                        "without it (torch's availability probe then answers 'absent'; that "
                        "also skips triton's import time, which the other modes pay)")
    p.add_argument("--cold-repeats", type=int, default=1, metavar="N",
                   help="fresh processes per model for hf and liger-aot's cold start (default "
                        "1; the extra N-1 run cold only, interleaved; the goal uses medians)")
    p.add_argument("--no-prewarm", action="store_true", help="skip the file-cache prewarm")
    p.add_argument("--no-bytecode", action="store_true",
                   help="do not byte-compile the kernel libraries before the children")
    p.add_argument("--keep-caches", action="store_true",
                   help="keep the per-child TRITON_CACHE_DIRs (printed)")
    p.add_argument("--profile-first-step", action="store_true",
                   help="cProfile each main child's first step into profiles/<model>_<mode>"
                        ".txt under --out (by cumulative and own time); the profiler slows "
                        "that step, so compare profiles, not those runs' times")
    p.add_argument("--out", default=os.environ.get("OUT", "."),
                   help="output directory (default $OUT or .)")
    p.add_argument("--report", metavar="PATH", default=None,
                   help="only print the tables of an earlier end_to_end.json (or its directory)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--prewarm-child", default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child or args.prewarm_child or args.report:
        return args
    args.models = _csv_list(args.models)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    modes = _csv_list(args.modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        parser.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    args.modes = [m for m in MODES if m in modes]
    if args.device.startswith("cpu"):
        bad = [m for m in args.modes if m.startswith("liger-kernel")]
        if bad:
            parser.error(f"{', '.join(bad)} need a GPU (Liger-Kernel has no CPU path)")
    if args.steps is None:
        args.steps = TINY_STEPS if args.tiny else 10
    if args.warmup is None:
        args.warmup = TINY_WARMUP if args.tiny else 2
    if args.steps < 0 or args.warmup < 0:
        parser.error("--steps and --warmup must be >= 0")
    if args.cold_repeats < 1:
        parser.error("--cold-repeats must be >= 1")
    args.overrides = dict(args.overrides)
    return args


def plan(args) -> list:
    return [(model, mode) for model in args.models for mode in args.modes]


COLD_REPEAT_MODES = ("hf", "liger-aot")  # the two the cold-start goal compares


def repeat_plan(args) -> list:
    """The extra cold-only children of --cold-repeats: (model, mode, repeat), interleaved."""
    modes = [m for m in COLD_REPEAT_MODES if m in args.modes]
    return [(model, mode, i) for model in args.models for i in range(1, args.cold_repeats)
            for mode in modes]


def estimate_s(model: str, mode: str, args, cold_only: bool = False) -> float:
    """Rough wall time of one child on an H200 (or a CPU with --tiny)."""
    if args.device.startswith("cpu"):
        per = CPU_TINY_ESTIMATE_S.get(mode, 30.0) if args.tiny else 600.0
        return per
    e = ESTIMATES[model]
    batch, seq = shape(model, args.tiny, args.batch, args.seq)
    tok_s = e["tok_s_hf"] if mode == "hf" else e["tok_s_liger"]
    first = {"hf": e["first_hf"], "liger-aot": e["first_hf"],
             "liger-kernel": e["first_lk_cold"],
             "liger-kernel-warm": e["first_hf"] + 0.5}[mode]
    lib = {"hf": 0.0, "liger-aot": 0.3}.get(mode, 3.0)  # liger-kernel imports triton
    layers = args.overrides.get("num_hidden_layers")
    scale = 1.0
    if layers:
        scale = layers / MODELS[model]["config"]["num_hidden_layers"]
    steps = 0.0 if cold_only else (args.warmup + args.steps) * batch * seq / tok_s * scale
    return STARTUP_ESTIMATE_S + lib + e["build"] * scale + first + steps


def child_env(mode: str, device: str, cache_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRITON_CACHE_DIR"] = cache_dir
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    if device.startswith("cpu"):
        env["TRITON_INTERPRET"] = "1"
    if mode == "liger-aot":
        env["LIGER_AOT_STRICT"] = "1"
    else:
        env.pop("LIGER_AOT_STRICT", None)
    return env


def child_spec(model: str, mode: str, args, cold_only: bool = False) -> dict:
    batch, seq = shape(model, args.tiny, args.batch, args.seq)
    profile = None
    if getattr(args, "profile_first_step", False) and not cold_only:
        profile = os.path.join(os.path.abspath(args.out), "profiles", f"{model}_{mode}.txt")
    return dict(model=model, mode=mode, device=args.device, tiny=args.tiny, dtype=args.dtype,
                batch=batch, seq=seq, steps=0 if cold_only else args.steps,
                warmup=0 if cold_only else args.warmup, lr=args.lr,
                seed=args.seed, data=args.data, overrides=args.overrides,
                block_triton=bool(args.block_triton and mode == "liger-aot"),
                profile_first_step=profile)


LIBRARY_PACKAGES = {"liger-aot": "liger_aot", "liger-kernel": "liger_kernel"}
# liger_aot's source folders under ROOT (kernel_src and build_tools are symlinked into it)
LIGER_AOT_SOURCE_DIRS = ("liger_aot", "kernel_src")


def byte_compile_libraries(modes: list) -> dict:
    """Byte-compile the packages the children's modes import, as pip does at install (see
    the module docstring): {package: what happened}. The children find liger_aot on
    PYTHONPATH=ROOT; its kernel_src and build_tools are symlinks, which compileall does not
    follow, so they are compiled from where they are (the .pyc lands in the same folder)."""
    import compileall
    import importlib.util

    done = {}
    for mode, package in LIBRARY_PACKAGES.items():
        if not any(m.startswith(mode) for m in modes) or package in done:
            continue
        if package == "liger_aot":
            dirs = [os.path.join(ROOT, d) for d in LIGER_AOT_SOURCE_DIRS]
        else:
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                done[package] = "not found"
                continue
            dirs = list(spec.submodule_search_locations)
        try:
            ok = all(compileall.compile_dir(d, quiet=2) for d in dirs if os.path.isdir(d))
        except OSError as e:
            ok, why = False, str(e)
        else:
            why = "some files could not be written (read-only?)"
        done[package] = "compiled" if ok else f"not compiled: {why}"
    return done


def cold_entry(r: dict) -> dict:
    """One cold-start run of a (model, mode): what --cold-repeats keeps of it."""
    return dict(status=r.get("status"), first_step_s=r.get("first_step_s"),
                lib_patch_s=r.get("phases", {}).get("lib_patch"), wall_s=r.get("wall_s"),
                jit_files=r.get("jit_files"), error=r.get("error"),
                stderr_tail=r.get("stderr_tail"))


def count_files(directory: str) -> int:
    return sum(len(files) for _, _, files in os.walk(directory)) if os.path.isdir(directory) \
        else 0


def parse_child_output(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                return json.loads(line[len(RESULT_MARKER):])
            except ValueError:
                return None
    return None


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def run_child(spec: dict, env: dict, timeout: float, log_path: str | None,
              flag: str = "--child") -> tuple:
    """(parsed result or None, returncode or None on timeout, stdout, stderr, wall seconds)."""
    spec = dict(spec)
    cmd = [sys.executable, os.path.abspath(__file__), flag, ""]
    start = time.perf_counter()
    spec["spawn_time"] = start
    cmd[-1] = json.dumps(spec)
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(timeout, 1.0))
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, _text(e.stdout), _text(e.stderr)
    wall = time.perf_counter() - start
    if log_path:
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "w") as f:
            f.write(f"$ {' '.join(cmd[:3])} '<spec>'\n# spec {cmd[-1]}\n"
                    f"# rc {rc} wall {wall:.1f}s\n")
            f.write("## stdout\n" + out + "\n## stderr\n" + err)
    return parse_child_output(out), rc, out, err, wall


def _tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def finish_result(model: str, mode: str, parsed: dict | None, rc, stderr: str, wall: float,
                  est: float, jit_files: int | None) -> dict:
    res = dict(parsed or dict(model=model, mode=mode, phases={}))
    res.update(model=model, mode=mode, wall_s=wall, est_s=est, returncode=rc,
               jit_files=jit_files)
    if rc is None:
        res["status"] = "timeout"
        res.setdefault("error", f"killed after {wall:.0f} s")
    elif parsed is None:
        res["status"] = "failed"
        res.setdefault("error", f"exit status {rc}, no result line")
    elif rc != 0 and res.get("status") == "ok":
        res["status"] = "failed"
    if res["status"] != "ok":
        res["stderr_tail"] = _tail(stderr)
    return res


# -- derived figures, tables, files --------------------------------------------------------------

def _ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def summarize(results: list, loss_steps: int = 5, loss_rtol: float = 1e-2) -> list:
    """Add ratios against hf / liger-kernel of the same model and the loss comparison."""
    by = {(r["model"], r["mode"]): r for r in results if r.get("status") == "ok"}
    for r in results:
        if r.get("status") != "ok":
            continue
        hf, lk = by.get((r["model"], "hf")), by.get((r["model"], "liger-kernel"))
        phases = r.get("phases", {})
        r["cold_s"] = phases.get("lib_patch", 0.0) + (r.get("first_step_s") or 0.0)
        if hf:
            r["first_x_hf"] = _ratio(r.get("first_step_s"), hf.get("first_step_s"))
            r["cold_x_hf_first"] = _ratio(r["cold_s"], hf.get("first_step_s"))
            r["to_first_x_hf"] = _ratio(r.get("to_first_step_done_s"),
                                        hf.get("to_first_step_done_s"))
            r["tok_s_x_hf"] = _ratio(r.get("tok_s"), hf.get("tok_s"))
            r["peak_x_hf"] = _ratio(r.get("peak_gib"), hf.get("peak_gib"))
            a, b = r.get("losses") or [], hf.get("losses") or []
            n = min(len(a), len(b), loss_steps)
            if n and r is not hf:
                diffs = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n])]
                finite = all(math.isfinite(x) for x in a[:n])
                r["loss_max_rel_diff"] = max(diffs) if finite else float("inf")
                r["loss_check"] = "MISMATCH" if not finite or max(diffs) > loss_rtol else "ok"
        if lk:
            r["tok_s_x_lk"] = _ratio(r.get("tok_s"), lk.get("tok_s"))
            r["peak_x_lk"] = _ratio(r.get("peak_gib"), lk.get("peak_gib"))
    for r in results:  # --cold-repeats: medians over the fresh processes of a (model, mode)
        runs = [c for c in r.get("cold_runs", []) if c.get("status") == "ok"]
        if len(runs) > 1:
            r["first_median_s"] = statistics.median(c["first_step_s"] for c in runs)
            r["cold_median_s"] = statistics.median(
                (c.get("lib_patch_s") or 0.0) + c["first_step_s"] for c in runs)
            r["cold_runs_ok"] = len(runs)
    for r in results:
        hf = by.get((r["model"], "hf"))
        if r.get("cold_median_s") is not None and hf and hf.get("first_median_s"):
            r["cold_x_hf_first_median"] = _ratio(r["cold_median_s"], hf["first_median_s"])
    return results


def goals(results: list) -> list:
    """(model, goal, value, verdict) for liger-aot against the issue's targets."""
    by = {(r["model"], r["mode"]): r for r in results}
    rows = []
    for model in dict.fromkeys(r["model"] for r in results):
        aot = by.get((model, "liger-aot"))
        if aot is None:
            continue
        if aot.get("status") != "ok":
            rows.append((model, "liger-aot ran", aot.get("status"), "FAIL"))
            continue

        def verdict(value, ok):
            return "n/a" if value is None else ("PASS" if ok(value) else "FAIL")

        v = aot.get("cold_x_hf_first_median")
        if v is not None:
            goal = (f"lib+patch+first step <= 1.1 x HF first step (medians of "
                    f"{aot['cold_runs_ok']} runs)")
        else:
            v, goal = aot.get("cold_x_hf_first"), "lib+patch+first step <= 1.1 x HF first step"
        rows.append((model, goal, _fmt(v, "x"), verdict(v, lambda x: x <= 1.1)))
        v = aot.get("tok_s_x_lk")
        rows.append((model, "tok/s >= Liger-Kernel", _fmt(v, "x"), verdict(v, lambda x: x >= 1.0)))
        v = aot.get("peak_x_lk")
        rows.append((model, "peak <= Liger-Kernel", _fmt(v, "x"), verdict(v, lambda x: x <= 1.0)))
        v = aot.get("loss_max_rel_diff")
        rows.append((model, "losses match HF", _fmt(v, "e"),
                     "n/a" if v is None else ("PASS" if aot.get("loss_check") == "ok" else "FAIL")))
        clean = (not aot.get("jit_files") and not aot.get("liger_aot_jit_modules")
                 and "liger_aot" not in (aot.get("triton_importer") or ""))
        rows.append((model, "no JIT: 0 cache files, 0 @jit sources, not imported by us",
                     f"files={aot.get('jit_files')} jit sources="
                     f"{len(aot.get('liger_aot_jit_modules') or [])} triton: {triton_cell(aot)}",
                     "PASS" if clean else
                     ("n/a (cpu)" if aot.get("device", "").startswith("cpu") else "FAIL")))
    return rows


def triton_cell(r: dict) -> str:
    """Who imported triton, in a few characters (the full frame is in the JSON / CSV)."""
    if r.get("triton_blocked"):
        return "blocked"
    if not r.get("triton_imported"):
        return "no" if "triton_imported" in r else "-"
    who = r.get("triton_importer") or "?"
    if "liger_aot" in who:
        return "by liger_aot"
    if "torch/utils/_triton.py" in who:
        return "torch probe"
    if "liger_kernel" in who:
        return "by liger_kernel"
    return who.split("/")[-1]


def _fmt(value, kind="f", digits=2):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "e":
        return f"{value:.1e}"
    if kind == "int":
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def format_table(headers: list, rows: list) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


PHASES = ("import_torch", "cuda_init", "import_transformers", "lib_patch", "build_model",
          "optimizer_data", "first_step")


def cold_table(results: list) -> str:
    headers = ["model", "mode", "status", "startup", "torch", "cuda", "hf import", "lib+patch",
               "build", "optim", "first step", "x hf", "lib+patch+1st", "x hf 1st",
               "to 1st done", "triton", "jit files", "wall (est)"]
    rows = []
    for r in results:
        p = r.get("phases", {})
        rows.append([r["model"], r["mode"], r.get("status", "?"), _fmt(r.get("startup_s")),
                     *(_fmt(p.get(k)) for k in PHASES[:-1]), _fmt(r.get("first_step_s")),
                     _fmt(r.get("first_x_hf"), "x"), _fmt(r.get("cold_s")),
                     _fmt(r.get("cold_x_hf_first"), "x"), _fmt(r.get("to_first_step_done_s")),
                     triton_cell(r),
                     _fmt(r.get("jit_files"), "int"),
                     f"{_fmt(r.get('wall_s'), digits=0)} ({_fmt(r.get('est_s'), digits=0)})"])
    return format_table(headers, rows)


def cold_repeats_table(results: list) -> str:
    """--cold-repeats: every fresh process's cold start, and the medians the goal uses."""
    headers = ["model", "mode", "runs ok", "first step median", "min", "max",
               "lib+patch+1st median", "x hf 1st (medians)", "each lib+patch+1st"]
    rows = []
    for r in results:
        runs = r.get("cold_runs")
        if not runs:
            continue
        firsts = [c["first_step_s"] for c in runs if c.get("status") == "ok"]
        each = " ".join(_fmt((c.get("lib_patch_s") or 0.0) + c["first_step_s"])
                        if c.get("status") == "ok" else c.get("status", "?") for c in runs)
        rows.append([r["model"], r["mode"], f"{len(firsts)}/{len(runs)}",
                     _fmt(r.get("first_median_s")), _fmt(min(firsts) if firsts else None),
                     _fmt(max(firsts) if firsts else None), _fmt(r.get("cold_median_s")),
                     _fmt(r.get("cold_x_hf_first_median"), "x"), each])
    return format_table(headers, rows) if rows else ""


SPLIT = ("forward", "backward", "optimizer", "gpu_wait")


def split_table(results: list) -> str:
    """Host seconds per phase of the first and second training steps: where a cold step's
    one-time costs (module loads, cuBLAS set-up, allocator growth) sit."""
    headers = ["model", "mode", *(f"1st {k}" for k in SPLIT), *(f"2nd {k}" for k in SPLIT)]
    rows = []
    for r in results:
        split = r.get("step_split") or {}
        first, second = split.get("first") or {}, split.get("second") or {}
        rows.append([r["model"], r["mode"], *(_fmt(first.get(k), digits=3) for k in SPLIT),
                     *(_fmt(second.get(k), digits=3) for k in SPLIT)])
    return format_table(headers, rows)


def steady_table(results: list, loss_steps: int = 5) -> str:
    headers = ["model", "mode", "tok/s", "x hf", "x liger-kernel", "peak GiB", "x hf",
               "x liger-kernel", *(f"loss{i}" for i in range(loss_steps)), "max rel diff",
               "vs hf"]
    rows = []
    for r in results:
        if r.get("status") != "ok":
            rows.append([r["model"], r["mode"], r.get("status", "?")] +
                        ["-"] * (len(headers) - 3))
            continue
        losses = (r.get("losses") or [])[:loss_steps]
        rows.append([r["model"], r["mode"], _fmt(r.get("tok_s"), "int"),
                     _fmt(r.get("tok_s_x_hf"), "x"), _fmt(r.get("tok_s_x_lk"), "x"),
                     _fmt(r.get("peak_gib")), _fmt(r.get("peak_x_hf"), "x"),
                     _fmt(r.get("peak_x_lk"), "x"),
                     *(f"{x:.4f}" for x in losses), *(["-"] * (loss_steps - len(losses))),
                     _fmt(r.get("loss_max_rel_diff"), "e"),
                     r.get("loss_check", "ref" if r["mode"] == "hf" else "-")])
    return format_table(headers, rows)


def failures_text(results: list) -> str:
    parts = []
    for r in results:
        if r.get("status") not in ("ok", None):
            parts.append(f"--- {r['model']} / {r['mode']}: {r.get('status')}: "
                         f"{r.get('error', '')}\n{r.get('stderr_tail', '')}")
        for i, c in enumerate(r.get("cold_runs", [])):
            if c.get("status") != "ok":
                parts.append(f"--- {r['model']} / {r['mode']} cold run {i + 1}: "
                             f"{c.get('status')}: {c.get('error') or ''}\n"
                             f"{c.get('stderr_tail') or ''}")
    return "\n".join(parts)


def report_text(results: list, loss_steps: int = 5, meta: dict | None = None) -> str:
    lines = []
    if meta:
        lines.append("setup: " + ", ".join(f"{k}={v}" for k, v in meta.items()
                                           if k not in ("argv",)))
    ok = next((r for r in results if r.get("versions")), None)
    if ok:
        lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in ok["versions"].items()) +
                     (f"; gpu {ok['gpu']}" if ok.get("gpu") else ""))
    libs = {r["mode"]: r.get("lib_version") for r in results if r.get("lib_version")}
    if libs:
        lines.append("libraries: " + ", ".join(f"{k} {v}" for k, v in libs.items()))
    lines += ["", "Cold start (seconds; fresh process each; 'x hf' = first step / HF's first "
              "step; 'x hf 1st' = (lib+patch+first step) / HF's first step)",
              cold_table(results), ""]
    repeated = cold_repeats_table(results)
    if repeated:
        lines += ["Cold start over fresh processes (--cold-repeats; the main child is the "
                  "first run, the others ran cold only, interleaved hf / liger-aot)",
                  repeated, ""]
    lines += ["First and second step, host seconds per phase (forward to the loss, backward, "
              "optimizer step + zero_grad, then waiting for the GPU; no added synchronization)",
              split_table(results), "",
              "Steady state (tok/s over the timed steps; peak = whole-run "
              "max_memory_allocated)", steady_table(results, loss_steps)]
    g = goals(results)
    if g:
        lines += ["", "Goals (liger-aot)", format_table(["model", "goal", "value", "verdict"], g)]
    fails = failures_text(results)
    if fails:
        lines += ["", "Failed children (stderr tail):", fails]
    return "\n".join(lines)


CSV_FIELDS = ["model", "mode", "status", "device", "batch", "seq", "steps", "startup_s",
              *(f"{p}_s" for p in PHASES[:-1]), "first_step_s", "first_x_hf", "cold_s",
              "cold_x_hf_first", "first_median_s", "cold_median_s", "cold_x_hf_first_median",
              "cold_runs_ok", "to_first_step_done_s", "to_first_x_hf", "tok_s", "tok_s_x_hf",
              "tok_s_x_lk", "peak_gib", "peak_reserved_gib", "peak_x_hf", "peak_x_lk", "losses",
              "loss_max_rel_diff", "loss_check", "triton_imported", "triton_imported_after",
              "triton_importer", "liger_aot_jit_modules",
              "jit_files", "liger_modules", "params", "lib_version", "wall_s", "est_s", "error"]


def csv_row(r: dict) -> dict:
    row = {k: r.get(k) for k in CSV_FIELDS}
    for p in PHASES[:-1]:
        row[f"{p}_s"] = r.get("phases", {}).get(p)
    if r.get("losses") is not None:
        row["losses"] = ";".join(f"{x:.6f}" for x in r["losses"])
    if isinstance(r.get("liger_aot_jit_modules"), list):
        row["liger_aot_jit_modules"] = len(r["liger_aot_jit_modules"])
    return {k: ("" if v is None else v) for k, v in row.items()}


def write_outputs(results: list, out: str, meta: dict):
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, "end_to_end.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1, default=str)
    os.replace(tmp, os.path.join(out, "end_to_end.json"))
    with open(os.path.join(out, "end_to_end.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow(csv_row(r))


def load_report(path: str) -> tuple:
    if os.path.isdir(path):
        path = os.path.join(path, "end_to_end.json")
    with open(path) as f:
        data = json.load(f)
    return data.get("results", []), data.get("meta", {})


def parent_main(args) -> int:
    started = time.perf_counter()
    todo = plan(args)
    meta = dict(models=",".join(args.models), modes=",".join(args.modes), device=args.device,
                tiny=args.tiny, dtype=args.dtype, steps=args.steps, warmup=args.warmup,
                lr=args.lr, data=args.data, seed=args.seed, overrides=args.overrides,
                loss_rtol=args.loss_rtol, argv=sys.argv[1:])
    est = {item: estimate_s(*item, args) for item in todo}
    repeats = repeat_plan(args)
    est_repeat = {(model, mode): estimate_s(model, mode, args, cold_only=True)
                  for model, mode, _ in repeats}
    total = (sum(est.values()) + sum(est_repeat[m, d] for m, d, _ in repeats)
             + (0.0 if args.no_prewarm else PREWARM_ESTIMATE_S))
    print(f"plan: {len(todo) + len(repeats)} children, estimated {total:.0f} s in all "
          f"(budget {args.budget_s:.0f} s, per-child timeout {args.timeout:.0f} s)")
    for (model, mode), s in est.items():
        b, q = shape(model, args.tiny, args.batch, args.seq)
        print(f"  {model:<14} {mode:<18} {b}x{q} tokens  est {s:5.0f} s")
    if repeats:
        print(f"  then {args.cold_repeats - 1} more cold-only run(s) each of "
              f"{', '.join(dict.fromkeys(d for _, d, _ in repeats))} per model")
    if total > args.budget_s:
        print(f"WARNING: the estimate exceeds --budget-s; children past it are skipped "
              f"(shrink with --steps, --models or --modes)")
    sys.stdout.flush()

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="e2e-triton-caches-")
    if not args.no_bytecode:
        meta["bytecode"] = byte_compile_libraries(args.modes)
        print("bytecode: " + ", ".join(f"{k} {v}" for k, v in meta["bytecode"].items()),
              flush=True)
    if not args.no_prewarm:
        env = child_env("hf", args.device, os.path.join(scratch, "prewarm"))
        _, rc, _, err, wall = run_child(dict(device=args.device, models=args.models), env,
                                        min(args.timeout, 180.0), None, "--prewarm-child")
        print(f"prewarm: {wall:.1f} s" + ("" if rc == 0 else f" (failed: {_tail(err, 400)})"),
              flush=True)

    results = []
    lk_cache = {}
    for model, mode in todo:
        remaining = args.budget_s - (time.perf_counter() - started)
        log = os.path.join(out, "logs", f"{model}_{mode}.log")
        if remaining < 15.0:
            results.append(dict(model=model, mode=mode, status="skipped", est_s=est[model, mode],
                                error=f"--budget-s {args.budget_s:.0f} used up", phases={}))
            print(f"{model:<14} {mode:<18} skipped (budget)", flush=True)
            write_outputs(summarize(results, args.loss_steps, args.loss_rtol), out, meta)
            continue
        if mode == "liger-kernel-warm" and model in lk_cache:
            cache = lk_cache[model]
        else:
            cache = os.path.join(scratch, f"{model}_{mode}")
            if mode == "liger-kernel":
                lk_cache[model] = cache
        before = count_files(cache)
        print(f"{model:<14} {mode:<18} running (est {est[model, mode]:.0f} s) ...", end=" ",
              flush=True)
        if mode == "liger-kernel-warm" and model not in lk_cache:
            parsed, rc, err, wall = None, 1, "liger-kernel-warm needs liger-kernel's cache", 0.0
        else:
            parsed, rc, _, err, wall = run_child(child_spec(model, mode, args),
                                                 child_env(mode, args.device, cache),
                                                 min(args.timeout, remaining), log)
        res = finish_result(model, mode, parsed, rc, err, wall, est[model, mode],
                            count_files(cache) - before)
        if args.keep_caches:
            res["triton_cache_dir"] = cache
        results.append(res)
        print(f"{res['status']} in {wall:.1f} s (first step {_fmt(res.get('first_step_s'))} s, "
              f"tok/s {_fmt(res.get('tok_s'), 'int')})", flush=True)
        write_outputs(summarize(results, args.loss_steps, args.loss_rtol), out, meta)
    for model, mode, i in repeats:
        main = next((r for r in results if (r["model"], r["mode"]) == (model, mode)), None)
        if main is None or main.get("status") != "ok":
            continue  # nothing to repeat: the failure is reported already
        remaining = args.budget_s - (time.perf_counter() - started)
        if remaining < 15.0:
            main["cold_runs_skipped"] = main.get("cold_runs_skipped", 0) + 1
            print(f"{model:<14} {mode:<18} cold run {i + 1} skipped (budget)", flush=True)
            continue
        cache = os.path.join(scratch, f"{model}_{mode}_cold{i + 1}")
        print(f"{model:<14} {mode:<18} cold run {i + 1} ...", end=" ", flush=True)
        log = os.path.join(out, "logs", f"{model}_{mode}_cold{i + 1}.log")
        parsed, rc, _, err, wall = run_child(
            child_spec(model, mode, args, cold_only=True), child_env(mode, args.device, cache),
            min(args.timeout, remaining), log)
        res = finish_result(model, mode, parsed, rc, err, wall, est_repeat[model, mode],
                            count_files(cache))
        main.setdefault("cold_runs", [cold_entry(main)]).append(cold_entry(res))
        print(f"{res['status']} in {wall:.1f} s (first step {_fmt(res.get('first_step_s'))} s)",
              flush=True)
        write_outputs(summarize(results, args.loss_steps, args.loss_rtol), out, meta)
    if not args.keep_caches:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"triton caches kept under {scratch}")
    meta["total_wall_s"] = time.perf_counter() - started
    summarize(results, args.loss_steps, args.loss_rtol)
    write_outputs(results, out, meta)
    print()
    print(report_text(results, args.loss_steps, meta))
    print(f"\ntotal {meta['total_wall_s']:.0f} s; wrote {out}/end_to_end.json, end_to_end.csv, "
          f"logs/")
    repeats_ok = all(c.get("status") == "ok" for r in results for c in r.get("cold_runs", []))
    return 0 if repeats_ok and all(r.get("status") == "ok" for r in results) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    if args.prewarm_child:
        return prewarm_main(json.loads(args.prewarm_child))
    if args.report:
        results, meta = load_report(args.report)
        print(report_text(results, args.loss_steps, meta))
        return 0
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
