"""The looped (long-row) forward of RMSNorm (with and without the fused residual add) and
LayerNorm (with and without bias) with BLOCK_M rows a step, in Triton's interpreter against
float64 PyTorch: one row a step (what `liger-aot tune` offers), two and four (the kernels
take any BLOCK_M; an H200 tune preferred none of them, docs/perf-notes.md), and the looped
forwards the committed sm90 table chose.

23 rows: the last row block of 2 or 4 rows is partial. N = 8200 columns: over the looped
threshold and not a multiple of BLOCK_N, so the last column block is partial too. The rows
are views of buffers with GUARD rows more, checked unchanged (nothing written past n_rows)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import rel_err
# the backward tests' sizes, guarded buffers and config helpers
from test_norm_looped_backward import (EPS, N, ROWS, TOL, guarded, looped,
                                       tuned_looped_configs)
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod

# one program per row block, as the forwards launch their looped configs
CONFIGS = [looped(1, 4096, per_sm=0), looped(2, 2048, per_sm=0), looped(4, 1024, per_sm=0)]


def cases(name):
    """(config, dtype): the tiles above in fp32 and bf16, the table's looped configs in fp32."""
    return ([pytest.param(c, d, id=f"m{c.constexprs['BLOCK_M']}-{dn}") for c in CONFIGS
             for d, dn in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))]
            + [pytest.param(c, torch.float32, id=c.tag) for c in tuned_looped_configs(name)])


class _Forced:
    """A module's forward kernel whose every call selects `config`."""

    def __init__(self, kernel, config):
        self.kernel, self.config = kernel, config

    def select_config(self, *args, **kwargs):
        return self.config

    def launch(self, *args, **kwargs):
        return self.kernel.launch(*args, **kwargs)


@pytest.fixture
def forced_config(monkeypatch):
    """force(module, config): that module's forward launches with config."""
    def force(module, config):
        monkeypatch.setattr(module, "_fwd", _Forced(module._fwd, config))
    return force


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("config,dtype", cases("rms_norm_fwd"))
def test_rms_norm_looped_forward(forced_config, config, dtype, residual):
    torch.manual_seed(0)
    forced_config(rms_mod, config)
    x, x_buf = guarded(ROWS, N, dtype)
    r, r_buf = guarded(ROWS, N, dtype) if residual else (None, None)
    w = (torch.randn(N) * 0.1 + 1.0).to(dtype)
    before = [b[ROWS:].clone() for b in (x_buf, r_buf) if b is not None]
    y, s, rstd = rms_mod._forward(x, w, EPS, 0.0, 0, r)  # casting "llama"
    after = [b[ROWS:] for b in (x_buf, r_buf) if b is not None]
    assert all(torch.equal(a, b) for a, b in zip(after, before)), "wrote past n_rows"
    s_ref = x.double() if r is None else (x + r).double()  # s rounds to the dtype once
    rstd_ref = torch.rsqrt(s_ref.pow(2).mean(-1) + EPS)
    y_ref = (s_ref * rstd_ref[:, None]).to(dtype).double() * w.double()
    assert rel_err(rstd, rstd_ref) < TOL[dtype]
    assert rel_err(y, y_ref) < TOL[dtype]
    if r is not None:  # (the interpreter's rounding to bf16 is not always torch's)
        assert rel_err(s, (x.double() + r.double())) < TOL[dtype]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("config,dtype", cases("layer_norm_fwd"))
def test_layer_norm_looped_forward(forced_config, config, dtype, bias):
    torch.manual_seed(0)
    forced_config(ln_mod, config)
    # a large mean: the shifted sums must not lose the variance to cancellation
    x, x_buf = guarded(ROWS, N, dtype, scale=0.5, shift=20.0)
    w = (torch.randn(N) * 0.1 + 1.0).to(dtype)
    b = torch.randn(N).to(dtype) if bias else None
    before = x_buf[ROWS:].clone()
    y, _, mean, rstd = ln_mod.layer_norm_forward(x, w, b, EPS)
    assert torch.equal(x_buf[ROWS:], before)
    x64 = x.double()
    y_ref = torch.nn.functional.layer_norm(x64, (N,), w.double(),
                                           None if b is None else b.double(), EPS)
    assert rel_err(mean, x64.mean(-1)) < TOL[torch.float32]
    assert rel_err(rstd, torch.rsqrt(x64.var(-1, unbiased=False) + EPS)) < 1e-4
    assert rel_err(y, y_ref) < TOL[dtype]
