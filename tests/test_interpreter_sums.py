"""The tests' fast path for LayerNorm's pair of sums in Triton's interpreter
(_interpreter_sums.py, installed by conftest) against the interpreter's own element-by-element
reduction."""
import importlib

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

import _interpreter_sums
from kernel_src.layer_norm.kernels import _add_pairs


@triton.jit
def _max_and_sum(a1, a2, b1, b2):  # not listed: the interpreter's own reduction runs it
    return tl.maximum(a1, b1), a2 + b2


@triton.jit
def _reduce_pair(X, Y, OUT1, OUT2, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 LISTED: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    mask = cols < n_cols
    x = tl.load(X + rows * n_cols + cols, mask=mask, other=0.0)
    y = tl.load(Y + rows * n_cols + cols, mask=mask, other=0.0)
    if LISTED:
        s1, s2 = tl.reduce((x, y), 1, _add_pairs, keep_dims=True)
    else:
        s1, s2 = tl.reduce((x, y), 1, _max_and_sum, keep_dims=True)
    tl.store(OUT1 + rows, s1)
    tl.store(OUT2 + rows, s2)


def _run(listed, n_cols=37, n_rows=4):
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(n_rows, n_cols, generator=gen) for _ in range(2))
    out1, out2 = (torch.empty(n_rows, 1) for _ in range(2))
    _reduce_pair[(1,)](x, y, out1, out2, n_cols, BLOCK_M=n_rows, BLOCK_N=64, LISTED=listed)
    return x, y, out1, out2


def test_installed_for_the_tests():
    assert getattr(interpreter.ReduceOps.apply_impl, "_sums_installed", False)


@pytest.mark.parametrize("module, name", _interpreter_sums.ELEMENTWISE_SUMS)
def test_every_listed_combine_function_exists(module, name):
    # a renamed or moved function would silently fall back to the slow path
    function = getattr(importlib.import_module(module), name)
    assert _interpreter_sums._key(function.fn) == (module, name)


def test_listed_pair_sums_as_the_interpreter_does(monkeypatch):
    x, y, fast1, fast2 = _run(listed=True)
    monkeypatch.setattr(interpreter.ReduceOps, "apply_impl",
                        interpreter.ReduceOps.apply_impl.generic)
    _, _, slow1, slow2 = _run(listed=True)
    # the same sums, added in another order
    torch.testing.assert_close(fast1, slow1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast2, slow2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast1[:, 0], x.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast2[:, 0], y.sum(1), rtol=1e-5, atol=1e-5)


def test_other_combine_functions_keep_the_interpreters_reduction():
    # the padding is 0: the max is over the 37 columns and the zeros beyond
    x, y, out1, out2 = _run(listed=False)
    torch.testing.assert_close(out1[:, 0], x.amax(1).clamp(min=0.0))
    torch.testing.assert_close(out2[:, 0], y.sum(1), rtol=1e-5, atol=1e-5)
