"""Experiment (issue 5, cross-entropy): a persistent, split-row layout for loss + gradient.

  python benchmarks/ce_split_experiment.py [--out DIR]

Idea under test: pass 2 (the gradient) re-reads the row; with one warp per row thousands of
rows are in flight and the re-read misses L2 (measured: 3 full passes). Here a program owns
one row at a time (persistent grid, CTAS_PER_SM programs per multiprocessor, so ~132 rows of
256 KB = 33 MB in flight: within the 50 MB L2), and its warps each keep their own online
softmax state over a [TILE_ROWS, 256] tile (reductions along the 256 axis stay inside a
warp: no barrier per step); one cross-warp combine per row. The same run times the
library's kernel with software pipelining (num_stages 2 and 3).

Outcome on the H200 (docs/results/2026-11-30-ce-split-experiment-*-h200.txt): slower. The best
split layout took 2.04 ms for loss + gradient at 8192 x 128256 against 1.62 ms for the
library's four-warps-a-row kernel: too few bytes in flight per multiprocessor once only about
one row per SM runs; num_stages changed nothing. Kept as the record of what was tried.
"""
import argparse
import csv
import os

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def ce_split(LOSS, GRAD, LOGITS, TARGET, n_rows, n_cols, stride, scale,
             TILE_ROWS: tl.constexpr, WITH_GRAD: tl.constexpr, HINTS: tl.constexpr):
    LANE: tl.constexpr = 256
    CH: tl.constexpr = TILE_ROWS * LANE
    offs = tl.arange(0, TILE_ROWS)[:, None] * LANE + tl.arange(0, LANE)[None, :]
    for row in range(tl.program_id(0).to(tl.int64), n_rows, tl.num_programs(0)):
        x_row = LOGITS + row * stride
        g_row = GRAD + row * stride
        target = tl.load(TARGET + row)
        m = tl.full([TILE_ROWS], float("-inf"), tl.float32)
        d = tl.zeros([TILE_ROWS, LANE], dtype=tl.float32)
        for start in range(0, n_cols, CH):
            c = start + offs
            mask = c < n_cols
            if HINTS:
                x = tl.load(x_row + c, mask=mask, other=float("-inf"),
                            eviction_policy="evict_last").to(tl.float32)
            else:
                x = tl.load(x_row + c, mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            d = d * tl.exp(m - safe)[:, None] + tl.exp(x - safe[:, None])
            m = m_new
        big = tl.max(m, axis=0)
        total = tl.sum(tl.sum(d, axis=1) * tl.exp(tl.where(m == float("-inf"), big, m) - big)
                       * (m != float("-inf")), axis=0)
        lse = big + tl.log(total)
        x_t = tl.load(x_row + target).to(tl.float32)
        tl.store(LOSS + row, lse - x_t)
        if WITH_GRAD:
            for start in range(0, n_cols, CH):
                c = start + offs
                mask = c < n_cols
                if HINTS:
                    x = tl.load(x_row + c, mask=mask, other=0.0,
                                eviction_policy="evict_first").to(tl.float32)
                else:
                    x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                g = scale * (tl.exp(x - lse) - tl.where(c == target, 1.0, 0.0))
                if HINTS:
                    tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask,
                             eviction_policy="evict_first")
                else:
                    tl.store(g_row + c, g.to(GRAD.dtype.element_ty), mask=mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    from liger_aot.kernel_src import triton_function
    from liger_aot.kernel_src.cross_entropy import spec

    prod = triton_function(spec.FWD)
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    copy_bw = 2 * x.numel() / (do_bench(lambda: x.clone(), return_mode="median") * 1e-3)
    del x
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    # (kernel, tile rows or BLOCK_V, warps, programs per SM (0: one per row), stages)
    candidates = [("split", 64, 16, 1, 2), ("split", 64, 16, 1, 3), ("split", 64, 16, 2, 2),
                  ("split", 32, 8, 2, 2), ("split", 32, 8, 2, 3), ("split", 16, 4, 4, 2),
                  ("split", 16, 4, 4, 3), ("split", 128, 16, 1, 2), ("split", 32, 8, 1, 3),
                  ("row", 512, 1, 0, 1), ("row", 512, 1, 0, 2), ("row", 512, 1, 0, 3),
                  ("row", 2048, 4, 0, 2), ("row", 2048, 4, 0, 3), ("row", 4096, 8, 0, 3)]
    for n_rows, V in ((8192, 128256), (8192, 32000)):
        logits = torch.randn(n_rows, V, device="cuda", dtype=torch.bfloat16) * 3
        target = torch.randint(0, V, (n_rows,), device="cuda")
        grad = torch.empty_like(logits)
        loss = torch.empty(n_rows, device="cuda")
        scales = torch.tensor([1 / n_rows, 1 / n_rows, 0.0], device="cuda")
        ref = torch.logsumexp(logits.float(), -1) - logits.float().gather(1, target[:, None])[:, 0]
        chk = torch.tensor([0, n_rows - 1], device="cuda")
        ref_g = (torch.softmax(logits[chk].float(), -1)
                 - torch.nn.functional.one_hot(target[chk], V)) / n_rows
        for kernel, size, warps, per_sm, stages in candidates:
            for with_grad in (1, 0):
                if kernel == "split":
                    grid = (min(n_rows, sms * per_sm),)

                    def run():
                        ce_split[grid](loss, grad, logits, target, n_rows, V, V, 1.0 / n_rows,
                                       TILE_ROWS=size, WITH_GRAD=with_grad, HINTS=1,
                                       num_warps=warps, num_stages=stages)
                else:
                    flags = (spec.FLAG_GRAD if with_grad else 0) | spec.FLAG_MEAN

                    def run():
                        prod[(n_rows,)](loss, loss, loss, grad, logits, target, loss, scales,
                                        loss, V, V, V, -100, 0.0, 0.0, 1.0, flags,
                                        FEATURES=0, BLOCK_V=size, RESIDENT=0,
                                        num_warps=warps, num_stages=stages)
                try:
                    run()
                    err = ((loss - ref).abs().max() / ref.abs().max()).item()
                    if with_grad:
                        err = max(err, ((grad[chk].float() - ref_g).norm()
                                        / ref_g.norm()).item())
                    if not err < 2e-2:
                        raise AssertionError(f"rel err {err:.1e}")
                    ms = do_bench(run, return_mode="median")
                    note = ""
                except Exception as e:
                    ms, note = float("nan"), f"{type(e).__name__}: {str(e)[:80]}"
                nbytes = n_rows * V * 2 * (2 if with_grad else 1)
                rate = nbytes / (ms * 1e-3) / copy_bw
                kind = "loss+grad" if with_grad else "loss"
                print(f"{kernel} {n_rows}x{V} {kind:<9} {size:<4} w{warps:<2} {per_sm}/SM "
                      f"s{stages} {ms:7.3f} ms {rate:5.0%} {note}", flush=True)
                rows.append((kernel, n_rows, V, kind, size, warps, per_sm, stages, ms, rate,
                             note))
        del logits, grad
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "ce_split_experiment.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "rows", "vocab", "kind", "tile_rows_or_block", "warps",
                    "per_sm", "stages", "ms", "of_copy", "note"])
        w.writerows(rows)


if __name__ == "__main__":
    main()
