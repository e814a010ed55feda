import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from _op_helpers import apply_rotary as reference
from _op_helpers import (assert_compile_matches_eager, check_rope, rel_err, rope_grads,
                         rope_kernels_used)
from liger_aot.ops.rope import liger_rotary_pos_emb

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]


def hf_cos_sin(batch, seq, dim, dtype, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pos = torch.arange(seq, dtype=torch.float64)[None, :] + torch.arange(batch)[:, None] * 3
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check(q, k, cos, sin, unsqueeze_dim=1, use_k=True):
    check_rope(lambda q, k: liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim),
               lambda q, k: reference(q, k, cos.double(), sin.double(), unsqueeze_dim),
               q, k, TOL, use_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_rope_hf_layout(head_dim, dtype, cos_batch):
    # q and k as Hugging Face builds them: view(b, s, h, d).transpose(1, 2), non-contiguous
    torch.manual_seed(0)
    batch, seq, n_q, n_k = 2, 7, 3, 1
    q = torch.randn(batch, seq, n_q, head_dim, dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, seq, n_k, head_dim, dtype=dtype).transpose(1, 2)
    assert not q.is_contiguous()
    cos, sin = hf_cos_sin(cos_batch, seq, head_dim, dtype)
    check(q, k, cos, sin)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_general_cos_sin(dtype):
    # cos/sin halves that differ: checks the adjoint uses the right sin half
    torch.manual_seed(1)
    q = torch.randn(2, 4, 5, 48, dtype=dtype)
    k = torch.randn(2, 2, 5, 48, dtype=dtype)
    cos, sin = torch.randn(2, 5, 48, dtype=dtype), torch.randn(2, 5, 48, dtype=dtype)
    check(q, k, cos, sin)


def test_rope_unsqueeze_dim_2_and_2d_cos():
    torch.manual_seed(2)
    q = torch.randn(2, 6, 3, 32)  # (batch, seq, heads, head_dim)
    k = torch.randn(2, 6, 1, 32)
    cos, sin = hf_cos_sin(1, 6, 32, torch.float32)
    check(q, k, cos, sin, unsqueeze_dim=2)
    qo, ko = liger_rotary_pos_emb(q, k, cos[0], sin[0], unsqueeze_dim=2)
    rq, rk = reference(q, k, cos, sin, 2)
    assert rel_err(qo, rq) < 1e-5 and rel_err(ko, rk) < 1e-5


def test_rope_long_head_dim_loops():
    # half dim 160 > largest BLOCK_D (128): loops over head-dim chunks; 20 q heads loop too
    torch.manual_seed(3)
    q = torch.randn(1, 20, 3, 320)
    k = torch.randn(1, 9, 3, 320)
    cos, sin = hf_cos_sin(1, 3, 320, torch.float32)
    check(q, k, cos, sin)


def test_rope_whole_configs():
    # the whole-position kernel's tiles: every config within its bounds, the usual head
    # layouts on it, and the sizes it cannot hold left to the looped kernel
    from liger_aot.kernel_src.rope import spec

    for c in spec.WHOLE_CONFIGS:
        hq, hk, d = (c.constexprs[n] for n in ("BLOCK_HQ", "BLOCK_HK", "BLOCK_D"))
        assert hq * d <= spec.WHOLE_MAX_TILE and hq // 8 <= hk <= hq and 1 <= c.num_warps <= 8
    tiles = {(half, n_q, n_k): tuple(spec.whole_config(half, n_q, n_k).constexprs[n]
                                     for n in ("BLOCK_HQ", "BLOCK_HK", "BLOCK_D"))
             for half, n_q, n_k in ((64, 32, 8), (32, 14, 2), (128, 8, 4), (64, 64, 8),
                                    (48, 32, 32), (8, 3, 1), (64, 5, 0), (32, 71, 1))}
    assert tiles == {(64, 32, 8): (32, 8, 64), (32, 14, 2): (16, 2, 32),
                     (128, 8, 4): (8, 4, 128), (64, 64, 8): (64, 8, 64),
                     (48, 32, 32): (32, 32, 64), (8, 3, 1): (8, 1, 32),
                     (64, 5, 0): (8, 1, 64), (32, 71, 1): (128, 16, 32)}
    for half, n_q, n_k in ((160, 4, 1), (64, 65, 8), (128, 64, 8), (32, 2, 20)):
        assert spec.whole_config(half, n_q, n_k) is None, (half, n_q, n_k)
    with pytest.raises(ValueError, match="looped rope kernel"):
        spec.ROPE_WHOLE.rule(160, 4, 1)


@pytest.mark.parametrize("n_q,n_k,head_dim,kernel", [
    (5, 3, 32, "rope_whole"), (9, 1, 24, "rope_whole"),  # k heads masked in a 2-head tile
    (2, 20, 32, "rope"),  # more k heads than the q tile: looped
    (130, 2, 16, "rope"),  # a q tile over 4096 elements a half: looped
])
def test_rope_kernel_choice_fwd_bwd(monkeypatch, n_q, n_k, head_dim, kernel):
    used = rope_kernels_used(monkeypatch)
    torch.manual_seed(9)
    q = torch.randn(2, 3, n_q, head_dim).transpose(1, 2)
    k = torch.randn(2, 3, n_k, head_dim).transpose(1, 2)
    cos, sin = torch.randn(1, 3, head_dim), torch.randn(1, 3, head_dim)  # halves differ
    check(q, k, cos, sin)
    assert used and set(used) == {kernel}, used


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_misaligned_and_last_dim_copy(dtype):
    torch.manual_seed(4)
    batch, n_q, seq, d = 1, 3, 7, 64
    q = torch.randn(batch * n_q * seq * d + 1, dtype=dtype)[1:].view(batch, n_q, seq, d)
    assert q.data_ptr() % 16 != 0
    k = torch.randn(batch, 1, d, seq, dtype=dtype).transpose(2, 3)  # last dim not contiguous
    cos, sin = hf_cos_sin(1, seq, d, dtype)
    cos = torch.cat([torch.zeros(1, dtype=dtype), cos.flatten()])[1:].view(cos.shape)
    check(q, k, cos, sin)


def test_rope_only_q_used():
    torch.manual_seed(5)
    q, k = torch.randn(2, 3, 7, 64), torch.randn(2, 1, 7, 64)
    cos, sin = hf_cos_sin(2, 7, 64, torch.float32)
    check(q, k, cos, sin, use_k=False)


def test_rope_sum_backward_expanded_grad():
    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    k = torch.randn(1, 1, 3, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    (qo.sum() + ko.sum()).backward()
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = reference(q64, k64, cos.double(), sin.double())
    (rq.sum() + rk.sum()).backward()
    assert rel_err(q.grad, q64.grad) < 1e-5 and rel_err(k.grad, k64.grad) < 1e-5


def test_rope_outputs_are_new_tensors():
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 3, 16)
    q0, k0 = q.clone(), k.clone()
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert qo.data_ptr() != q.data_ptr() and ko.data_ptr() != k.data_ptr()


@pytest.mark.parametrize("seq,n_k", [(0, 1), (4, 0)])
def test_rope_empty(seq, n_k):
    q = torch.randn(2, 3, seq, 16, requires_grad=True)
    k = torch.randn(2, n_k, seq, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, seq, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert qo.shape == q.shape and ko.shape == k.shape
    (qo.sum() + ko.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    if seq:
        rq, _ = reference(q.detach(), k.detach(), cos, sin)
        assert rel_err(qo, rq) < 1e-5


def test_rope_bad_inputs():
    q, k = torch.randn(2, 3, 7, 64), torch.randn(2, 1, 7, 64)
    cos, sin = hf_cos_sin(1, 7, 64, torch.float32)
    with pytest.raises(ValueError, match="head_dim must be even"):
        liger_rotary_pos_emb(q[..., :63], k[..., :63], cos[..., :63], sin[..., :63])
    with pytest.raises(ValueError, match="k must match q"):
        liger_rotary_pos_emb(q, torch.randn(3, 1, 7, 64), cos, sin)
    with pytest.raises(ValueError, match="cos must have shape"):
        liger_rotary_pos_emb(q, k, cos[:, :6], sin[:, :6])
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        liger_rotary_pos_emb(q, k, cos, sin[:, :6])
    with pytest.raises(TypeError, match="one dtype"):
        liger_rotary_pos_emb(q, k.bfloat16(), cos, sin)
    with pytest.raises(TypeError, match="one dtype"):
        liger_rotary_pos_emb(q, k, cos.half(), sin.half())
    with pytest.raises(TypeError, match="q must be float32"):
        liger_rotary_pos_emb(q.long(), k, cos, sin)
    with pytest.raises(ValueError, match="one device"):
        liger_rotary_pos_emb(q, k, cos.to("meta"), sin)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    with pytest.raises(ValueError, match="q must be 4-D"):
        liger_rotary_pos_emb(q[0], k, cos, sin)


def test_rope_torch_compile_matches_eager():
    # fullgraph=True fails on any graph break: the call must trace as the custom op
    from liger_aot.ops import rope as rope_ops

    torch.manual_seed(6)
    q = torch.randn(2, 7, 3, 32).transpose(1, 2)  # HF layout, non-contiguous
    k = torch.randn(2, 1, 7, 32)
    cos, sin = hf_cos_sin(1, 7, 32, torch.float32)

    def f(q, k):
        qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
        return qo * 2.0, ko

    assert_compile_matches_eager(f, (q, k), rope_grads)


def test_rope_opcheck():
    q = torch.randn(1, 2, 3, 16, requires_grad=True)
    k = torch.randn(1, 1, 3, 16, requires_grad=True)
    cos, sin = hf_cos_sin(1, 3, 16, torch.float32)
    from liger_aot.ops.rope import rope_bwd_op, rope_fwd_op

    torch.library.opcheck(rope_fwd_op.custom_op, (q, k, cos, sin, 1, -1, -1))
    torch.library.opcheck(rope_bwd_op.custom_op, (q.detach(), k.detach(), cos, sin, 1, -1, -1))


# -- Hugging Face layout: one launch each way, no q/k-sized copies, gradients in q/k's strides
# The HF call is q = proj(x).view(b, s, h, d).transpose(1, 2): dense, not contiguous. The op
# must read and write it in place of a copy and hand back gradients with q's and k's strides
# (AccumulateGrad steals those; a non-leaf q's transpose-back and view stay views).

def hf_qk(batch, seq, n_q, n_k, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, n_q, dim, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(batch, seq, n_k, dim, generator=g).to(dtype).transpose(1, 2)
    return q.requires_grad_(), k.requires_grad_()


def same_layout(a, b):
    """Equal strides on every dim longer than 1 (what AccumulateGrad compares)."""
    return a.shape == b.shape and all(
        x == y for n, x, y in zip(a.shape, a.stride(), b.stride()) if n > 1)


def float64_grads(q, k, cos, sin, gq, gk):
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = reference(q64, k64, cos.double(), sin.double())
    torch.autograd.backward((rq, rk), (gq.double(), gk.double()))
    return rq.detach(), rk.detach(), q64.grad, k64.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cot_layout", ["hf", "contiguous"])
@pytest.mark.parametrize("seq,n_q,n_k,head_dim", [(13, 5, 3, 64), (9, 6, 1, 96)])
def test_rope_hf_layout_fwd_bwd_float64(dtype, cot_layout, seq, n_q, n_k, head_dim):
    batch = 2
    q, k = hf_qk(batch, seq, n_q, n_k, head_dim, dtype)
    cos, sin = hf_cos_sin(1, seq, head_dim, dtype)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert same_layout(qo, q) and same_layout(ko, k)  # outputs keep the layout
    g = torch.Generator().manual_seed(1)
    gq, gk = (torch.randn(t.shape, generator=g).to(dtype) for t in (qo, ko))
    if cot_layout == "hf":  # the layout attention's backward hands over
        gq = gq.transpose(1, 2).contiguous().transpose(1, 2)
        gk = gk.transpose(1, 2).contiguous().transpose(1, 2)
    gq0, gk0 = gq.clone(), gk.clone()
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    rq, rk, rdq, rdk = float64_grads(q, k, cos, sin, gq0, gk0)
    tol = TOL[dtype]
    assert rel_err(qo, rq) < tol and rel_err(ko, rk) < tol
    assert rel_err(dq, rdq) < tol and rel_err(dk, rdk) < tol
    assert same_layout(dq, q) and same_layout(dk, k)
    assert dq.dtype == dtype and dk.dtype == dtype
    assert torch.equal(gq, gq0) and torch.equal(gk, gk0)  # the caller's cotangents untouched


class _AtenLog(TorchDispatchMode):
    """Records every aten op with the largest numel among its tensor inputs and outputs; the
    Triton interpreter's own tensor traffic inside a launch is not recorded (paused)."""

    def __init__(self):
        super().__init__()
        self.ops, self.paused = [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            flat = list(args) + list((kwargs or {}).values())
            flat += list(out) if isinstance(out, (tuple, list)) else [out]
            sizes = [t.numel() for t in flat if isinstance(t, torch.Tensor)]
            self.ops.append((func.overloadpacket.__name__, max(sizes, default=0)))
        return out


# ops that only allocate or view: everything else on a q/k-sized tensor is a copy or math
_NO_DATA_OPS = {"empty_like", "empty_strided", "empty", "new_empty", "new_empty_strided",
                "detach", "alias", "view", "transpose", "t", "permute", "expand", "slice",
                "select", "unsqueeze", "squeeze", "as_strided"}


@pytest.fixture
def traced(monkeypatch):
    """(log, launches): aten ops recorded while log is active, and kernel launches (either
    kernel's)."""
    from liger_aot.ops import rope as rope_ops

    log, launches = _AtenLog(), []

    def counting(launch):
        def counted(*args, **kwargs):
            launches.append(args[-1])  # the backward flag
            log.paused = True
            try:
                return launch(*args, **kwargs)
            finally:
                log.paused = False
        return counted

    for kernel in (rope_ops._rope, rope_ops._rope_whole):
        monkeypatch.setattr(kernel, "launch", counting(kernel.launch))
    return log, launches


def _data_ops(log, numel):
    return [(name, n) for name, n in log.ops if n >= numel and name not in _NO_DATA_OPS]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["leaf_grad_hf_cot", "leaf_backward_contiguous_cot",
                                  "projection_contiguous_cot", "sum"])
def test_rope_hf_layout_no_copies(traced, dtype, case):
    # one launch forward, one backward, and no q/k-sized op but allocations and views. The
    # contiguous cotangents are what eager attention's matmul backward hands over: a gradient
    # in their layout would be cloned by AccumulateGrad (leaf) or copied by the view's
    # backward (projection); loss.sum() hands over an expanded scalar.
    log, launches = traced
    batch, seq, n_q, n_k, dim = 2, 11, 5, 3, 32
    cos, sin = hf_cos_sin(1, seq, dim, dtype)
    if case == "projection_contiguous_cot":
        x = torch.randn(batch, seq, n_q * dim, dtype=dtype, requires_grad=True)
        xk = torch.randn(batch, seq, n_k * dim, dtype=dtype, requires_grad=True)
        q = x.view(batch, seq, n_q, dim).transpose(1, 2)
        k = xk.view(batch, seq, n_k, dim).transpose(1, 2)
        leaves = (x, xk)
    else:
        q, k = hf_qk(batch, seq, n_q, n_k, dim, dtype)
        leaves = (q, k)
    gq = torch.randn(q.shape, dtype=dtype)
    gk = torch.randn(k.shape, dtype=dtype)
    if case == "leaf_grad_hf_cot":
        gq, gk = gq.transpose(1, 2).contiguous().transpose(1, 2), \
            gk.transpose(1, 2).contiguous().transpose(1, 2)
    small = min(q.numel(), k.numel())
    with log:
        qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert launches == [0] and _data_ops(log, small) == [], log.ops
    log.ops.clear()
    with log:
        if case == "leaf_grad_hf_cot":
            grads = torch.autograd.grad((qo, ko), leaves, (gq, gk))
        elif case == "sum":
            (qo.sum() + ko.sum()).backward()
            grads = tuple(t.grad for t in leaves)
        else:
            torch.autograd.backward((qo, ko), (gq, gk))
            grads = tuple(t.grad for t in leaves)
    assert launches == [0, 1], launches
    # loss.sum() itself reduces qo and ko; everything else must be free
    allowed = {"sum", "add"} if case == "sum" else set()
    assert [op for op in _data_ops(log, small) if op[0] not in allowed] == [], log.ops
    for t, gr in zip(leaves, grads):
        assert same_layout(gr, t)
    if case == "sum":
        gq, gk = torch.ones_like(qo), torch.ones_like(ko)
    if case != "projection_contiguous_cot":
        _, _, rdq, rdk = float64_grads(q, k, cos, sin, gq, gk)
        assert rel_err(grads[0], rdq) < TOL[dtype] and rel_err(grads[1], rdk) < TOL[dtype]


def _check_grads(q, k, cos, sin, gq, gk, tol=1e-5):
    _, _, rdq, rdk = float64_grads(q, k, cos, sin, gq, gk)
    assert rel_err(q.grad, rdq) < tol and rel_err(k.grad, rdk) < tol


def _hf_randn(like):
    """Standard normals in HF's layout (like's)."""
    b, h, s, d = like.shape
    return torch.randn(b, s, h, d, dtype=like.dtype).transpose(1, 2)


def test_rope_backward_never_overwrites_shared_gradients():
    # gradients someone else can still read are never written over (all of them come in q's
    # layout): the caller's cotangent, one a hook kept, one autograd hands to two consumers,
    # create_graph
    torch.manual_seed(7)
    cos, sin = hf_cos_sin(1, 5, 16, torch.float32)

    def run():
        q, k = hf_qk(2, 5, 3, 1, 16, torch.float32, seed=int(torch.randint(100, ())))
        return (q, k) + liger_rotary_pos_emb(q, k, cos, sin)

    # the caller's cotangents: backward(gradient=...) and autograd.grad
    q, k, qo, ko = run()
    gq, gk = _hf_randn(qo), _hf_randn(ko)
    gq0, gk0 = gq.clone(), gk.clone()
    torch.autograd.backward((qo, ko), (gq, gk))
    assert torch.equal(gq, gq0) and torch.equal(gk, gk0)
    _check_grads(q, k, cos, sin, gq0, gk0)
    q, k, qo, ko = run()
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
    assert torch.equal(gq, gq0) and torch.equal(gk, gk0)
    assert dq.data_ptr() != gq.data_ptr() and dk.data_ptr() != gk.data_ptr()

    # a slice of the caller's cotangent: cat's backward hands over views of it
    q, k, qo, ko = run()
    cot = torch.randn(4, 5, 3, 16).transpose(1, 2)  # HF layout, twice the batch
    cot0 = cot.clone()
    torch.autograd.backward((torch.cat([qo, qo.detach()]), ko), (cot, torch.ones_like(ko)))
    assert torch.equal(cot, cot0)
    _check_grads(q, k, cos, sin, cot0[:2], torch.ones_like(ko))

    # a hook that keeps the gradient it sees
    q, k, qo, ko = run()
    kept = []
    qo.register_hook(lambda g: kept.append((g, g.clone())))
    w, wk = _hf_randn(qo), _hf_randn(ko)
    ((qo * w).sum() + (ko * wk).sum()).backward()
    assert torch.equal(kept[0][0], kept[0][1])
    _check_grads(q, k, cos, sin, w, wk)

    # one gradient for two consumers: (qo + z) * w hands the same tensor to qo and z; z a
    # leaf, or a non-leaf made before the op, whose backward then runs after the op's
    for z_leaf in (True, False):
        z0 = torch.randn(2, 5, 3, 16).transpose(1, 2).requires_grad_()
        z = z0 if z_leaf else z0 * 1.0
        q, k, qo, ko = run()
        w, wk = _hf_randn(qo), _hf_randn(ko)
        ((qo + z) * w).sum().add((ko * wk).sum()).backward()
        _check_grads(q, k, cos, sin, w, wk)
        assert torch.equal(z0.grad, w)

    # the same gradient for qo and ko (equal shapes): qo + ko
    q, k = hf_qk(2, 5, 2, 2, 16, torch.float32, seed=3)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    w = _hf_randn(qo)
    ((qo + ko) * w).sum().backward()
    _check_grads(q, k, cos, sin, w, w)

    # qo used twice: the two gradients are summed first (that sum is private)
    q, k, qo, ko = run()
    w, wk = _hf_randn(qo), _hf_randn(ko)
    ((qo * w).sum() + (qo * 2.0 * w).sum() + (ko * wk).sum()).backward()
    _check_grads(q, k, cos, sin, 3.0 * w, wk)

    # create_graph: the backward runs in grad mode (its gradients may be part of a graph)
    q, k, qo, ko = run()
    w, wk = _hf_randn(qo), _hf_randn(ko)
    dq, dk = torch.autograd.grad((qo * w).sum() + (ko * wk).sum(), (q, k), create_graph=True)
    _, _, rdq, rdk = float64_grads(q, k, cos, sin, w, wk)
    assert rel_err(dq, rdq) < 1e-5 and rel_err(dk, rdk) < 1e-5

    # retain_graph: a second backward through the same graph gets the same gradients
    q, k, qo, ko = run()
    w, wk = _hf_randn(qo), _hf_randn(ko)
    loss = (qo * w).sum() + (ko * wk).sum()
    loss.backward(retain_graph=True)
    first = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    loss.backward()
    assert torch.equal(q.grad, first[0]) and torch.equal(k.grad, first[1])
    _check_grads(q, k, cos, sin, w, wk)


def test_rope_fused_qkv_slices_keep_head_order():
    # q and k as head slices of one fused projection (not dense): outputs and gradients are
    # dense in the same (batch, seq, heads) order, so the transpose-back stays a view
    torch.manual_seed(8)
    batch, seq, n_q, n_k, dim = 2, 6, 4, 2, 32
    x = torch.randn(batch, seq, (n_q + 2 * n_k) * dim, requires_grad=True)
    q = x[..., :n_q * dim].view(batch, seq, n_q, dim).transpose(1, 2)
    k = x[..., n_q * dim:(n_q + n_k) * dim].view(batch, seq, n_k, dim).transpose(1, 2)
    cos, sin = hf_cos_sin(1, seq, dim, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    assert qo.transpose(1, 2).is_contiguous() and ko.transpose(1, 2).is_contiguous()
    w, wk = torch.randn(qo.shape), torch.randn(ko.shape)
    ((qo * w).sum() + (ko * wk).sum()).backward()
    x64 = x.detach().double().requires_grad_()
    q64 = x64[..., :n_q * dim].view(batch, seq, n_q, dim).transpose(1, 2)
    k64 = x64[..., n_q * dim:(n_q + n_k) * dim].view(batch, seq, n_k, dim).transpose(1, 2)
    rq, rk = reference(q64, k64, cos.double(), sin.double())
    ((rq * w.double()).sum() + (rk * wk.double()).sum()).backward()
    assert rel_err(qo, rq) < 1e-5 and rel_err(ko, rk) < 1e-5
    assert rel_err(x.grad, x64.grad) < 1e-5


def test_rope_only_k_used_hf_layout():
    # only ko takes a gradient: k's adjoint runs alone, q gets none
    q, k = hf_qk(2, 5, 3, 2, 16, torch.float32)
    cos, sin = hf_cos_sin(1, 5, 16, torch.float32)
    qo, ko = liger_rotary_pos_emb(q, k, cos, sin)
    wk = torch.randn(ko.shape)
    (ko * wk).sum().backward()
    assert q.grad is None and same_layout(k.grad, k)
    _, _, _, rdk = float64_grads(q, k, cos, sin, torch.zeros(q.shape), wk)
    assert rel_err(k.grad, rdk) < 1e-5
