"""Host (Python) cost of the launch path and of the SwiGLU/GeGLU ops, on a CPU: no GPU needed.

  python benchmarks/host_microbench.py [--repeat R] [--number N] [--cases A,B]
                                      [--timer wall|thread] [--profile CASE]

What is real and what is a stand-in:
  * the driver: liger_aot.runtime.driver._Api is built as it is on a GPU machine, over a
    stand-in libcuda whose entry points are a do-nothing C function (CPython's PyErr_Occurred,
    which returns 0 = CUDA_SUCCESS), so ctypes' argument conversion and call cost are real;
  * driver.Launcher, Kernel.launch, Kernel.select_config, the ops' Python code, torch's
    allocations and autograd are the real ones; the kernels themselves do not run (outputs
    hold whatever torch.empty gave), so op timings are pure host cost;
  * what needs a GPU is faked with a C-level callable of about the same cost: a tensor's
    get_device() (patched on torch.Tensor to return 0 for every tensor, during the run only),
    torch's current device (0) and current raw stream (0), the device arch ("sm90", with the
    shipped tuned table allowed), and the loaded module (a constant function handle).

Cases (us per call, median and min of R repeats of N calls each):
  launcher        the pre-resolved driver launcher, launcher(grid, values, args) (swiglu_fwd)
  launcher_flat   the same through launcher.flat(grid, v0, v1, ...), the entry point
                  Kernel.launch uses (n/a on trees without it)
  kernel_swiglu   swiglu_fwd's whole Kernel.launch (9 params; pointers, alignment, lookup)
  kernel_rms      rms_norm_fwd's whole Kernel call (15 params, one option), as
                  benchmarks/launch_overhead.py times it on the GPU
  select_config   Kernel.select_config(0, 4096), warm
  swiglu_fwd      swiglu(a, b) at 1 x 4096 bf16, no grad
  swiglu_fwdbwd   swiglu(a, b).backward(g) at 1 x 4096 bf16 (a and b require grad)
  geglu_fwdbwd    the same for geglu
  eager_fwdbwd    torch eager (F.silu(a) * b).backward(g) on the CPU: for scale only, it
                  also computes (4096 elements, a few us), the AOT cases compute nothing
  eager_fwdbwd_16 the same at 1 x 16: eager's host cost with next to no compute
  empty_fn_fwdbwd an autograd Function that only saves its inputs and allocates its output
                  and gradients, fwd+bwd at 1 x 4096: the floor of any Python Function
  rope_fwdbwd     liger_rotary_pos_emb(q, k, cos, sin) forward and backward, one position
                  of 32 q and 8 k heads of 128 in Hugging Face's layout (bf16)
  eager_rope_fwdbwd  Hugging Face's formula on the same tensors (computes, as eager_fwdbwd)
All fwd+bwd cases accumulate into a.grad and b.grad (real CPU adds, 4096 elements) or
q.grad and k.grad.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import liger_aot.runtime.device as device_mod  # noqa: E402
import liger_aot.runtime.driver as driver  # noqa: E402
import liger_aot.runtime.registry as registry  # noqa: E402


class _StubLib:
    """Stands in for libcuda: every entry point is a fresh ctypes function pointer to a C
    function that ignores its arguments and returns 0."""

    def __init__(self):
        self._dll = ctypes.PyDLL(None)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        fn = self[name]
        setattr(self, name, fn)
        return fn

    def __getitem__(self, name):
        return self._dll["PyErr_Occurred"]  # indexing gives a new function pointer per call


class _FakeModule:
    device_index = 0

    def function(self, name, shared):
        return 0x1000


def install_stubs():
    real_pydll = ctypes.PyDLL
    ctypes.PyDLL = lambda name, *a, **k: _StubLib() if name == "libcuda.so.1" else real_pydll(
        name, *a, **k)
    try:
        driver._api = driver._Api("cuda")
    finally:
        ctypes.PyDLL = real_pydll
    driver._get_device = int  # int() == 0: the current device
    driver._get_stream = abs  # abs(0) == 0: the default stream
    torch.Tensor.get_device = staticmethod(int)  # t.get_device() -> int() -> 0, all in C
    device_mod.device_arch = lambda index: ("sm90", "fake H200")
    registry.tuned_table_usable = lambda arch: True
    module = _FakeModule()

    def find_variant(variant, device_index):
        spec = variant.spec
        launcher = driver.Launcher(module, spec.function, spec.type_string,
                                   variant.config.num_warps, 32, 0)
        return registry.Found(arch="sm90", launcher=launcher, where="stub")

    registry.find_variant = find_variant


def cases():
    from liger_aot.kernel_src.rms_norm import spec as rms_spec
    from liger_aot.ops import geglu as geglu_mod
    from liger_aot.ops import swiglu as swiglu_mod
    from liger_aot.runtime import Kernel

    dt = torch.bfloat16
    a = torch.randn(1, 4096, dtype=dt, requires_grad=True)
    b = torch.randn(1, 4096, dtype=dt, requires_grad=True)
    g = torch.randn(1, 4096, dtype=dt)
    ad, bd = a.detach(), b.detach()
    c = torch.empty_like(ad)

    fwd = swiglu_mod._fwd
    config = fwd.select_config(0, 4096)
    grid = swiglu_mod.spec.grid(1, 4096, config)
    sw_args = (c, ad, bd, 1, 4096, 4096, 4096, 4096, 0)

    def kernel_swiglu():
        fwd.launch(grid, c, ad, bd, 1, 4096, 4096, 4096, 4096, 0, dtype=dt, config=config)

    kernel_swiglu()
    launcher = next(iter(fwd._launchers.values()))
    values = tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x for x in sw_args)

    def bare():
        launcher(grid, values, sw_args)

    flat = getattr(launcher, "flat", None)  # what Kernel.launch calls (absent before issue 5)
    v0, v1, v2, v3, v4, v5, v6, v7, v8 = values

    def bare_flat():
        flat(grid, v0, v1, v2, v3, v4, v5, v6, v7, v8)

    rms = Kernel(rms_spec.FWD)
    x = torch.randn(1, 4096, dtype=dt)
    w = torch.randn(4096, dtype=dt)
    y = torch.empty_like(x)
    rstd = torch.empty(1, dtype=torch.float32)
    rms_config = rms_spec.select_config(4096)
    options = (("CASTING", 0),)
    rms_args = (y, x, w, rstd, 1, 4096, 4096, 4096, 1e-6, 0.0, y, x, 4096, 4096, 0, 1)

    def kernel_rms():
        rms((1,), *rms_args, dtype=dt, config=rms_config, options=options)

    def select():
        fwd.select_config(0, 4096)

    swiglu, geglu = swiglu_mod.swiglu, geglu_mod.geglu

    def swiglu_fwd():
        swiglu(ad, bd)

    def swiglu_fwdbwd():
        swiglu(a, b).backward(g)

    def geglu_fwdbwd():
        geglu(a, b).backward(g)

    def eager_fwdbwd():
        (F.silu(a) * b).backward(g)

    a16 = torch.randn(1, 16, dtype=dt, requires_grad=True)
    b16 = torch.randn(1, 16, dtype=dt, requires_grad=True)
    g16 = torch.randn(1, 16, dtype=dt)

    def eager_fwdbwd_16():
        (F.silu(a16) * b16).backward(g16)

    def empty_function_fwdbwd():
        _Empty.apply(a, b).backward(g)

    from liger_aot.ops.rope import liger_rotary_pos_emb

    # one decoding-sized position, Llama's heads, in Hugging Face's layout
    q = torch.randn(1, 1, 32, 128, dtype=dt).transpose(1, 2).requires_grad_()
    k = torch.randn(1, 1, 8, 128, dtype=dt).transpose(1, 2).requires_grad_()
    cos, sin = torch.randn(1, 1, 128, dtype=dt), torch.randn(1, 1, 128, dtype=dt)
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def rope_fwdbwd():
        torch.autograd.backward(liger_rotary_pos_emb(q, k, cos, sin), (gq, gk))

    def rotate_half(t):
        return torch.cat((-t[..., 64:], t[..., :64]), -1)

    def eager_rope_fwdbwd():
        c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)
        torch.autograd.backward((q * c + rotate_half(q) * s_, k * c + rotate_half(k) * s_),
                                (gq, gk))

    return {"launcher": bare, "launcher_flat": bare_flat if flat else None,
            "kernel_swiglu": kernel_swiglu, "kernel_rms": kernel_rms,
            "select_config": select, "swiglu_fwd": swiglu_fwd, "swiglu_fwdbwd": swiglu_fwdbwd,
            "geglu_fwdbwd": geglu_fwdbwd, "eager_fwdbwd": eager_fwdbwd,
            "eager_fwdbwd_16": eager_fwdbwd_16, "empty_fn_fwdbwd": empty_function_fwdbwd,
            "rope_fwdbwd": rope_fwdbwd, "eager_rope_fwdbwd": eager_rope_fwdbwd}


class _Empty(torch.autograd.Function):
    """The floor of any Python autograd Function for this op: save the inputs, allocate the
    output and the two gradients, nothing else."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.empty_like(a)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b)


def time_case(fn, repeat: int, number: int, timer=time.perf_counter) -> tuple:
    for _ in range(200):
        fn()
    runs = [t / number * 1e6 for t in timeit.repeat(fn, repeat=repeat, number=number,
                                                     timer=timer)]
    return statistics.median(runs), min(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    parser.add_argument("--cases", default="", help="comma-separated subset")
    parser.add_argument("--profile", default="", help="cProfile this case instead of timing")
    parser.add_argument("--timer", choices=("wall", "thread"), default="wall",
                        help="thread: this thread's CPU time (time.thread_time), which a busy "
                        "machine's other processes disturb less than the wall clock")
    args = parser.parse_args()
    install_stubs()
    table = cases()
    if args.profile:
        import cProfile
        import pstats

        fn = table[args.profile]
        for _ in range(200):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.number):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    names = [n for n in args.cases.split(",") if n] or list(table)
    timer = time.thread_time if args.timer == "thread" else time.perf_counter
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"{args.repeat} x {args.number} calls, {args.timer} time")
    print(f"{'case':<16} {'median us':>10} {'min us':>8}")
    for name in names:
        if table[name] is None:
            print(f"{name:<16} {'n/a':>10} {'n/a':>8}")
            continue
        med, best = time_case(table[name], args.repeat, args.number, timer)
        print(f"{name:<16} {med:>10.2f} {best:>8.2f}")


if __name__ == "__main__":
    main()
