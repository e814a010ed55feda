"""Cross-entropy and fused linear cross-entropy sweep on a GPU (issue 5's two open kernels).

  python benchmarks/sweep_cross_entropy.py [--out DIR] [--quick]

1. cross_entropy_fwd configs (BLOCK_V, RESIDENT, num_warps) through Triton JIT of the same
   source, loss + gradient (reduction "mean") and loss only, at several (rows, vocab) shapes
   (bf16). Each candidate is checked against torch (loss and a few gradient rows) before it
   is timed. Rate: bytes (read logits, write gradient) over time against the measured copy.
2. The backward's scale kernel: grad_output 1 in place (skipped on the device) and 2.0.
3. The op: forward with gradient, forward+backward, and a profiler table of one
   forward+backward step (which kernels run, how long each).
4. Fused linear cross entropy 8192 x 4096 -> 128256: forward+backward and peak memory beyond
   the inputs per chunk size, and the three matmuls of one chunk alone.
Writes sweep_cross_entropy.csv to --out.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu import copy_bandwidth, cross_entropy_case  # noqa: E402
DEV, BF16 = "cuda", torch.bfloat16

CANDIDATES = (  # (BLOCK_V, RESIDENT, num_warps)
    (512, 0, 1), (1024, 0, 2), (2048, 0, 4), (4096, 0, 8), (8192, 0, 16),
    (2048, 16384, 4), (2048, 16384, 8), (4096, 16384, 8), (2048, 32768, 8),
    (4096, 32768, 16), (8192, 32768, 16), (4096, 65536, 32), (8192, 65536, 32),
)
SHAPES = ((8192, 128256), (8192, 256000), (8192, 32000), (2048, 128256), (1024, 128256))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--quick", action="store_true", help="first two shapes only")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: "
                        "configs,scale,op,flce")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.testing import do_bench

    from liger_aot.kernel_src import triton_function
    from liger_aot.kernel_src.cross_entropy import spec

    copy_bw = copy_bandwidth()
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    rows = []
    fwd = triton_function(spec.FWD)

    if "configs" not in skip:
        for n_rows, V in SHAPES[:2] if args.quick else SHAPES:
            logits, target, error = cross_entropy_case(n_rows, V)
            grad = torch.empty_like(logits)
            loss = torch.empty(n_rows, device=DEV)
            scales = torch.tensor([1 / n_rows, 1 / n_rows, 0.0], device=DEV)
            chosen = spec.select_config(n_rows, V, torch.cuda.get_device_properties(0)
                                        .multi_processor_count, grad=True)
            for block, resident, warps in CANDIDATES:
                for with_grad in (True, False):
                    flags = (spec.FLAG_GRAD if with_grad else 0) | spec.FLAG_MEAN

                    def run():
                        fwd[(n_rows,)](loss, loss, loss, grad, logits, target, loss, scales,
                                       loss, V, V, V, -100, 0.0, 0.0, 1.0, flags,
                                       FEATURES=0, BLOCK_V=block, RESIDENT=resident,
                                       num_warps=warps)
                    try:
                        grad.zero_()
                        run()
                        err = error(loss, grad if with_grad else None)
                        if not err < 2e-2:
                            raise AssertionError(f"rel err {err:.1e}")
                        ms = do_bench(run, return_mode="median")
                        note = ""
                    except Exception as e:  # a candidate that does not compile or is wrong
                        ms, note = float("nan"), f"{type(e).__name__}: {str(e)[:60]}"
                    nbytes = n_rows * V * 2 * (2 if with_grad else 1)
                    is_chosen = (chosen.constexprs == {"BLOCK_V": block, "RESIDENT": resident}
                                 and chosen.num_warps == warps and with_grad)
                    kind = "loss+grad" if with_grad else "loss"
                    rows.append(("ce_fwd", f"{n_rows}x{V}", kind, block, resident, warps, ms,
                                 nbytes / (ms * 1e-3) / copy_bw,
                                 "chosen" if is_chosen else note))
                    print(f"ce {n_rows}x{V} {kind:<9} BLOCK_V={block:<5} RESIDENT={resident:<5}"
                          f" w{warps:<2} {ms:7.3f} ms {rows[-1][7]:5.0%} {rows[-1][8]}",
                          flush=True)
            del logits, grad
            torch.cuda.empty_cache()

    if "scale" not in skip:
        from liger_aot.ops.cross_entropy import scale_grad
        g = torch.randn(8192, 128256, device=DEV, dtype=BF16)
        for value in (1.0, 2.0):
            go = torch.tensor(value, device=DEV)
            ms = do_bench(lambda: scale_grad(g, go, False, True), return_mode="median")
            print(f"scale_grad in place, grad_output {value}: {ms:.3f} ms")
            rows.append(("ce_scale", "8192x128256", f"go={value}", "", "", "", ms,
                         (2 * g.numel() * 2 / (ms * 1e-3) / copy_bw) if value != 1 else "", ""))
        del g
        torch.cuda.empty_cache()

    if "op" not in skip:
        from liger_aot.ops.cross_entropy import cross_entropy
        for n_rows, V in ((8192, 128256), (8192, 256000)):
            logits = torch.randn(n_rows, V, device=DEV, dtype=BF16)
            target = torch.randint(0, V, (n_rows,), device=DEV)
            leaf = logits.clone().requires_grad_()
            t_fwd = do_bench(lambda: cross_entropy(leaf, target), return_mode="median")

            def fwd_bwd():
                leaf.grad = None
                cross_entropy(leaf, target).backward()

            t_all = do_bench(fwd_bwd, return_mode="median")
            print(f"op {n_rows}x{V}: forward with grad {t_fwd:.3f} ms, "
                  f"forward+backward {t_all:.3f} ms")
            rows.append(("ce_op", f"{n_rows}x{V}", "fwd with grad", "", "", "", t_fwd, "", ""))
            rows.append(("ce_op", f"{n_rows}x{V}", "fwd+bwd", "", "", "", t_all,
                         2 * logits.numel() * 2 / (t_all * 1e-3) / copy_bw, ""))
            if V == 128256:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(3):
                        fwd_bwd()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
            del logits, leaf
            torch.cuda.empty_cache()

    if "flce" not in skip:
        from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
        T, H, V = 8192, 4096, 128256
        x = torch.randn(T, H, device=DEV, dtype=BF16).requires_grad_()
        w = (torch.randn(V, H, device=DEV, dtype=BF16) * 0.02).requires_grad_()
        target = torch.randint(0, V, (T,), device=DEV)
        for chunk in (1024, 2048, 4096):
            def step():
                x.grad = w.grad = None
                fused_linear_cross_entropy(x, w, target, chunk_size=chunk).backward()

            step()
            x.grad = w.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            # beyond inputs: minus the two gradients the step leaves behind
            peak = (torch.cuda.max_memory_allocated() - base
                    - (x.numel() + w.numel()) * 2) / 2**30
            ms = do_bench(step, return_mode="median")
            tflops = 6 * T * H * V / (ms * 1e-3) / 1e12
            print(f"flce chunk {chunk}: {ms:.2f} ms, {tflops:.0f} TFLOP/s, "
                  f"peak beyond inputs and grads {peak:.2f} GiB", flush=True)
            rows.append(("flce", f"{T}x{H}x{V}", f"chunk {chunk}", "", "", "", ms, tflops,
                         f"peak+{peak:.2f}GiB"))
        for chunk in (1024, 2048, 4096):
            xc, g = x[:chunk].detach(), torch.randn(chunk, V, device=DEV, dtype=BF16)
            dw = torch.zeros(V, H, device=DEV, dtype=BF16)
            dw32 = torch.zeros(V, H, device=DEV, dtype=torch.float32)
            wd = w.detach()
            for name, fn in (("logits mm", lambda: torch.mm(xc, wd.t())),
                             ("dx mm", lambda: torch.mm(g, wd)),
                             ("dw addmm bf16", lambda: dw.addmm_(g.t(), xc)),
                             ("dw addmm fp32 out", lambda: torch.addmm(
                                 dw32, g.t(), xc, out_dtype=torch.float32, out=dw32))):
                try:
                    ms = do_bench(fn, return_mode="median")
                    tf = 2 * chunk * H * V / (ms * 1e-3) / 1e12
                except Exception as e:
                    ms, tf = float("nan"), float("nan")
                    print(f"  {name}: {type(e).__name__}: {e}")
                print(f"  chunk {chunk} {name:<18} {ms:.3f} ms {tf:.0f} TFLOP/s")
                rows.append(("flce_mm", f"chunk {chunk}", name, "", "", "", ms, tf, ""))
            del g, dw, dw32
            torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_cross_entropy.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "shape", "kind", "block_v", "resident", "warps", "ms",
                    "of_copy_or_tflops", "note"])
        w.writerows(rows)


if __name__ == "__main__":
    main()
