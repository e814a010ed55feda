import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

from _op_helpers import assert_compile_matches_eager, check_op
from liger_aot.kernel_src.group_norm import spec
from liger_aot.ops import group_norm as gn_mod
from liger_aot.ops.group_norm import group_norm
from liger_aot.transformers.norms import LigerGroupNorm

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def check(x, w, b, groups, eps=1e-5):
    """Forward and backward of group_norm against float64 PyTorch."""
    channels = x.shape[1]
    _, (x, w, b), _ = check_op(lambda x, w, b: group_norm(x, w, b, channels, groups, eps),
                               lambda x, w, b: F.group_norm(x, groups, w, b, eps), (x, w, b), TOL)
    assert w.grad.dtype == w.dtype


# hw 1 (2-D input), 6, 35, 300: the three backward tile shapes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape,groups", [((3, 12, 5, 7), 4), ((2, 8, 300), 2),
                                          ((4, 24), 3), ((2, 80, 2, 3), 2)])
def test_group_norm(shape, groups, bias, dtype):
    torch.manual_seed(0)
    c = shape[1]
    check(torch.randn(shape, dtype=dtype) + 1, torch.randn(c, dtype=dtype),
          torch.randn(c, dtype=dtype) if bias else None, groups)


def test_group_norm_fp16():
    torch.manual_seed(7)
    check(torch.randn(2, 6, 9, dtype=torch.float16), torch.randn(6, dtype=torch.float16),
          torch.randn(6, dtype=torch.float16), 3)


def test_group_norm_large_group():
    torch.manual_seed(1)
    # groups larger than one block, a large mean (shifted sums must not cancel)
    check(torch.randn(2, 4, 40, 30) * 0.5 + 30, torch.randn(4), torch.randn(4), 2)


def test_group_norm_noncontiguous_misaligned():
    torch.manual_seed(2)
    x = torch.randn(3, 7, 5, 8).permute(0, 3, 2, 1)  # channels-last-like: copied
    assert not x.is_contiguous()
    check(x, torch.randn(8), torch.randn(8), 4)
    xm = torch.randn(2 * 6 * 10 + 1, dtype=torch.bfloat16)[1:].view(2, 6, 10)
    wm = torch.randn(7, dtype=torch.bfloat16)[1:]
    assert xm.data_ptr() % 16 != 0
    check(xm, wm, None, 3)


def test_group_norm_mixed_param_dtype():
    torch.manual_seed(3)
    x = torch.randn(2, 6, 10, dtype=torch.bfloat16, requires_grad=True)
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    group_norm(x, w, b, 6, 2).sum().backward()
    assert w.grad.dtype == b.grad.dtype == torch.float32


@pytest.mark.parametrize("shape", [(0, 6, 4), (2, 6, 0)])
def test_group_norm_empty(shape):
    x = torch.randn(shape, requires_grad=True)
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    y = group_norm(x, w, b, 6, 3)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(w.grad, torch.zeros(6)) and torch.equal(b.grad, torch.zeros(6))


def test_group_norm_bad_inputs():
    x, w, b = torch.randn(2, 6, 4), torch.randn(6), torch.randn(6)
    with pytest.raises(ValueError, match="must be divisible by num_groups"):
        group_norm(x, w, b, 6, 4)
    with pytest.raises(ValueError, match="num_channels=8 channels"):
        group_norm(x, torch.randn(8), torch.randn(8), 8, 2)
    with pytest.raises(ValueError, match="weight must have shape \\(6,\\)"):
        group_norm(x, torch.randn(3), b, 6, 3)
    with pytest.raises(ValueError, match="num_groups must be a positive int"):
        group_norm(x, w, b, 6, 0)
    with pytest.raises(ValueError, match="batch, channels"):
        group_norm(torch.randn(6), w, b, 6, 3)
    with pytest.raises(TypeError, match="bias must be float32"):
        group_norm(x, w, b.int(), 6, 3)
    with pytest.raises(ValueError, match="one device"):
        group_norm(x, torch.randn(6, device="meta"), b, 6, 3)


def test_group_norm_compile_matches_eager():
    torch.manual_seed(4)
    x, w, b, g = torch.randn(2, 6, 5, 3), torch.randn(6), torch.randn(6), torch.randn(2, 6, 5, 3)

    def fn(x, w, b):
        return group_norm(x, w, b, 6, 3, 1e-5)

    assert_compile_matches_eager(fn, (x, w, b), lambda y: g, tol=1e-6)


def test_group_norm_opcheck():
    torch.manual_seed(5)
    x, w, b = (torch.randn(2, 6, 10, requires_grad=True), torch.randn(6, requires_grad=True),
               torch.randn(6, requires_grad=True))
    torch.library.opcheck(gn_mod.group_norm_fwd_op.custom_op, (x, w, b, 3, 1e-5))
    torch.library.opcheck(gn_mod.group_norm_fwd_op.custom_op, (x, w, None, 3, 1e-5))
    _, mean, rstd = gn_mod.group_norm_fwd_op(x.detach(), w.detach(), b.detach(), 3, 1e-5)
    torch.library.opcheck(gn_mod.group_norm_bwd_op.custom_op,
                          (torch.randn(2, 6, 10), x.detach(), w.detach(), mean, rstd, 3))


def test_group_norm_variants():
    assert sum(len(list(s.variants())) for s in spec.SPECS) == 24


def test_liger_group_norm_module():
    torch.manual_seed(6)
    m = LigerGroupNorm(8, 4)
    assert torch.equal(m.weight, torch.ones(8)) and torch.equal(m.bias, torch.zeros(8))
    assert m.eps == 1e-6
    x = torch.randn(2, 8, 5)
    torch.testing.assert_close(m(x), F.group_norm(x, 4, m.weight, m.bias, 1e-6))
    with pytest.raises(ValueError, match="divisible"):
        LigerGroupNorm(6, 4)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        m(torch.randn(2, 8))
