"""Staged norm forwards (Gluon kernels, kernel_src/staged_rows.py): which variants a staged
config compiles, that its Triton twin computes the forward (the interpreter, fp32 and the
unaligned class run the twin), that the Gluon kernels compile for sm90 within its shared
memory and registers, and that the shipped table uses them only where they apply. Their
math on a GPU: tests/test_gpu_ops.py::test_staged_norm_forwards."""
import dataclasses
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _op_helpers import rel_err
from _sm90 import SM90_REGISTERS, SM90_SHARED_PER_BLOCK, compile_sm90, entry_params
from test_norm_looped_backward import EPS, ROWS, TOL, TUNED, guarded
from test_norm_looped_forward import forced_config  # noqa: F401 - fixture
from liger_aot.kernel_src import is_gluon, triton_function
from liger_aot.kernel_src.layer_norm import spec as ln_spec
from liger_aot.kernel_src.rms_norm import spec as rms_spec
from liger_aot.kernel_src.spec import STAGED_KEYS, Config, is_staged, staged_twin
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod

N = 20480  # a 32K bucket's row: 2.5 chunks of 8192 columns


def staged(block_n=8192, chunks=4, slots=6, warps=16, w_shared=1):
    return Config({"BLOCK_M": 1, "BLOCK_N": block_n, "LOOP": True, "STAGES": slots,
                   "PROGRAMS_PER_SM": 1, "STAGED": chunks, "W_SHARED": w_shared},
                  num_warps=warps)


def test_staged_configs_run_gluon_on_aligned_2_byte_data_only():
    config = staged()
    for dtype in ("bf16", "fp16"):
        assert staged_twin(config, dtype, "a16") is config
    for dtype, align in (("fp32", "a16"), ("bf16", "any"), ("fp16", "any"), ("fp32", "any")):
        twin = staged_twin(config, dtype, align)
        assert not is_staged(twin) and not set(STAGED_KEYS) & set(twin.constexprs)
        # the op's grid (BLOCK_M rows a block, PROGRAMS_PER_SM an SM) fits both
        for key in ("BLOCK_M", "BLOCK_N", "LOOP", "PROGRAMS_PER_SM"):
            assert twin.constexprs[key] == config.constexprs[key], key
        assert twin.constexprs["STAGES"] == 1 and twin.num_warps == config.num_warps
    plain = rms_spec.CONFIGS[-1]
    assert staged_twin(plain, "fp32", "any") is plain


def test_variants_of_a_staged_config():
    spec = dataclasses.replace(ln_spec.FWD, configs=ln_spec.FWD.configs + (staged(),))
    variants = list(spec.variants())
    names = [v.name for v in variants]
    assert len(names) == len(set(names))
    gluon = [v for v in variants if is_staged(v.config)]
    assert {(v.dtype, v.align) for v in gluon} == {("bf16", "a16"), ("fp16", "a16")}
    twins = [v for v in variants if "PROGRAMS_PER_SM=1" in v.name and not is_staged(v.config)]
    assert {(v.dtype, v.align) for v in twins} == {("fp32", "a16"), ("fp32", "any"),
                                                  ("bf16", "any"), ("fp16", "any")}
    # the runtime and the build name the same variant for a call's data
    assert spec.variant("fp32", "a16", (), staged()).name in names
    assert is_gluon(triton_function(spec, staged()))
    assert not is_gluon(triton_function(spec, spec.configs[0]))
    assert not is_gluon(triton_function(spec))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_staged_config_on_cpu_runs_its_twin(forced_config, dtype):
    torch.manual_seed(0)
    forced_config(rms_mod, staged(w_shared=0))
    x, x_buf = guarded(ROWS, N, dtype)
    w = (torch.randn(N) * 0.1 + 1.0).to(dtype)
    before = x_buf[ROWS:].clone()
    y, _, rstd = rms_mod._forward(x, w, EPS, 0.0, 0, None)
    assert torch.equal(x_buf[ROWS:], before)
    rstd_ref = torch.rsqrt(x.double().pow(2).mean(-1) + EPS)
    y_ref = (x.double() * rstd_ref[:, None]).to(dtype).double() * w.double()
    assert rel_err(rstd, rstd_ref) < TOL[dtype]
    assert rel_err(y, y_ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_staged_config_on_cpu_runs_its_twin(forced_config, dtype):
    torch.manual_seed(0)
    forced_config(ln_mod, staged())
    x, _ = guarded(ROWS, N, dtype, scale=0.5, shift=3.0)
    w = (torch.randn(N) * 0.1 + 1.0).to(dtype)
    b = torch.randn(N).to(dtype)
    y, _, mean, rstd = ln_mod.layer_norm_forward(x, w, b, EPS)
    y_ref = torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), EPS)
    assert rel_err(mean, x.double().mean(-1)) < TOL[dtype]
    assert rel_err(y, y_ref) < TOL[dtype]


@pytest.mark.parametrize("spec,options,config", [
    (rms_spec.FWD, (("CASTING", 2),), staged(16384, 4, 7, 32, w_shared=0)),
    (ln_spec.FWD, (), staged(8192, 4, 6, 16, w_shared=1)),
], ids=["rms_norm_64k", "layer_norm_32k"])
def test_staged_kernels_compile_for_sm90(spec, options, config):
    kernel = compile_sm90(spec, options, config)
    assert kernel["shared"] <= SM90_SHARED_PER_BLOCK
    ptx = kernel["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert kernel["local"] == 0  # no spills
    assert kernel["regs"] * 32 * config.num_warps <= SM90_REGISTERS  # one program fits an SM
    # the AOT manifest's type string: the spec's params and Triton's two hidden pointers
    assert entry_params(ptx) == len(spec.type_string)


def test_shipped_table_uses_staged_configs_only_where_they_apply():
    table = json.loads(TUNED.read_bytes())
    for name, entries in table["specs"].items():
        for key, entry in entries.items():
            constexprs = entry["config"]["constexprs"]
            if "STAGED" not in constexprs:
                continue
            assert name in ("rms_norm_fwd", "layer_norm_fwd"), name
            assert "residual=True" not in key, key  # the staged kernel has no residual path
            assert entry["dtype"] in ("bf16", "fp16"), key
            bucket = int(key.split(",")[0].split("=")[1])
            assert constexprs["STAGED"] * constexprs["BLOCK_N"] == bucket, key
            assert constexprs["STAGES"] >= constexprs["STAGED"], key
