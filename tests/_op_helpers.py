"""Helpers the op tests (tests/test_op_*.py) share: the error measure, the float64 forward and
backward check, the torch.compile check, checks a family of ops shares (row-wise layouts and
opcheck, GLU argument checks, MLP modules), the rotary-embedding reference and check,
torch's deterministic mode for a block (also used by the GPU tests), and a kernel forced onto
one config (also used by benchmarks/experiment_norm_fwd_held_row.py).

Imports torch and pytest only, never triton: a test module sets TRITON_INTERPRET before it
imports anything that imports triton, and importing this module first must not undo that."""
import contextlib

import pytest
import torch


def rel_err(out, ref, floor=1e-30):
    """Relative L2 error of out against ref in float64; the reference norm is clamped to at
    least floor (floor 1.0: absolute where the reference is small or zero)."""
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(floor)).item()


def check_op(op, reference, inputs, tol, err=rel_err, grad=None, clone_grad=False,
             like_input=True):
    """Forward and backward of op(*inputs) against reference(*inputs in float64).

    inputs: tensors, None for an absent optional one; the first one's dtype picks the
    tolerance tol[dtype]. Asserts the output has the reference's shape (like_input: the first
    input's shape and dtype), the output and every input's gradient are within tol of the
    reference (by err), and the first input's gradient has its shape and dtype. grad(y): the
    output's gradient, standard normal in y's dtype by default; clone_grad: backward gets a
    copy of it (an in-place backward may write into it). Returns the output, the inputs as
    leaves and their float64 leaves, for an op's own further checks."""
    dtype = inputs[0].dtype
    leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
    y = op(*leaves)
    if like_input:
        assert y.shape == leaves[0].shape and y.dtype == dtype
    g = torch.randn(y.shape, dtype=y.dtype) if grad is None else grad(y)
    y.backward(g.clone() if clone_grad else g)
    leaves64 = [None if t is None else t.detach().double().requires_grad_() for t in leaves]
    ref = reference(*leaves64)
    ref.backward(g.double())
    assert y.shape == ref.shape
    tol = tol[dtype]
    assert err(y, ref) < tol
    for t, t64 in zip(leaves, leaves64):
        if t is not None:
            assert err(t.grad, t64.grad) < tol
    x = leaves[0]
    assert x.grad.shape == x.shape and x.grad.dtype == dtype
    return y, leaves, leaves64


def assert_compile_matches_eager(fn, inputs, grads, args=(), tol=0.0):
    """fn(*inputs, *args) eagerly and through torch.compile(fullgraph=True) (any graph break
    fails): fresh leaf copies of inputs (strides kept), backward with grads(*outputs), then
    the outputs and the inputs' gradients must agree: bit for bit (tol 0) or within
    rtol = atol = tol."""
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs = f(*leaves, *args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs, grads(*outs))
        results.append([o.detach() for o in outs] + [t.grad for t in leaves])
    for eager, compiled in zip(*results):
        if tol:
            torch.testing.assert_close(eager, compiled, rtol=tol, atol=tol)
        else:
            assert torch.equal(eager, compiled)
    torch._dynamo.reset()


def seeded_randn(*outs):
    """One fixed gradient per output: the same values on the eager and the compiled run."""
    return tuple(torch.randn(o.shape, generator=torch.Generator().manual_seed(0)) for o in outs)


def ones_like(*outs):
    return tuple(torch.ones_like(o) for o in outs)


def check_row_layouts(check, dtype):
    """check(x) on rows of 70 read in place with a row stride of 140, on a transposed input
    (last dim stride 6: copied) and on rows of 100 that start misaligned."""
    check(torch.randn(2, 5, 2 * 70, dtype=dtype).chunk(2, dim=-1)[1])  # row stride 140
    check(torch.randn(70, 6, dtype=dtype).t())  # last dim stride 6: copied
    x = torch.randn(3 * 100 + 1, dtype=dtype)[1:].view(3, 100)
    assert x.data_ptr() % 16 != 0
    check(x)


def opcheck_rowwise(fwd_op, bwd_op, forward):
    """torch.library.opcheck of a row-wise op's forward (x) and backward (dy, y) on (3, 20);
    forward(x) gives y."""
    x = torch.randn(3, 20, requires_grad=True)
    torch.library.opcheck(fwd_op.custom_op, (x,))
    y = forward(x.detach())
    torch.library.opcheck(bwd_op.custom_op, (torch.randn(3, 20), y))


def check_glu_empty(glu, shape):
    """glu(a, b) on empty a, b: an empty output, and empty gradients."""
    a = torch.randn(shape, requires_grad=True)
    b = torch.randn(shape, requires_grad=True)
    c = glu(a, b)
    assert c.shape == a.shape
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape


def check_glu_bad_inputs(glu, other_dtype):
    """The argument checks every glu(a, b) shares; other_dtype: a float dtype not float32."""
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match="one shape"):
        glu(a, torch.randn(4, 9))
    with pytest.raises(TypeError, match="one dtype"):
        glu(a, torch.randn(4, 8, dtype=other_dtype))
    with pytest.raises(ValueError, match="one device"):
        glu(a, torch.randn(4, 8, device="meta"))
    with pytest.raises(ValueError, match="at least one dimension"):
        glu(torch.tensor(1.0), torch.tensor(2.0))


def check_module_grads(module, reference, x):
    """module(x) and reference(x), and the gradients of their sums in x, within 1e-5."""
    y = module(x)
    y.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ref = reference(x)
    ref.sum().backward()
    assert rel_err(y, ref) < 1e-5 and rel_err(grad, x.grad) < 1e-5


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """Hugging Face apply_rotary_pos_emb."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_grads(qo, ko):
    """The rotary tests' gradients for torch.compile's check: ones on q, halves on k."""
    return torch.ones_like(qo), torch.full_like(ko, 0.5)


def rope_kernels_used(monkeypatch) -> list:
    """A list that collects the spec name of each RoPE kernel launched (ops/rope.py's looped
    `rope` or `rope_whole`) while monkeypatch is active."""
    from liger_aot.ops import rope as rope_ops

    used = []
    for kernel in (rope_ops._rope, rope_ops._rope_whole):
        def counted(*args, _launch=kernel.launch, _name=kernel.spec.name, **kwargs):
            used.append(_name)
            return _launch(*args, **kwargs)
        monkeypatch.setattr(kernel, "launch", counted)
    return used


def check_rope(op, reference, q, k, tol, use_k=True):
    """Forward and backward of (qo, ko) = op(q, k) against reference(q, k) in float64.
    use_k False: only qo takes a gradient, and k must get none."""
    dtype = q.dtype
    q = q.detach().requires_grad_()
    k = k.detach().requires_grad_()
    qo, ko = op(q, k)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == dtype
    gq, gk = torch.randn(qo.shape, dtype=dtype), torch.randn(ko.shape, dtype=dtype)
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    rq, rk = reference(q64, k64)
    tol = tol[dtype]
    assert rel_err(qo, rq) < tol
    assert rel_err(ko, rk) < tol
    if use_k:
        torch.autograd.backward((qo, ko), (gq, gk))
        torch.autograd.backward((rq, rk), (gq.double(), gk.double()))
        assert rel_err(k.grad, k64.grad) < tol
        assert k.grad.shape == k.shape and k.grad.dtype == dtype
    else:
        qo.backward(gq)
        rq.backward(gq.double())
        assert k.grad is None
    assert rel_err(q.grad, q64.grad) < tol
    assert q.grad.shape == q.shape and q.grad.dtype == dtype


@contextlib.contextmanager
def deterministic_mode(enabled: bool = True, warn_only: bool = False):
    """torch.use_deterministic_algorithms(enabled, warn_only=warn_only) within the block,
    the previous setting after it."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def launched_weight_grad_modes(monkeypatch, kernel, deterministic, run):
    """Runs run() with torch's deterministic mode set as given and returns the atomic_dw
    argument (the last positional one) of each launch of the norm backward `kernel`: 1 when
    the kernel summed the weight gradient with atomic adds, 0 for per-program partials."""
    modes = []
    launch = kernel.launch

    def spy(grid, *args, **kwargs):
        modes.append(args[-1])
        return launch(grid, *args, **kwargs)
    monkeypatch.setattr(kernel, "launch", spy)
    with deterministic_mode(deterministic):
        run()
    return modes


class ForcedConfig:
    """A kernel whose every call selects `config` (monkeypatched over an op module's kernel,
    e.g. `_fwd`, to run that op on a config its table would not choose)."""

    def __init__(self, kernel, config):
        self.kernel, self.config = kernel, config

    def select_config(self, *args, **kwargs):
        return self.config

    def launch(self, *args, **kwargs):
        return self.kernel.launch(*args, **kwargs)
