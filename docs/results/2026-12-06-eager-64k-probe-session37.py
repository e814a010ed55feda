"""Session 37: why the suite's eager RMSNorm forward at 64K reads ~0.12 ms on both cards."""
import sys, os, torch
sys.path.insert(0, os.getcwd())
from triton.testing import do_bench
from liger_aot.build_tools.tune import graph_ms
from liger_aot.ops import rms_norm as R, layer_norm as L
torch.manual_seed(0)
for n in (65536, 32768):
    m = (1 << 26) // n
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cases = {
        "rms llama": lambda: R.rms_norm(x, w, 1e-6, in_place=False),
        "rms none": lambda: R.rms_norm(x, w, 1e-6, casting_mode="none", in_place=False),
        "rms _forward llama": lambda: R._forward(x.detach(), w.detach(), 1e-6, 0.0, 1),
        "rms _forward none": lambda: R._forward(x.detach(), w.detach(), 1e-6, 0.0, 0),
        "layer_norm": lambda: L.layer_norm(x, w, b, 1e-6),
        "fused add llama": lambda: R.fused_add_rms_norm(x, r, w, 1e-6, in_place=False),
    }
    for name, fn in cases.items():
        with torch.no_grad():
            fn(); torch.cuda.synchronize()
            e = do_bench(fn, warmup=25, rep=200, return_mode="median")
            g = graph_ms(fn)
        print(f"{m}x{n} {name:20s} eager {e:.4f} ms  graph {g:.4f} ms", flush=True)
    # a profile of the slow one: kernels and their gaps
    cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")
    from torch.profiler import profile, ProfilerActivity
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            cache.zero_()
            R.rms_norm(x, w, 1e-6, in_place=False)
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    evs.sort(key=lambda e: e.time_range.start)
    t0 = evs[0].time_range.start
    for e in evs:
        print(f"   {e.time_range.start - t0:9.1f} us +{e.time_range.elapsed_us():7.1f} us  {e.name[:90]}")
    cpu = [e for e in prof.events() if e.device_type.name == "CPU" and ("rms" in e.name.lower() or "RMSNorm" in e.name or "cuda" in e.name.lower() or "Launch" in e.name)]
    for e in sorted(cpu, key=lambda e: e.time_range.start)[:40]:
        print(f"   cpu {e.time_range.start - t0:9.1f} us +{e.time_range.elapsed_us():7.1f} us  {e.name[:90]}")
