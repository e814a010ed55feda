"""Experiment (session 24): RoPE's launch shape. The suite's RoPE (q 4x32x4096x128, k 8 heads,
bf16, Hugging Face's layout) reads 87.6% of copy forward+backward from CUDA graphs, and
Liger-Kernel's 89.6%, the one standard shape where a Liger kernel is ahead on GPU time.

The library kernel (kernel_src/rope/kernels.py) walks a position's q heads, then its k
heads, BLOCK_H heads a step (8 at head_dim 128): each step's loads wait for the previous
step's stores, so a program keeps 2 KB in flight of the 10 KB a position moves. Liger's
kernel loads all of a position's q and k heads at once. Candidates here, each timed alone
forward and backward (CUDA-graph replay through the suite's do_bench timer) and checked
against fp32 first:

  lib:H,D,W       the library's looped kernel `rope`, BLOCK_H=H, BLOCK_D=D, W warps (lib:8,64,4
                  shipped before session 24);
  whole:HQ,HK,D,W the library's `rope_whole` (session 24), BLOCK_HQ, BLOCK_HK, BLOCK_D, W warps;
  pair:HQ,HK,D,W  one position a program, each step loading HQ q heads and HK k heads
                  (both halves) before any store: whole positions when they fit;
  flat:HQ,HK,D,W,F32,WIDE,COS_HALF
                  a whole position a program without loops (see rope_flat: compute
                  dtype, offset width, cos/sin halves read);
  joint:H,D,W,P   q's and k's heads as one axis (head h < n_q from q, else k), BLOCK_H=H
                  heads of P positions in one tile, so one step issues the loads of up to
                  P*H heads before any store (H >= n_q + n_k: whole positions at once);
  liger           Liger-Kernel 0.8.5's kernels (in place), when installed.
A trailing @ (lib:8,64,2@) runs a candidate in place, as Liger's does.

Every candidate compiles with num_stages=1 and without fma contraction, as the library's
ahead-of-time builds do (kernel_src/rope/spec.py). Rates
count the suite's bytes: each direction reads and writes q and k once.

  python benchmarks/experiment_rope.py [--shape B,H,KH,S,D] [--configs "whole:32,8,64,2;liger"]
      [--out DIR]           # writes rope_configs.csv under DIR
  python benchmarks/experiment_rope.py --smoke     # CPU interpreter: every kernel vs torch
"""
import argparse
import csv
import os
import sys

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from liger_aot.kernel_src.rope.kernels import rope as lib_rope  # noqa: E402
from liger_aot.kernel_src.rope.kernels import rope_whole as lib_rope_whole  # noqa: E402

LAUNCH = dict(num_stages=1, enable_fp_fusion=False)  # as the library's builds compile RoPE
DEFAULT_CONFIGS = ";".join(
    [f"lib:{h},64,{w}" for h in (8, 16, 32) for w in (2, 4, 8)]
    + [f"joint:{h},64,{w},{p}" for h, p in ((8, 1), (16, 1), (64, 1), (32, 2), (64, 2))
       for w in (2, 4, 8)]
    + ["liger"])


@triton.jit
def rope_joint(QO, KO, Q, K, COS, SIN, n_pos, seq_len, n_q, n_k, half_dim,
               sqob, sqoh, sqos, sqb, sqh, sqs, skob, skoh, skos, skb, skh, sks,
               stride_cb, stride_cs, backward,
               BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, POSITIONS: tl.constexpr):
    """Rows of the tile are (position, head) pairs, head h < n_q from q, else k's h - n_q."""
    rows = tl.arange(0, POSITIONS * BLOCK_H)
    pos = tl.program_id(0).to(tl.int64) * POSITIONS + rows // BLOCK_H
    h = (rows % BLOCK_H).to(tl.int64)
    b = pos // seq_len
    s = pos % seq_len
    bwd = backward != 0
    n_heads = n_q + n_k
    for h0 in range(0, n_heads, BLOCK_H):
        head = h0 + h
        is_q = head < n_q
        hk = head - n_q
        live = (pos < n_pos) & (head < n_heads)
        x_row = tl.where(is_q, Q + b * sqb + s * sqs + head * sqh,
                         K + b * skb + s * sks + hk * skh)
        o_row = tl.where(is_q, QO + b * sqob + s * sqos + head * sqoh,
                         KO + b * skob + s * skos + hk * skoh)
        c_row = COS + b * stride_cb + s * stride_cs
        s_row = SIN + b * stride_cb + s * stride_cs
        for d0 in range(0, half_dim, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            mask = live[:, None] & (d < half_dim)[None, :]
            x = x_row[:, None] + d[None, :]
            c = c_row[:, None] + d[None, :]
            sn = s_row[:, None] + d[None, :]
            x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(x + half_dim, mask=mask, other=0.0).to(tl.float32)
            c1 = tl.load(c, mask=mask, other=0.0).to(tl.float32)
            c2 = tl.load(c + half_dim, mask=mask, other=0.0).to(tl.float32)
            s1 = tl.load(sn, mask=mask, other=0.0).to(tl.float32)
            s2 = tl.load(sn + half_dim, mask=mask, other=0.0).to(tl.float32)
            sa = tl.where(bwd, -s2, s1)
            sb = tl.where(bwd, -s1, s2)
            o = o_row[:, None] + d[None, :]
            tl.store(o, (x1 * c1 - x2 * sa).to(QO.dtype.element_ty), mask=mask)
            tl.store(o + half_dim, (x2 * c2 + x1 * sb).to(QO.dtype.element_ty), mask=mask)


@triton.jit
def rope_pair(QO, KO, Q, K, COS, SIN, seq_len, n_q, n_k, half_dim,
              sqob, sqoh, sqos, sqb, sqh, sqs, skob, skoh, skos, skb, skh, sks,
              stride_cb, stride_cs, backward,
              BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr):
    """One position a program; each step loads BLOCK_HQ q heads and BLOCK_HK k heads (both
    halves) before storing any of them."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    bwd = backward != 0
    hq = tl.arange(0, BLOCK_HQ).to(tl.int64)
    hk = tl.arange(0, BLOCK_HK).to(tl.int64)
    steps = tl.maximum(tl.cdiv(n_q, BLOCK_HQ), tl.cdiv(n_k, BLOCK_HK))
    c_row = COS + b * stride_cb + s * stride_cs
    s_row = SIN + b * stride_cb + s * stride_cs
    for d0 in range(0, half_dim, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dm = d < half_dim
        c1 = tl.load(c_row + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        c2 = tl.load(c_row + half_dim + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        s1 = tl.load(s_row + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        s2 = tl.load(s_row + half_dim + d, mask=dm, other=0.0).to(tl.float32)[None, :]
        sa = tl.where(bwd, -s2, s1)
        sb = tl.where(bwd, -s1, s2)
        for i in range(0, steps):
            qh = i * BLOCK_HQ + hq
            kh = i * BLOCK_HK + hk
            qm = (qh < n_q)[:, None] & dm[None, :]
            km = (kh < n_k)[:, None] & dm[None, :]
            qp = Q + b * sqb + s * sqs + qh[:, None] * sqh + d[None, :]
            kp = K + b * skb + s * sks + kh[:, None] * skh + d[None, :]
            q1 = tl.load(qp, mask=qm, other=0.0).to(tl.float32)
            q2 = tl.load(qp + half_dim, mask=qm, other=0.0).to(tl.float32)
            k1 = tl.load(kp, mask=km, other=0.0).to(tl.float32)
            k2 = tl.load(kp + half_dim, mask=km, other=0.0).to(tl.float32)
            qo = QO + b * sqob + s * sqos + qh[:, None] * sqoh + d[None, :]
            ko = KO + b * skob + s * skos + kh[:, None] * skoh + d[None, :]
            tl.store(qo, (q1 * c1 - q2 * sa).to(QO.dtype.element_ty), mask=qm)
            tl.store(qo + half_dim, (q2 * c2 + q1 * sb).to(QO.dtype.element_ty), mask=qm)
            tl.store(ko, (k1 * c1 - k2 * sa).to(KO.dtype.element_ty), mask=km)
            tl.store(ko + half_dim, (k2 * c2 + k1 * sb).to(KO.dtype.element_ty), mask=km)


@triton.jit
def rope_flat(QO, KO, Q, K, COS, SIN, seq_len, n_q, n_k, half_dim,
              sqob, sqoh, sqos, sqb, sqh, sqs, skob, skoh, skos, skb, skh, sks,
              stride_cb, stride_cs, backward,
              BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
              F32: tl.constexpr, WIDE: tl.constexpr, COS_HALF: tl.constexpr):
    """A whole position a program, no loop (BLOCK_HQ >= n_q, BLOCK_HK >= n_k, BLOCK_D >=
    half_dim). F32: compute in fp32 (else in the input dtype); WIDE: int64 offsets inside
    the tile (else int32 ones from the position's int64 base); COS_HALF: read only cos/sin's
    first half (right for Hugging Face's duplicated halves only: a timing probe)."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    bwd = backward != 0
    hq = tl.arange(0, BLOCK_HQ)
    hk = tl.arange(0, BLOCK_HK)
    d = tl.arange(0, BLOCK_D)
    if WIDE:
        hq = hq.to(tl.int64)
        hk = hk.to(tl.int64)
    dm = d < half_dim
    ct = tl.float32 if F32 else QO.dtype.element_ty
    c_row = COS + b * stride_cb + s * stride_cs
    s_row = SIN + b * stride_cb + s * stride_cs
    c1 = tl.load(c_row + d, mask=dm, other=0.0).to(ct)[None, :]
    s1 = tl.load(s_row + d, mask=dm, other=0.0).to(ct)[None, :]
    if COS_HALF:
        c2 = c1
        s2 = s1
    else:
        c2 = tl.load(c_row + half_dim + d, mask=dm, other=0.0).to(ct)[None, :]
        s2 = tl.load(s_row + half_dim + d, mask=dm, other=0.0).to(ct)[None, :]
    sa = tl.where(bwd, -s2, s1)
    sb = tl.where(bwd, -s1, s2)
    qm = (hq < n_q)[:, None] & dm[None, :]
    km = (hk < n_k)[:, None] & dm[None, :]
    qp = Q + (b * sqb + s * sqs) + (hq[:, None] * sqh + d[None, :])
    kp = K + (b * skb + s * sks) + (hk[:, None] * skh + d[None, :])
    q1 = tl.load(qp, mask=qm, other=0.0).to(ct)
    q2 = tl.load(qp + half_dim, mask=qm, other=0.0).to(ct)
    k1 = tl.load(kp, mask=km, other=0.0).to(ct)
    k2 = tl.load(kp + half_dim, mask=km, other=0.0).to(ct)
    qo = QO + (b * sqob + s * sqos) + (hq[:, None] * sqoh + d[None, :])
    ko = KO + (b * skob + s * skos) + (hk[:, None] * skoh + d[None, :])
    tl.store(qo, (q1 * c1 - q2 * sa).to(QO.dtype.element_ty), mask=qm)
    tl.store(qo + half_dim, (q2 * c2 + q1 * sb).to(QO.dtype.element_ty), mask=qm)
    tl.store(ko, (k1 * c1 - k2 * sa).to(KO.dtype.element_ty), mask=km)
    tl.store(ko + half_dim, (k2 * c2 + k1 * sb).to(KO.dtype.element_ty), mask=km)


def parse_configs(text: str) -> list:
    """[(kind, ints)] of lib:H,D,W / whole:HQ,HK,D,W / pair:HQ,HK,D,W /
    flat:HQ,HK,D,W,F32,WIDE,COS_HALF / joint:H,D,W,P (each with an optional trailing @: in
    place) / liger; SystemExit names a bad one."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(";"))):
        in_place = item.endswith("@")
        kind, _, rest = item.rstrip("@").partition(":")
        if in_place and kind == "liger":
            raise SystemExit(f"config {item!r}: liger is always in place")
        want = {"lib": 3, "whole": 4, "joint": 4, "pair": 4, "flat": 7, "liger": 0}.get(kind)
        if want is None:
            raise SystemExit(f"config {item!r}: kind must be lib, whole, joint, pair, flat or "
                             "liger")
        fields = rest.split(",") if rest else []
        if len(fields) != want or not all(f.isdigit() for f in fields):
            raise SystemExit(f"config {item!r}: {kind} takes {want} integers")
        vals = tuple(map(int, fields))
        if any(v <= 0 for v in vals[:4]):
            raise SystemExit(f"config {item!r}: block sizes, warps and P must be positive")
        blocks = vals[:3] if kind in ("pair", "flat", "whole") else vals[:2] + vals[3:]
        if any(v & (v - 1) for v in blocks):
            raise SystemExit(f"config {item!r}: block sizes and P must be powers of 2")
        out.append((kind + "@" * in_place, vals))
    if not out:
        raise SystemExit("--configs names no config")
    return out


def make_inputs(B, H, KH, S, D, device, dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn((B, S, H, D), generator=g, device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn((B, S, KH, D), generator=g, device=device, dtype=dtype).transpose(1, 2)
    inv = 10000.0 ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    ang = torch.arange(S, device=device, dtype=torch.float32)[:, None] * inv
    ang = torch.cat((ang, ang), -1)[None]  # (1, S, D)
    return q, k, ang.cos().to(dtype), ang.sin().to(dtype)


def reference(q, k, cos, sin, backward):
    """fp32 rope (or its adjoint: sin -> -sin, the rotation's transpose) of q and k."""
    c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
    s = -s if backward else s

    def rot(t):
        t = t.float()
        half = t.shape[-1] // 2
        return t * c + torch.cat((-t[..., half:], t[..., :half]), -1) * s
    return rot(q), rot(k)


def launcher(kind, vals, q, k, cos, sin, backward):
    """fn() -> (q out, k out) running one candidate: into preallocated outputs, or in place
    over copies of q and k (Liger's, and a kind ending in @)."""
    B, H, S, D = q.shape
    KH = k.shape[1]
    half = D // 2
    in_place = kind.endswith("@")
    kind = kind.rstrip("@")
    if kind == "liger":
        from liger_kernel.ops import rope as liger_rope  # in place: q and k are rewritten
        qi, ki = q.clone(), k.clone()
        run = liger_rope.rope_backward if backward else liger_rope.rope_forward

        def fn():  # the first call is checked; later ones rotate the result again
            return tuple(run(qi, ki, cos, sin)[:2])
        return fn
    if in_place:  # over copies of q and k (clone keeps the transposed strides)
        q, k = q.clone(), k.clone()
        qo, ko = q, k
    else:
        qo, ko = torch.empty_like(q), torch.empty_like(k)
    cs = (0, cos.stride(1))
    a, b_, c, d = qo.stride(), q.stride(), ko.stride(), k.stride()
    if kind == "whole":
        bq, bk, bd, w = vals
        if bq < H or bk < KH or bd < half:
            raise ValueError(f"whole needs BLOCK_HQ >= {H}, BLOCK_HK >= {KH}, BLOCK_D >= {half}")

        def fn():
            lib_rope_whole[(B * S,)](qo, ko, q, k, cos, sin, S, H, KH, half,
                                     a[0], a[1], a[2], b_[0], b_[1], b_[2],
                                     c[0], c[1], c[2], d[0], d[1], d[2],
                                     cs[0], cs[1], cs[0], cs[1], 0, 0, half, half, int(backward),
                                     BLOCK_HQ=bq, BLOCK_HK=bk, BLOCK_D=bd, num_warps=w,
                                     **LAUNCH)
            return qo, ko
        return fn
    if kind == "lib":
        bh, bd, w = vals

        def fn():
            lib_rope[(B * S,)](qo, ko, q, k, cos, sin, S, H, KH, half,
                               a[0], a[1], a[2], b_[0], b_[1], b_[2],
                               c[0], c[1], c[2], d[0], d[1], d[2],
                               cs[0], cs[1], cs[0], cs[1], 0, 0, half, half, int(backward),
                               BLOCK_H=bh, BLOCK_D=bd, num_warps=w, **LAUNCH)
            return qo, ko
        return fn
    if kind == "flat":
        bq, bk, bd, w, f32, wide, cos_half = vals
        if bq < H or bk < KH or bd < half:
            raise ValueError(f"flat needs BLOCK_HQ >= {H}, BLOCK_HK >= {KH}, BLOCK_D >= {half}")

        def fn():
            rope_flat[(B * S,)](qo, ko, q, k, cos, sin, S, H, KH, half,
                                a[0], a[1], a[2], b_[0], b_[1], b_[2], c[0], c[1], c[2],
                                d[0], d[1], d[2], cs[0], cs[1], int(backward),
                                BLOCK_HQ=bq, BLOCK_HK=bk, BLOCK_D=bd, F32=bool(f32),
                                WIDE=bool(wide), COS_HALF=bool(cos_half), num_warps=w, **LAUNCH)
            return qo, ko
        return fn
    if kind == "pair":
        bq, bk, bd, w = vals

        def fn():
            rope_pair[(B * S,)](qo, ko, q, k, cos, sin, S, H, KH, half,
                                a[0], a[1], a[2], b_[0], b_[1], b_[2], c[0], c[1], c[2],
                                d[0], d[1], d[2], cs[0], cs[1], int(backward),
                                BLOCK_HQ=bq, BLOCK_HK=bk, BLOCK_D=bd, num_warps=w, **LAUNCH)
            return qo, ko
        return fn
    bh, bd, w, p = vals

    def fn():
        rope_joint[(triton.cdiv(B * S, p),)](
            qo, ko, q, k, cos, sin, B * S, S, H, KH, half,
            a[0], a[1], a[2], b_[0], b_[1], b_[2], c[0], c[1], c[2], d[0], d[1], d[2],
            cs[0], cs[1], int(backward), BLOCK_H=bh, BLOCK_D=bd, POSITIONS=p, num_warps=w,
            **LAUNCH)
        return qo, ko
    return fn


def rel_err(got, want) -> float:
    return max(((g.float() - w).norm() / w.norm()).item() for g, w in zip(got, want))


def smoke() -> int:
    """Every kernel through the interpreter on a small odd shape (head_dim 24, half 12 over
    BLOCK_D 8: two column steps; 3 + 2 heads over BLOCK_H 2: three head steps; pair 2 + 1
    heads a step: two steps, the second k step empty)."""
    q, k, cos, sin = make_inputs(2, 3, 2, 5, 24, "cpu", torch.float32)
    for backward in (False, True):
        want = reference(q, k, cos, sin, backward)
        for kind, vals in (("lib", (2, 8, 1)), ("joint", (2, 8, 1, 1)), ("joint", (4, 8, 1, 2)),
                           ("joint", (8, 16, 1, 4)), ("pair", (2, 1, 8, 1)),
                           ("pair", (4, 2, 16, 1)), ("flat", (4, 2, 16, 1, 1, 0, 0)),
                           ("flat", (4, 2, 16, 2, 1, 1, 1)), ("lib@", (2, 8, 1)),
                           ("whole", (4, 2, 16, 1))):
            fn = launcher(kind, vals, q, k, cos, sin, backward)
            e = rel_err(fn(), want)
            print(f"{'bwd' if backward else 'fwd'} {kind}:{','.join(map(str, vals))} "
                  f"rel. error {e:.1e}")
            assert e < 1e-5, (kind, vals, backward, e)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="4,32,8,4096,128", help="B,H,KH,S,D (the suite's)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="';'-separated lib:H,D,W / whole:HQ,HK,D,W / pair:HQ,HK,D,W / "
                   "flat:HQ,HK,D,W,F32,WIDE,COS_HALF / joint:H,D,W,P, a trailing @ for in place; "
                   "liger (see above)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--smoke", action="store_true", help="CPU interpreter check only")
    args = p.parse_args(argv)
    configs = parse_configs(args.configs)
    shape = args.shape.split(",")
    if len(shape) != 5 or not all(x.isdigit() and int(x) > 0 for x in shape):
        p.error(f"--shape wants five positive integers B,H,KH,S,D, got {args.shape!r}")
    B, H, KH, S, D = map(int, shape)
    if D % 2:
        p.error(f"head_dim must be even, got {D}")
    if args.smoke:
        return smoke()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (or --smoke)")

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from _gpu import copy_bandwidth
    from suite import Bench

    bench = Bench("cuda", warmup_ms=10.0, rep_ms=50.0)
    copy = copy_bandwidth()
    q, k, cos, sin = make_inputs(B, H, KH, S, D, "cuda")
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    print(f"# {torch.cuda.get_device_name()}, copy {copy / 1e12:.2f} TB/s; q {B}x{H}x{S}x{D}, "
          f"k {KH} heads, {nbytes / 1e6:.0f} MB a direction")
    rows = []
    for kind, vals in configs:
        tag = kind + (":" + ",".join(map(str, vals)) if vals else "")
        row = {"config": tag}
        for backward in (False, True):
            name = "bwd" if backward else "fwd"
            try:
                fn = launcher(kind, vals, q, k, cos, sin, backward)
                err = rel_err(fn(), reference(q, k, cos, sin, backward))
                if not err < 1e-2:
                    raise RuntimeError(f"wrong result: rel. error {err:.1e}")
                ms = bench.time_graph(fn)
                row[f"{name}_ms"] = ms
                row[f"{name}_pct"] = 100 * nbytes / (ms * 1e-3) / copy
            except Exception as e:  # noqa: BLE001 - keep the other candidates' numbers
                row[f"{name}_note"] = f"{type(e).__name__}: {e}"[:120]
        rows.append(row)
        f, b_ = row.get("fwd_ms"), row.get("bwd_ms")
        fmt = lambda n: (f"{row[n + '_ms'] * 1e3:7.1f} us {row[n + '_pct']:5.1f}%"  # noqa: E731
                         if n + "_ms" in row else f"{row.get(n + '_note', '')}")
        both = f"  f+b {100 * 2 * nbytes / ((f + b_) * 1e-3) / copy:5.1f}%" if f and b_ else ""
        print(f"{tag:18s} fwd {fmt('fwd')}  bwd {fmt('bwd')}{both}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "rope_configs.csv")
    keys = ["config", "fwd_ms", "fwd_pct", "bwd_ms", "bwd_pct", "fwd_note", "bwd_note"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
