"""Shared by the GPU sweep scripts (suite.py has its own, device-agnostic copy bandwidth;
it takes capture_graph from here)."""
import csv
import os

import torch

# the CUDA-graph timing the suite (--graphs) and `liger-aot tune --graphs-top` share
from liger_aot.build_tools.tune import capture_graph, graph_ms  # noqa: F401


def extra_constexprs(fields, item):
    """A config's trailing NAME=INT fields: more constexprs of the kernel (trials)."""
    extra = {}
    for field in fields:
        name, eq, value = field.partition("=")
        if not eq or not value.lstrip("-").isdigit():
            raise SystemExit(f"config {item!r}: {field!r} is not NAME=INT")
        extra[name] = int(value)
    return extra


# constexprs every config names, left out of the printed NAME=INT tail
_NAMED = ("BLOCK_N", "SLOTS", "PROGRAMS_PER_SM", "HAS_RESIDUAL", "HAS_DRES", "W_SHARED")


def extra_tag(constexprs) -> str:
    """The ",NAME=INT..." tail of a config's printed tag: what extra_constexprs added."""
    return "".join(f",{n}={v}" for n, v in constexprs.items() if n not in _NAMED)


def copy_bandwidth() -> float:
    """Device-to-device copy of 2 GiB on the current GPU: bytes read + written per second."""
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / (do_bench(lambda: y.copy_(x), return_mode="median") * 1e-3)


def parse_row_warps(text: str, min_n: int, max_n: int = 1 << 30) -> list:
    """--cases 'N:warps,warps;N:warps' -> [(N, warps)]: N a power of two from min_n to max_n,
    warps a power of two up to 32 with 8-64 columns a thread (one row a program). SystemExit
    naming the bad item otherwise."""
    out = []
    for item in text.split(";"):
        try:
            n, warps = item.split(":")
            pairs = [(int(n), int(w)) for w in warps.split(",")]
        except ValueError:
            raise SystemExit(f"--cases: '{item}' is not N:warps[,warps...]") from None
        for n, w in pairs:
            if (not min_n <= n <= max_n or n & (n - 1) or not 1 <= w <= 32 or w & (w - 1)
                    or not 8 <= n // (32 * w) <= 64):
                upto = f" to {max_n}" if max_n < 1 << 30 else ""
                raise SystemExit(f"--cases: '{item}': N must be a power of two from {min_n}"
                                 f"{upto}, warps a power of two up to 32, 8-64 columns a "
                                 "thread")
        out += pairs
    return out


def start_timing(op: str) -> float:
    """The copy bandwidth for a GPU experiment's rates, printed with the card's name, after
    the checks its timings need: SystemExit without a CUDA device (the experiments'
    --compile-only runs on a CPU), and the JIT fallback's warning silenced (they time JIT
    kernels on purpose)."""
    import warnings

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this experiment times GPU kernels "
                         "(--compile-only runs on a CPU)")
    warnings.filterwarnings("ignore", message=".*compiling it with Triton JIT.*")
    bw = copy_bandwidth()
    print(f"{op}: copy {bw / 1e12:.2f} TB/s, {torch.cuda.get_device_name(0)}", flush=True)
    return bw


def checked_timing(fn, err, time_fn, before=None, limit=2e-2) -> tuple:
    """(error, ms, status) of one experiment run: before() (a check that may raise), then
    fn's result checked (err(*fn()) under `limit`), then time_fn(fn); NaNs and the
    exception's text where a step fails, so that the other runs go on."""
    try:
        if before is not None:
            before()
        e = err(*fn())
        torch.cuda.synchronize()
        if not e < limit:
            raise RuntimeError(f"wrong result: rel. error {e:.2e}")
        return e, time_fn(fn), "ok"
    except Exception as ex:  # noqa: BLE001 - keep the other runs' numbers
        return float("nan"), float("nan"), f"{type(ex).__name__}: {ex}"[:150]


def row_length_sweep(smoke: bool, ns: str):
    """(device, [(rows, n_cols), ...], copy TB/s) of an experiment over row lengths `ns`
    (comma-separated) at 2^26 elements each; --smoke: CPU, one 7 x 200 shape, no copy
    bandwidth (nan)."""
    if smoke:
        return "cpu", [(7, 200)], float("nan")
    return "cuda", [(2**26 // n, n) for n in map(int, ns.split(","))], copy_bandwidth() / 1e12


def _rel(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def cross_entropy_case(n_rows: int, vocab: int, device: str = "cuda"):
    """bf16 logits (n_rows, vocab), int64 targets and error(loss, grad=None): the largest
    relative error of per-row losses and, when given, of the "mean" gradient on the first,
    middle and last rows, against torch in fp32."""
    logits = torch.randn(n_rows, vocab, device=device, dtype=torch.bfloat16) * 3
    target = torch.randint(0, vocab, (n_rows,), device=device)
    ref_loss = torch.logsumexp(logits.float(), -1) - \
        logits.float().gather(1, target[:, None])[:, 0]
    rows = torch.tensor([0, n_rows // 2, n_rows - 1], device=device)
    ref_grad = (torch.softmax(logits[rows].float(), -1)
                - torch.nn.functional.one_hot(target[rows], vocab)) / n_rows

    def error(loss, grad=None) -> float:
        err = ((loss - ref_loss).abs().max() / ref_loss.abs().max()).item()
        return err if grad is None else max(err, _rel(grad[rows], ref_grad))
    return logits, target, error


def cross_entropy_buffers(n_rows: int, vocab: int, device: str = "cuda"):
    """cross_entropy_case's (logits, target, error), then what the experiments' kernels take:
    SCALES for reduction "mean" ([1/n, 1/n, 0], fp32), an fp32 loss row, a gradient buffer
    and a working copy of the logits (for in-place runs)."""
    logits, target, error = cross_entropy_case(n_rows, vocab, device)
    scales = torch.tensor([1.0 / n_rows, 1.0 / n_rows, 0.0], device=device)
    loss = torch.empty(n_rows, device=device)
    return logits, target, error, scales, loss, torch.empty_like(logits), logits.clone()


def rms_norm_backward_case(n_rows: int, n_cols: int, device: str = "cuda"):
    """bf16 x, dy, w, fp32 rstd (eps 1e-6) and error(dx, dw): the larger relative error of
    the two gradients against torch autograd in fp32."""
    x = torch.randn(n_rows, n_cols, device=device, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    w = torch.randn(n_cols, device=device, dtype=torch.bfloat16)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    xf = x.float().requires_grad_()
    wf = w.float().requires_grad_()
    out = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * wf
    ref_dx, ref_dw = torch.autograd.grad(out, (xf, wf), dy.float())

    def error(dx, dw) -> float:
        return max(_rel(dx, ref_dx), _rel(dw, ref_dw))
    return x, dy, w, rstd, error


def layer_norm_forward_case(n_rows: int, n_cols: int, eps: float, device: str = "cuda"):
    """bf16 x (mean about 3), w, b (seed 0) and error(y): y's relative error against
    F.layer_norm in fp32."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n_rows, n_cols, device=device, dtype=torch.bfloat16, generator=gen) + 3.0
    w = (1 + 0.1 * torch.randn(n_cols, device=device, generator=gen)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n_cols, device=device, generator=gen)).to(torch.bfloat16)
    ref = torch.nn.functional.layer_norm(x.float(), (n_cols,), w.float(), b.float(), eps)

    def error(y) -> float:
        return _rel(y, ref)
    return x, w, b, error


def library_ms(spec_name: str, n: int, bucket: str):
    """A norm spec's kernel at the tuner's unflagged shape of row length n, timed as
    `liger-aot tune` times it (JIT of the shipped kernel; the sm90 table's config for
    `bucket`, else the rule's): (ms or None, config tag, why it failed or None)."""
    from build_tools import tune
    from kernel_src.tuning import tuned_configs

    case = tune.CASES[spec_name]
    shape = next(s for s in case.shapes if s[1] == n and not tune._flag(s))
    config = tuned_configs(case.spec, "sm90").get(bucket) or case.spec.rule(n, False)
    (config, ms, why), = tune.measure(case, shape, [config], "cuda", tune.do_bench_median,
                                      torch.bfloat16)
    return ms, config.tag, why


def write_rows(out_dir: str, name: str, rows: list) -> str:
    """rows (dicts with the first one's keys) as the CSV file `name` in out_dir (created if
    need be); returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
