"""The looped (long-row) backward of RMSNorm and LayerNorm with BLOCK_M rows a step, in
Triton's interpreter against float64 PyTorch: dx, and the dW (dB) partial rows the kernel
sums over each step's rows; and the interleaved layout (CHUNK_ROWS > 0), whose column
programs write one partial row per chunk or add into one zeroed row (atomic).

23 rows: runs of 6 rows a program (one per SM, 4 "SMs" in the interpreter; the last run 5)
or 3 (two per SM), so a step's tail rows belong to the next program (BLOCK_M 4 at 6, 2 and 4
at 3) or lie past n_rows.
The row tensors are views of buffers with GUARD rows more; a kernel that read those rows
would change dW (dB), one that wrote them would change the buffers."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json
from pathlib import Path

import pytest
import torch

from _op_helpers import rel_err
from liger_aot.kernel_src.layer_norm import spec as ln_spec
from liger_aot.kernel_src.rms_norm import spec as rms_spec
from liger_aot.kernel_src.spec import Config
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod
from liger_aot.ops._common import accumulators, norm_backward_grid

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
EPS = 1e-6
GUARD = 4  # rows past n_rows in every row buffer
ROWS = 23  # runs of 6, 6, 6, 5 rows at one program per SM
N = 8200  # over the looped threshold (8K), not a power of two: a partial column block
TUNED = Path(__file__).resolve().parents[1] / "kernel_src" / "tuned" / "sm90.json"


def looped(block_m, block_n, warps=8, per_sm=1, stages=1):
    return Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "LOOP": True, "STAGES": stages,
                   "PROGRAMS_PER_SM": per_sm, "CHUNK_ROWS": 0}, num_warps=warps)


def interleaved(block_m, block_n, chunk, warps=8, stages=1):
    return Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "LOOP": True, "STAGES": stages,
                   "PROGRAMS_PER_SM": 0, "CHUNK_ROWS": chunk}, num_warps=warps)


# one row a step (the configs of earlier tuned tables), two and four
CONFIGS = [looped(1, 4096), looped(2, 2048), looped(4, 1024)]
# chunks of 8 rows (23 rows: 8, 8, 7) and of 32 (one chunk, mostly past n_rows), one and
# two rows a row program; 3 stages in the interpreter run as 1
INTERLEAVED = [interleaved(1, 4096, 8), interleaved(2, 2048, 8, stages=3),
               interleaved(1, 8192, 32)]


def tuned_looped_configs(name):
    """The looped configs the committed sm90 table chose for a spec (measured on the GPU)."""
    table = json.loads(TUNED.read_bytes())
    found = {}
    for entry in table["specs"].get(name, {}).values():
        record = entry["config"]
        if record["constexprs"]["LOOP"]:
            config = Config(record["constexprs"], record["num_warps"], record["num_stages"])
            found.setdefault(config.tag, config)
    return list(found.values())


def guarded(rows, n, dtype, scale=1.0, shift=0.0):
    """(rows, n) view of a (rows + GUARD, n) buffer of random values, and the buffer."""
    buffer = (torch.randn(rows + GUARD, n) * scale + shift).to(dtype)
    return buffer[:rows], buffer


def guarded_stats(values):
    """fp32 statistics followed by GUARD large ones (a row read past n_rows would count)."""
    buffer = torch.cat([values.float(), torch.full((GUARD,), 3.0)])
    return buffer[:values.shape[0]], buffer


def launch_shape(config, rows, n, spec):
    """The op's grid for the config (programs, rows_per_program, partial rows, counters)."""
    return norm_backward_grid(rows, n, -1, config, spec.SUM_BLOCK_N)


def weight_grad_outputs(atomic, grid, n, dtype, count):
    """(sums, outputs, counters) as the op passes them: zeroed fp32 rows, (n,) outputs and
    zeroed counters (atomic), else NaN-filled partial rows (every one must be written) with
    the outputs and counters as placeholders."""
    if atomic:
        sums, sync = accumulators(count, n, "cpu", grid.counters)
        return sums, tuple(torch.full((n,), float("nan"), dtype=dtype) for _ in sums), sync
    sums = tuple(torch.full((grid.partial_rows, n), float("nan")) for _ in range(count))
    return sums, sums, sums[0]


# -- RMSNorm -------------------------------------------------------------------------------

def rms_reference(x, w, dy, dres, offset):
    """float64 (dx, dw) of rmsnorm(x) * (offset + w) with upstream dy (+ dres into dx)."""
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * (offset + w64)
    y.backward(dy.double())
    dx = x64.grad + (0 if dres is None else dres.double())
    return dx, w64.grad


def run_rms(config, dtype, casting, with_dres, rows=ROWS, n=N, offset=0.5, atomic=False):
    """Launch the looped backward on guarded buffers; returns (dx, dw, dx_ref, dw_ref)."""
    torch.manual_seed(0)
    x, x_buf = guarded(rows, n, dtype)
    dy, dy_buf = guarded(rows, n, dtype)
    dres, dres_buf = guarded(rows, n, dtype) if with_dres else (dy, dy_buf)
    dx, dx_buf = guarded(rows, n, dtype)
    w = (torch.randn(n) * 0.1 + 1.0).to(dtype)
    rstd, rstd_buf = guarded_stats(torch.rsqrt(x.float().pow(2).mean(-1) + EPS))
    before = [b[rows:].clone() for b in (x_buf, dy_buf, dres_buf, dx_buf, rstd_buf)]
    grid = launch_shape(config, rows, n, rms_spec)
    (dw_sum,), (dw,), sync = weight_grad_outputs(atomic, grid, n, dtype, 1)
    rms_mod._bwd.launch((grid.programs,), dx, dw_sum, dy, x, w, rstd, rows, n, n, n, n,
                        offset, grid.rows_per_program, dres, n, int(with_dres), dw, sync,
                        int(atomic), dtype=dtype, config=config,
                        options=(("CASTING", casting),))
    after = [b[rows:] for b in (x_buf, dy_buf, dres_buf, dx_buf, rstd_buf)]
    assert all(torch.equal(a, b) for a, b in zip(after, before)), "wrote past n_rows"
    dx_ref, dw_ref = rms_reference(x, w, dy, dres if with_dres else None, offset)
    return dx, (dw if atomic else dw_sum.sum(0)), dx_ref, dw_ref


@pytest.mark.parametrize("with_dres", [False, True], ids=["plain", "dres"])
@pytest.mark.parametrize("casting", [0, 1, 2], ids=["llama", "gemma", "none"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"m{c.constexprs['BLOCK_M']}")
def test_rms_norm_looped_backward_bf16(config, casting, with_dres):
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.bfloat16, casting, with_dres)
    assert rel_err(dx, dx_ref) < TOL[torch.bfloat16]
    assert rel_err(dw, dw_ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("with_dres", [False, True], ids=["plain", "dres"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"m{c.constexprs['BLOCK_M']}")
def test_rms_norm_looped_backward_fp32(config, with_dres):
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.float32, 0, with_dres)
    assert rel_err(dx, dx_ref) < TOL[torch.float32]
    assert rel_err(dw, dw_ref) < TOL[torch.float32]


@pytest.mark.parametrize("config", [looped(4, 1024, per_sm=2), looped(2, 2048, per_sm=2)],
                         ids=["m4", "m2"])
def test_rms_norm_looped_backward_short_runs(config):
    """Two programs per SM: runs of 3 rows, shorter than (or not a multiple of) BLOCK_M."""
    assert launch_shape(config, ROWS, N, rms_spec)[1] == 3
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.float32, 1, True)
    assert rel_err(dx, dx_ref) < TOL[torch.float32]
    assert rel_err(dw, dw_ref) < TOL[torch.float32]


@pytest.mark.parametrize("config", tuned_looped_configs("rms_norm_bwd"),
                         ids=lambda c: c.tag)
def test_rms_norm_tuned_looped_configs(config):
    """The looped configs (one row a step) the committed sm90 table holds still compute."""
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.float32, 0, False)
    assert rel_err(dx, dx_ref) < TOL[torch.float32]
    assert rel_err(dw, dw_ref) < TOL[torch.float32]


# -- LayerNorm -----------------------------------------------------------------------------

def ln_reference(x, w, dy):
    """float64 (dx, dw, db) of layer_norm(x) * w + b with upstream dy."""
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = torch.zeros_like(w64, requires_grad=True)
    y = torch.nn.functional.layer_norm(x64, (x.shape[-1],), w64, b64, EPS)
    y.backward(dy.double())
    return x64.grad, w64.grad, b64.grad


def run_ln(config, dtype, rows=ROWS, n=N, atomic=False):
    torch.manual_seed(1)
    x, x_buf = guarded(rows, n, dtype, scale=0.5, shift=3.0)  # a mean away from zero
    dy, dy_buf = guarded(rows, n, dtype)
    dx, dx_buf = guarded(rows, n, dtype)
    w = (torch.randn(n) * 0.1 + 1.0).to(dtype)
    xf = x.float()
    mean, mean_buf = guarded_stats(xf.mean(-1))
    rstd, rstd_buf = guarded_stats(torch.rsqrt(xf.var(-1, unbiased=False) + EPS))
    before = [b[rows:].clone() for b in (x_buf, dy_buf, dx_buf, mean_buf, rstd_buf)]
    grid = launch_shape(config, rows, n, ln_spec)
    (dw_sum, db_sum), (dw, db), sync = weight_grad_outputs(atomic, grid, n, dtype, 2)
    ln_mod._bwd.launch((grid.programs,), dx, dw_sum, db_sum, dy, x, w, mean, rstd, rows, n,
                       n, n, n, grid.rows_per_program, dw, db, sync, int(atomic), dtype=dtype,
                       config=config)
    after = [b[rows:] for b in (x_buf, dy_buf, dx_buf, mean_buf, rstd_buf)]
    assert all(torch.equal(a, b) for a, b in zip(after, before)), "wrote past n_rows"
    if not atomic:
        dw, db = dw_sum.sum(0), db_sum.sum(0)
    return (dx, dw, db), ln_reference(x, w, dy)


def check_ln(config, dtype, atomic=False):
    got, want = run_ln(config, dtype, atomic=atomic)
    for g, r in zip(got, want):  # dx, dw, db
        assert rel_err(g, r) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", CONFIGS + [looped(2, 2048, per_sm=2),
                                               looped(4, 1024, per_sm=2)],
                         ids=["m1", "m2", "m4", "m2-short-runs", "m4-short-runs"])
def test_layer_norm_looped_backward(config, dtype):
    check_ln(config, dtype)


@pytest.mark.parametrize("config", tuned_looped_configs("layer_norm_bwd"),
                         ids=lambda c: c.tag)
def test_layer_norm_tuned_looped_configs(config):
    check_ln(config, torch.float32)


# -- the interleaved layout ----------------------------------------------------------------

def test_interleaved_grid():
    """Per chunk of 8 rows: 8 // BLOCK_M row programs and cdiv(8200, 1024) = 9 column
    programs; a partial row per chunk (23 rows: 3 chunks), a counter per column block."""
    assert rms_spec.SUM_BLOCK_N == ln_spec.SUM_BLOCK_N == 1024
    assert launch_shape(INTERLEAVED[0], ROWS, N, rms_spec) == (3 * (8 + 9), 8, 3, 9)
    assert launch_shape(INTERLEAVED[1], ROWS, N, rms_spec) == (3 * (4 + 9), 8, 3, 9)
    assert launch_shape(INTERLEAVED[2], ROWS, N, ln_spec) == (32 + 9, 32, 1, 9)
    assert launch_shape(looped(4, 1024), ROWS, N, rms_spec) == (4, 6, 4, 1)
    assert launch_shape(INTERLEAVED[0], 0, N, rms_spec)[0] == 0


# the weight-gradient path (partials or atomic) does not depend on the casting mode
@pytest.mark.parametrize("casting,atomic", [(0, False), (1, False), (2, False), (0, True)],
                         ids=["llama", "gemma", "none", "llama-atomic"])
@pytest.mark.parametrize("with_dres", [False, True], ids=["plain", "dres"])
@pytest.mark.parametrize("config", INTERLEAVED, ids=lambda c: c.tag)
def test_rms_norm_interleaved_backward_bf16(config, with_dres, casting, atomic):
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.bfloat16, casting, with_dres, atomic=atomic)
    assert rel_err(dx, dx_ref) < TOL[torch.bfloat16]
    assert rel_err(dw, dw_ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("atomic", [False, True], ids=["partials", "atomic"])
@pytest.mark.parametrize("config", INTERLEAVED, ids=lambda c: c.tag)
def test_rms_norm_interleaved_backward_fp32(config, atomic):
    dx, dw, dx_ref, dw_ref = run_rms(config, torch.float32, 0, True, atomic=atomic)
    assert rel_err(dx, dx_ref) < TOL[torch.float32]
    assert rel_err(dw, dw_ref) < TOL[torch.float32]


@pytest.mark.parametrize("atomic", [False, True], ids=["partials", "atomic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", INTERLEAVED, ids=lambda c: c.tag)
def test_layer_norm_interleaved_backward(config, dtype, atomic):
    check_ln(config, dtype, atomic=atomic)


def test_rules_interleave_rows_over_16k():
    for config in (rms_spec.select_bwd_config(16400), rms_spec.select_bwd_config(65536, True),
                   ln_spec.select_bwd_config(16400)):
        assert config.constexprs["LOOP"] and config.constexprs["CHUNK_ROWS"] > 0
        assert config.constexprs["CHUNK_ROWS"] % config.constexprs["BLOCK_M"] == 0
    for config in (rms_spec.select_bwd_config(16384), ln_spec.select_bwd_config(16384)):
        assert config.constexprs["CHUNK_ROWS"] == 0


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_ops_backward_on_the_interleaved_rule(deterministic):
    """The ops with the rules' interleaved configs (rows of 16400 columns, 70 rows: a chunk
    of 64 and one of 6), through both weight-gradient paths."""
    torch.manual_seed(3)
    rows, n = 70, 16400
    x = torch.randn(rows, n)
    w = torch.randn(n) * 0.1 + 1.0
    dy, dres = torch.randn(rows, n), torch.randn(rows, n)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + EPS)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        dx, dw = rms_mod._backward(dy, x, w, rstd, 0.0, 1, dres=dres)
        mean, ln_rstd = x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + EPS)
        got = ln_mod.layer_norm_backward(dy, x, w, mean, ln_rstd)
    finally:
        torch.use_deterministic_algorithms(before)
    dx_ref, dw_ref = rms_reference(x, w, dy, dres, 0.0)
    assert rel_err(dx, dx_ref) < 1e-5 and rel_err(dw, dw_ref) < 1e-5
    for g, r in zip(got, ln_reference(x, w, dy)):
        assert rel_err(g, r) < 1e-5


# -- the rules' looped configs, through the ops --------------------------------------------

def test_rules_loop_several_rows_a_step():
    assert rms_spec.select_bwd_config(N).constexprs["BLOCK_M"] > 1
    assert rms_spec.select_bwd_config(N, True).constexprs["BLOCK_M"] > 1
    assert ln_spec.select_bwd_config(N).constexprs["BLOCK_M"] > 1
    for config in (rms_spec.select_bwd_config(N), ln_spec.select_bwd_config(N)):
        m, n = config.constexprs["BLOCK_M"], config.constexprs["BLOCK_N"]
        assert config.constexprs["LOOP"] and m * n <= 8192


def test_ops_backward_on_the_looped_rule():
    """The ops' own grid and partial sums with the rules' looped configs (CPU: the rule)."""
    torch.manual_seed(2)
    x = torch.randn(ROWS, N)
    w = torch.randn(N) * 0.1 + 1.0
    dy, dres = torch.randn(ROWS, N), torch.randn(ROWS, N)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + EPS)
    dx, dw = rms_mod._backward(dy, x, w, rstd, 0.0, 1, dres=dres)
    dx_ref, dw_ref = rms_reference(x, w, dy, dres, 0.0)
    assert rel_err(dx, dx_ref) < 1e-5 and rel_err(dw, dw_ref) < 1e-5
    mean, rstd = x.mean(-1), torch.rsqrt(x.var(-1, unbiased=False) + EPS)
    got = ln_mod.layer_norm_backward(dy, x, w, mean, rstd)
    for g, r in zip(got, ln_reference(x, w, dy)):
        assert rel_err(g, r) < 1e-5


# -- whole rows of 16K columns: x and dy read twice (kernels.py, REREAD) ---------------------

WIDE_N = 16000  # a 16384-column tile, partly masked


def whole_row(block_n, warps=16, per_sm=1, stages=1):
    return Config({"BLOCK_M": 1, "BLOCK_N": block_n, "LOOP": False, "STAGES": stages,
                   "PROGRAMS_PER_SM": per_sm, "CHUNK_ROWS": 0}, num_warps=warps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("casting", [0, 1], ids=["llama", "gemma"])
def test_rms_norm_wide_whole_row_backward(dtype, casting):
    dx, dw, dx_ref, dw_ref = run_rms(whole_row(16384), dtype, casting, False, n=WIDE_N)
    assert rel_err(dx, dx_ref) < TOL[dtype]
    assert rel_err(dw, dw_ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_wide_whole_row_backward(dtype):
    got, want = run_ln(whole_row(16384, per_sm=2), dtype, n=WIDE_N)
    for g, r in zip(got, want):  # dx, dw, db
        assert rel_err(g, r) < TOL[dtype]
