"""The column sum of fp32 partial rows (ops/_common.sum_partials) that reduces the norms'
per-program weight / bias gradient partials and casts them in one launch."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from liger_aot.kernel_src.column_sum import spec
from liger_aot.ops._common import sum_partials


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_parts,n", [(1, 1), (33, 100), (70, 3000), (5, 9000), (64, 2048)])
def test_sum_partials(n_parts, n, dtype):
    torch.manual_seed(n_parts + n)
    p = torch.randn(n_parts, n)
    q = torch.randn(n_parts, n)
    got, got2 = sum_partials(p, dtype, q)
    assert got.dtype == got2.dtype == dtype and got.shape == got2.shape == (n,)
    for out, part in ((got, p), (got2, q)):
        ref = part.double().sum(0)
        # fp32: summation order only; bf16/fp16: one rounding of the fp32 sum
        expected = ref.to(dtype).double() if dtype != torch.float32 else ref
        tol = 1e-5 * max(1.0, n_parts ** 0.5) if dtype == torch.float32 else 0.0
        diff = (out.double() - expected).abs()
        if dtype != torch.float32:  # the fp32 sum may round to the neighbouring value
            ulp = expected.abs() * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10)
            assert bool((diff <= ulp + 1e-6).all()), float(diff.max())
        else:
            assert bool((diff <= tol * (1 + ref.abs())).all()), float(diff.max())
    one, none = sum_partials(p, dtype)
    assert none is None and torch.equal(one, got)


def test_sum_partials_no_parts_and_no_columns():
    out, out2 = sum_partials(torch.empty(0, 7), torch.bfloat16, torch.empty(0, 7))
    assert torch.equal(out, torch.zeros(7, dtype=torch.bfloat16))
    assert torch.equal(out2, torch.zeros(7, dtype=torch.bfloat16))
    out, _ = sum_partials(torch.empty(5, 0), torch.float32)
    assert out.shape == (0,)


def test_column_blocks_cover_every_column():
    for n in (1, 31, 32, 33, 2048, 2049, 8192, 8193, 100000):
        config = spec.select_config(n)
        (programs,) = spec.grid(n, config)
        assert (programs - 1) * config.constexprs["BLOCK_N"] < n <= programs * config.constexprs["BLOCK_N"]
