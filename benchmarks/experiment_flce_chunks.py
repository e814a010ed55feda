"""Experiment (written in session 7, to run in the next GPU session): the fused linear
cross-entropy op at several chunk sizes, and the gap between its forward+backward and its
forward with gradients.

Two leads from session 7 (docs/perf-notes.md, "leads for the fused linear cross-entropy"):
1. cuBLAS timed alone at the chunk shapes put four chunks of 2048 rows 0.8 ms under two
   chunks of 4096 (36.4 against 37.2 ms of matmuls at 8192 x 4096 -> 128256). Prediction:
   the op's forward+backward 40.6 -> ~39.8 ms at chunk_size=2048, half the logits buffer.
2. The suite's forward+backward has read 0.7-1.6 ms more than its forward with gradients
   plus its (no-op) backward in every run on record. Both are timed back to back after
   ~40 ms of matmuls each call. This script times them in both orders, round by round, and
   samples the SM clock and power (nvidia-smi, every 50 ms) during each timing.

Per chunk size: the op's loss and gradients are checked against the default policy's, then
"fwd(g)" (the op with gradients: all of its work) and "f+b" (the same and
torch.autograd.grad) are timed with suite.Bench (do_bench median, L2 flushed); the peak
memory of one f+b beyond the inputs is read from the allocator. On CPU (--smoke, tiny shapes,
Triton's interpreter) it only runs the logic, with wall-clock timings.

  python benchmarks/experiment_flce_chunks.py --out DIR
"""
import argparse
import subprocess
import threading

import torch

from _gpu import write_rows
from suite import Bench
from liger_aot.ops.fused_linear_cross_entropy import fused_linear_cross_entropy


class ClockSampler:
    """SM clock (MHz) and power (W) from `nvidia-smi -lms 50` while a block runs; no-op where
    nvidia-smi is missing."""

    def __init__(self):
        self.samples, self.proc, self.reader = [], None, None

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return self
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                clock, power = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((clock, power))

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
            self.reader.join(timeout=5)

    def means(self) -> tuple:
        if not self.samples:
            return float("nan"), float("nan")
        n = len(self.samples)
        return sum(s[0] for s in self.samples) / n, sum(s[1] for s in self.samples) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--tokens", type=int, default=8192, help="rows (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=4096, help="H (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=128256, help="V (default: %(default)s)")
    p.add_argument("--chunks", default="0,1024,2048,4096",
                   help="chunk sizes in rows; 0 is the op's default policy (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds per chunk size; odd rounds time f+b first (default: %(default)s)")
    p.add_argument("--rep-ms", type=float, default=2000.0,
                   help="do_bench's rep per timing (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (logic only)")
    p.add_argument("--out", default=".", help="directory for flce_chunks.csv")
    args = p.parse_args()

    device = "cpu" if args.smoke else "cuda"
    tokens, hidden, vocab = (24, 16, 100) if args.smoke else (args.tokens, args.hidden, args.vocab)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, dtype=dtype, generator=gen) * 0.02
         ).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    bench = Bench(device, warmup_ms=100, rep_ms=args.rep_ms).time

    def op(chunk):
        return fused_linear_cross_entropy(x, w, target, chunk_size=chunk or None)

    ref_loss = op(0)
    ref = torch.autograd.grad(ref_loss, (x, w))
    rows = []
    print(f"{tokens} x {hidden} -> {vocab}, {dtype}; rounds alternate the order of the timings")
    print(f"{'chunk':>6} {'round':>5} {'first':>6} {'fwd(g) ms':>10} {'f+b ms':>8} {'gap ms':>7} "
          f"{'MHz fwd(g)':>10} {'MHz f+b':>8} {'W fwd(g)':>8} {'W f+b':>7} {'peak GiB':>8}")
    for chunk in (int(c) for c in args.chunks.split(",")):
        loss = op(chunk)
        grads = torch.autograd.grad(loss, (x, w))
        torch.testing.assert_close(loss, ref_loss, rtol=1e-3, atol=1e-3)
        for got, want in zip(grads, ref):
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)
        del loss, grads

        def forward(chunk=chunk):
            return op(chunk)

        def step(chunk=chunk):
            return torch.autograd.grad(op(chunk), (x, w))

        peak = float("nan")
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        for r in range(args.rounds):
            timed = {}
            order = ("fwd(g)", "f+b") if r % 2 == 0 else ("f+b", "fwd(g)")
            for name in order:
                with ClockSampler() as clocks:
                    ms = bench(forward if name == "fwd(g)" else step)
                timed[name] = (ms, *clocks.means())
            row = {"chunk": chunk, "round": r, "first": order[0],
                   "fwd_grad_ms": timed["fwd(g)"][0], "fwdbwd_ms": timed["f+b"][0],
                   "fwd_grad_mhz": timed["fwd(g)"][1], "fwdbwd_mhz": timed["f+b"][1],
                   "fwd_grad_w": timed["fwd(g)"][2], "fwdbwd_w": timed["f+b"][2],
                   "peak_gib": peak}
            rows.append(row)
            print(f"{chunk or 'policy':>6} {r:>5} {order[0]:>6} {row['fwd_grad_ms']:10.3f} "
                  f"{row['fwdbwd_ms']:8.3f} {row['fwdbwd_ms'] - row['fwd_grad_ms']:7.3f} "
                  f"{row['fwd_grad_mhz']:10.0f} {row['fwdbwd_mhz']:8.0f} {row['fwd_grad_w']:8.0f} "
                  f"{row['fwdbwd_w']:7.0f} {peak:8.2f}", flush=True)
    print(f"wrote {write_rows(args.out, 'flce_chunks.csv', rows)}")


if __name__ == "__main__":
    main()
