"""The looped (long-row) forward of RMSNorm (with and without the fused residual add) and
LayerNorm (with and without bias) with BLOCK_M rows a step, in Triton's interpreter against
float64 PyTorch: one row a step (what `liger-aot tune` offers), two and four (the kernels
take any BLOCK_M; an H200 tune preferred none of them, docs/perf-notes.md), pass 1 over the
whole row (PASS1_BLOCK) and its fallback for longer rows, the same with the row length
compiled in (EXACT_KEY, rows of N_EXACT columns), and the looped forwards the committed sm90
table chose.

23 rows: the last row block of 2 or 4 rows is partial. N = 8200 columns: over the looped
threshold and not a multiple of BLOCK_N, so the last column block is partial too. The rows
are views of buffers with GUARD rows more, checked unchanged (nothing written past n_rows)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import ForcedConfig, rel_err
# the backward tests' sizes, guarded buffers and config helpers
from test_norm_looped_backward import (EPS, N, ROWS, TOL, guarded, looped,
                                       tuned_looped_configs)
from liger_aot.kernel_src.spec import EXACT_KEY, HOLD_KEY, Config
from liger_aot.kernel_src.layer_norm import spec as ln_spec
from liger_aot.kernel_src.rms_norm import spec as rms_spec
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod


def forward_pass1(block_n, warps, pass1, block_m=1, exact=False, hold=False):
    """A looped forward config of one program a row block, as the tuner writes them, with
    PASS1_BLOCK = pass1: pass 1 loads rows of up to `pass1` columns whole; exact: rows of
    exactly `pass1` columns, that length compiled in (EXACT_KEY); hold (with exact): pass 2
    from the row pass 1 loaded (HOLD_KEY, LayerNorm's)."""
    return Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "LOOP": True, "STAGES": 1,
                   "PROGRAMS_PER_SM": 0, "PASS1_BLOCK": pass1,
                   **({EXACT_KEY: 1} if exact else {}), **({HOLD_KEY: 1} if hold else {})},
                  num_warps=warps)


# one program per row block, as the forwards launch their looped configs
CONFIGS = [looped(1, 4096, per_sm=0), looped(2, 2048, per_sm=0), looped(4, 1024, per_sm=0)]
# Pass 1 over the whole row at once (16384 >= N, as a tuned bucket's PASS1_BLOCK is; one row
# a program and two, as the tuner offers them) and, two rows a step, a PASS1_BLOCK the row
# outgrows (4096 < N: the kernel's fallback to BLOCK_N blocks); bf16 only, the dtype the
# tuner times (the masks are the same in fp32). With the residual, the RMSNorm kernel keeps
# BLOCK_N blocks whatever PASS1_BLOCK says.
WIDE_PASS1_CONFIGS = [forward_pass1(4096, 8, 16384), forward_pass1(1024, 8, 4096, block_m=2),
                      forward_pass1(4096, 16, 16384, block_m=2)]


# The row length compiled in: rows of exactly PASS1_BLOCK columns, one row a program (no
# row mask) and two (the last block of the 23 rows partial), pass 2 in two and four trips.
N_EXACT = 4096
EXACT_CONFIGS = [forward_pass1(2048, 4, N_EXACT, exact=True),
                 forward_pass1(1024, 4, N_EXACT, block_m=2, exact=True)]
# LayerNorm's: the same rows held from pass 1 to pass 2
HELD_CONFIGS = [forward_pass1(2048, 4, N_EXACT, exact=True, hold=True),
                forward_pass1(1024, 4, N_EXACT, block_m=2, exact=True, hold=True)]


def _case_id(config):
    block = config.constexprs.get("PASS1_BLOCK", 0)
    return (f"m{config.constexprs['BLOCK_M']}-n{config.constexprs['BLOCK_N']}"
            + (f"-pass1_{block}" if block else "")
            + ("-exact" if config.constexprs.get(EXACT_KEY) else "")
            + ("-held" if config.constexprs.get(HOLD_KEY) else ""))


def cases(name):
    """(config, dtype): the tiles above in fp32 and bf16 (LayerNorm's also held), the
    whole-row pass 1s in bf16, the table's other looped configs in fp32."""
    held = HELD_CONFIGS if name == "layer_norm_fwd" else []
    return ([pytest.param(c, d, id=f"{_case_id(c)}-{dn}")
             for c in CONFIGS + EXACT_CONFIGS + held
             for d, dn in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))]
            + [pytest.param(c, torch.bfloat16, id=f"{_case_id(c)}-bf16")
               for c in WIDE_PASS1_CONFIGS]
            + [pytest.param(c, torch.float32, id=c.tag) for c in tuned_looped_configs(name)
               # the table's whole-row pass 1s (up to 64K wide: minutes in the interpreter)
               # run the code of WIDE_PASS1_CONFIGS' first config, with other constants
               if not c.constexprs.get("PASS1_BLOCK")])


def _cols(config) -> int:
    """The test rows' length: N, or the length an exact config compiles in."""
    return N_EXACT if config.constexprs.get(EXACT_KEY) else N


@pytest.fixture
def forced_config(monkeypatch):
    """force(module, config): that module's forward launches with config."""
    def force(module, config):
        monkeypatch.setattr(module, "_fwd", ForcedConfig(module._fwd, config))
    return force


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("config,dtype", cases("rms_norm_fwd"))
def test_rms_norm_looped_forward(forced_config, config, dtype, residual):
    torch.manual_seed(0)
    forced_config(rms_mod, config)
    N = _cols(config)
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
    N = _cols(config)
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


def test_pass1_block_is_a_defaulted_constexpr():
    """Configs without PASS1_BLOCK keep their tags (and the tuned table its records); the
    ahead-of-time compile names it (0) for every Triton variant, never for a Gluon one."""
    from liger_aot.kernel_src.spec import is_staged
    from test_staged_forward import staged

    for spec in (rms_spec.FWD, ln_spec.FWD):
        plain = spec.variant("bf16", "a16", (), spec.configs[-1])
        assert "PASS1_BLOCK" not in plain.name
        assert plain.constexprs()["PASS1_BLOCK"] == 0
        gluon = spec.variant("bf16", "a16", (), staged())
        assert is_staged(gluon.config) and "PASS1_BLOCK" not in gluon.constexprs()
        wide = spec.variant("bf16", "a16", (), forward_pass1(8192, 32, 32768))
        assert wide.constexprs()["PASS1_BLOCK"] == 32768 and "PASS1_BLOCK=32768" in wide.name


@pytest.mark.parametrize("spec,options,config", [
    (rms_spec.FWD, (("CASTING", 0),), forward_pass1(8192, 32, 32768)),
    (rms_spec.FWD, (("CASTING", 1),), forward_pass1(8192, 32, 65536)),
    (ln_spec.FWD, (), forward_pass1(4096, 16, 16384)),
    (ln_spec.FWD, (), forward_pass1(4096, 32, 65536)),
], ids=["rms_norm_32k", "rms_norm_64k", "layer_norm_16k", "layer_norm_64k"])
def test_wide_pass1_compiles_for_sm90_within_32_registers(spec, options, config):
    """A whole row in flight must not cost occupancy: the chunked kernels take 32 registers
    a thread at these tiles (two 32-warp or four 16-warp programs an SM), and so must these
    (the RMSNorm residual path keeps its chunks for that: a whole row of x and r took 43-56)."""
    from _sm90 import compile_sm90

    kernel = compile_sm90(spec, options, config)
    assert kernel["local"] == 0 and kernel["stack"] == 0
    assert kernel["regs"] <= 32, kernel["regs"]
