"""The grouped norm kernels (kernel_src/rms_norm/kernels.py, rms_norm_bwd_grouped with and
without the fused add's residual gradient, rms_norm_fwd_grouped with and without the
residual; kernel_src/layer_norm/kernels.py, layer_norm_bwd_grouped and
layer_norm_fwd_grouped): which variants exist, that they compile for sm90 within what their
grid assumes (PROGRAMS_PER_SM resident programs an SM), the grid arithmetic, and when the ops
take them. Gluon kernels do not run in Triton's interpreter: their math is checked on a GPU
(tests/test_gpu_ops.py::test_grouped_*)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _sm90 import assert_resident, compile_sm90, entry_params, programs_fit
from liger_aot.kernel_src import is_gluon, triton_function
from liger_aot.kernel_src.layer_norm import spec as ln_spec
from liger_aot.kernel_src.rms_norm import spec
from liger_aot.kernel_src.spec import Config, grouped_grid
from liger_aot.ops import layer_norm as ln_mod
from liger_aot.ops import rms_norm as rms_mod

CONFIG = spec.GROUPED_CONFIG
BLOCK_N = CONFIG.constexprs["BLOCK_N"]
# (kernel spec, config, its compile options, acq_rel tickets in its PTX): every config the
# sm90 build compiles. A backward takes one ticket a program at the end (its weight-gradient
# slice's last program writes the totals); a forward sums nothing across rows.
KERNELS = [(kernel_spec, c, [["CASTING", casting]], tickets)
           for kernel_spec, configs, tickets in (
               (spec.BWD_GROUPED, (spec.GROUPED_CONFIG, spec.GROUPED_DRES_CONFIG), 1),
               (spec.FWD_GROUPED, (spec.GROUPED_FWD_CONFIG, spec.GROUPED_FWD_RES_CONFIG), 0))
           for c in configs for casting in (0, 1, 2)]
KERNELS += [(ln_spec.BWD_GROUPED, ln_spec.GROUPED_CONFIG, [], 1),
            (ln_spec.FWD_GROUPED, ln_spec.GROUPED_FWD_CONFIG, [], 0)]
KERNEL_IDS = [f"{k.name}-{'dres' if c.constexprs.get('HAS_DRES') else ''}"
              f"{'res' if c.constexprs.get('HAS_RESIDUAL') else ''}-{o}" for k, c, o, _ in KERNELS]


# (RMSNorm spec, its residual flag, LayerNorm spec)
@pytest.mark.parametrize("rms_spec,flag,ln_kernel", [
    (spec.BWD_GROUPED, "HAS_DRES", ln_spec.BWD_GROUPED),
    (spec.FWD_GROUPED, "HAS_RESIDUAL", ln_spec.FWD_GROUPED)], ids=["backward", "forward"])
def test_variants_only_for_sm90_aligned_2_byte_data(rms_spec, flag, ln_kernel):
    variants = list(rms_spec.variants("sm90"))
    assert {(v.dtype, v.align) for v in variants} == {("bf16", "a16"), ("fp16", "a16")}
    assert {dict(v.options)["CASTING"] for v in variants} == {0, 1, 2}
    assert {v.config.constexprs[flag] for v in variants} == {0, 1}
    assert len(variants) == 12
    ln_variants = list(ln_kernel.variants("sm90"))
    assert {(v.dtype, v.align) for v in ln_variants} == {("bf16", "a16"), ("fp16", "a16")}
    for kernel_spec in (rms_spec, ln_kernel):
        for arch in ("sm80", "gfx90a", "gfx942"):
            assert not list(kernel_spec.variants(arch))
        assert is_gluon(triton_function(kernel_spec, kernel_spec.configs[0]))
        assert all(c.constexprs["BLOCK_N"] == BLOCK_N for c in kernel_spec.configs)
    flagged, plain = rms_spec.rule(True), rms_spec.rule(False)
    assert flagged.constexprs[flag] == 1 and plain.constexprs[flag] == 0
    assert {flagged, plain} == set(rms_spec.configs)


@pytest.mark.parametrize("kernel_spec,config,options,tickets", KERNELS, ids=KERNEL_IDS)
def test_compiles_for_sm90_within_its_grid(kernel_spec, config, options, tickets):
    kernel = compile_sm90(kernel_spec, options, config)
    assert kernel["local"] == 0 and kernel["stack"] == 0  # no spills
    # the exchange's waits rely on it
    assert_resident(kernel, config, config.constexprs["PROGRAMS_PER_SM"])
    ptx = kernel["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    # the row's shares: one word a (row, part) by relaxed atomics, polled, no fence
    assert "atom.global.gpu.relaxed.exch.b64" in ptx and "ld.volatile.global.b64" in ptx
    assert ptx.count(".acq_rel") == tickets and "membar" not in ptx
    assert tickets or "fence" not in ptx
    assert entry_params(ptx) == len(kernel_spec.type_string)


# (registers a thread, warps a program, programs an SM): Nsight Compute's register block
# limit on an H200 (session 22, docs/results/2026-12-02-ncu-grouped-forwards-session22-h200.
# txt) is the most that fit; one more does not
@pytest.mark.parametrize("regs,warps,limit", [(91, 2, 10), (84, 2, 10), (55, 4, 9), (64, 2, 16)])
def test_residency_rule_matches_the_h200s_block_limits(regs, warps, limit):
    config = Config({}, num_warps=warps)
    kernel = {"regs": regs, "shared": 12304}
    assert programs_fit(kernel, config, limit) and not programs_fit(kernel, config, limit + 1)


@pytest.mark.parametrize("config", [spec.GROUPED_CONFIG, spec.GROUPED_DRES_CONFIG,
                                    ln_spec.GROUPED_CONFIG, spec.GROUPED_FWD_CONFIG,
                                    spec.GROUPED_FWD_RES_CONFIG, ln_spec.GROUPED_FWD_CONFIG],
                         ids=["rms", "dres", "ln", "rms-fwd", "res-fwd", "ln-fwd"])
@pytest.mark.parametrize("n_rows,n_cols", [(4096, 16384), (2048, 32768), (1024, 65536),
                                           (3, 65536), (1, 16384), (5000, 20480)])
def test_grouped_grid(config, n_rows, n_cols):
    sms = 132
    per_sm = config.constexprs["PROGRAMS_PER_SM"]
    split, programs = grouped_grid(n_rows, n_cols, sms, config)
    assert split == n_cols // config.constexprs["BLOCK_N"] <= spec.MAX_GROUPED_SPLIT
    assert programs % split == 0 and programs <= per_sm * sms
    assert 1 <= programs // split <= n_rows  # no group without a row


class _Fake:
    """Just what grouped_applies reads of a tensor."""

    def __init__(self, ptr=0, dtype=torch.bfloat16, shape=(8, 32768), device=0, stride=None):
        self.ptr, self.dtype, self.shape, self.device = ptr, dtype, shape, device
        self._stride = shape[-1] if stride is None else stride

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device

    def stride(self, dim):
        return self._stride if dim == 0 else 1


@pytest.fixture
def sm90_device(monkeypatch):
    monkeypatch.setattr(rms_mod, "_grouped_devices", {0: True, 1: False})
    monkeypatch.setattr(ln_mod, "_grouped_devices", {0: True, 1: False})


def _applies(x=None, dy=None, w_dtype=None, ptrs=(256, 512), dres=None, op="rms"):
    x = x or _Fake()
    dy = dy or _Fake(dtype=x.dtype, shape=x.shape, device=x.device)
    w = _Fake(ptr=ptrs[0], dtype=w_dtype or x.dtype, shape=(x.shape[1],))
    rstd = _Fake(ptr=ptrs[1], dtype=torch.float32, shape=(x.shape[0],))
    if op == "ln":
        return ln_mod.grouped_applies(dy, x, w, rstd, rstd)  # (mean, rstd)
    return rms_mod.grouped_applies(dy, x, w, rstd, dres)


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_grouped_applies(sm90_device, monkeypatch, op):
    family = spec if op == "rms" else ln_spec
    assert _applies(op=op)
    assert _applies(_Fake(dtype=torch.float16, shape=(1, family.GROUPED_MIN_COLS)), op=op)
    assert _applies(_Fake(shape=(3, family.GROUPED_MAX_COLS)), op=op)
    refused = {
        "fp32": _applies(_Fake(dtype=torch.float32), op=op),
        "fp32 weight": _applies(w_dtype=torch.float32, op=op),
        "short rows": _applies(_Fake(shape=(8, family.GROUPED_MIN_COLS - BLOCK_N)), op=op),
        "long rows": _applies(_Fake(shape=(8, family.GROUPED_MAX_COLS + BLOCK_N)), op=op),
        "not a multiple of the slice": _applies(_Fake(shape=(8, 32768 + 16)), op=op),
        "no rows": _applies(_Fake(shape=(0, 32768)), op=op),
        "cpu": _applies(_Fake(device=-1), op=op),
        "another arch": _applies(_Fake(device=1), op=op),
        "unaligned pointer": _applies(ptrs=(8, 512), op=op),
        "unaligned stride": _applies(_Fake(stride=32768 + 8), op=op),
        "64-bit stride": _applies(_Fake(stride=2**31), op=op),
    }
    assert not any(refused.values()), [k for k, v in refused.items() if v]
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not _applies(op=op)  # its weight-gradient sums are atomic adds


def test_grouped_applies_with_residual_gradient(sm90_device):
    """The fused add's backward takes it when its residual gradient is like dy."""
    assert _applies(dres=_Fake(ptr=1024))
    refused = {
        "fp32 dres": _applies(dres=_Fake(ptr=1024, dtype=torch.float32)),
        "unaligned dres": _applies(dres=_Fake(ptr=1032)),
        "unaligned dres stride": _applies(dres=_Fake(ptr=1024, stride=32768 + 8)),
        "64-bit dres stride": _applies(dres=_Fake(ptr=1024, stride=2**31)),
    }
    assert not any(refused.values()), [k for k, v in refused.items() if v]


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_off_switch_and_arch(monkeypatch, op):
    import liger_aot.runtime.device as device

    module = rms_mod if op == "rms" else ln_mod
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm90", "fake"))
    for value, runs in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_BWD", value)
        monkeypatch.setattr(module, "_grouped_devices", {})
        assert _applies(op=op) is runs, value
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm80", "fake"))
    monkeypatch.setattr(module, "_grouped_devices", {})
    assert not _applies(op=op)


def test_cpu_calls_take_the_other_backwards():
    """CPU tensors never take the grouped kernel (the interpreter runs no Gluon): a bf16 row
    of the grouped kernel's shortest length gives torch's gradients through rms_norm_bwd."""
    torch.manual_seed(0)
    n = spec.GROUPED_MIN_COLS
    x = torch.randn(2, n).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(n)).to(torch.bfloat16).requires_grad_()
    rms_mod.rms_norm(x, w, 1e-6, in_place=False).backward(torch.ones(2, n, dtype=torch.bfloat16))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64).sum().backward()
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2


def test_cpu_layer_norm_takes_the_other_backwards():
    """The same for LayerNorm (layer_norm_bwd): dx, dw and db of such a bf16 row."""
    torch.manual_seed(0)
    n = ln_spec.GROUPED_MIN_COLS
    x = torch.randn(2, n).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(n)).to(torch.bfloat16).requires_grad_()
    b = (0.1 * torch.randn(n)).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(2, n).to(torch.bfloat16)
    ln_mod.layer_norm(x, w, b, 1e-6).backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-6).backward(
        dy.double())
    for got, want in zip((x.grad, w.grad, b.grad), (t.grad for t in leaves)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.parametrize("n,split,sums", [(16384, 8, 1), (65536, 32, 1), (20480, 10, 2)])
def test_grouped_backward_buffers(n, split, sums):
    from liger_aot.ops._common import grouped_backward_buffers

    rows = 7
    sum_rows, sync, words = grouped_backward_buffers(rows, n, split, sums, "cpu")
    parts = list(sum_rows) + [sync, words]
    assert [r.shape for r in sum_rows] == [(n,)] * sums and all(
        r.dtype == torch.float32 for r in sum_rows)
    assert sync.shape == (split,) and sync.dtype == torch.int32
    assert words.shape == (rows * split,) and words.dtype == torch.int64
    assert all(p.data_ptr() % 16 == 0 for p in parts)  # the aligned class
    assert all(not p.any() for p in parts)  # zeroed
    ends = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in parts)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no overlap


# -- grouped forwards -----------------------------------------------------------------------

@pytest.fixture
def sm90_forward(monkeypatch):
    monkeypatch.setattr(rms_mod, "_grouped_fwd_devices", {0: True, 1: False})
    monkeypatch.setattr(ln_mod, "_grouped_fwd_devices", {0: True, 1: False})


def _forward_applies(x=None, w_dtype=None, w_ptr=256, residual=None, op="rms", bias=False):
    x = x or _Fake()
    w = _Fake(ptr=w_ptr, dtype=w_dtype or x.dtype, shape=(x.shape[1],))
    if op == "ln":
        b = _Fake(ptr=512, dtype=x.dtype, shape=(x.shape[1],)) if bias else None
        return ln_mod.grouped_forward_applies(x, w, b)
    return rms_mod.grouped_forward_applies(x, w, residual)


@pytest.mark.parametrize("op", ["rms", "fused", "ln"])
def test_grouped_forward_applies(sm90_forward, monkeypatch, op):
    min_cols = {"rms": spec.GROUPED_FWD_MIN_COLS, "fused": spec.GROUPED_FWD_RES_MIN_COLS,
                "ln": ln_spec.GROUPED_FWD_MIN_COLS}[op]
    family = ln_spec if op == "ln" else spec

    def applies(x=None, **kw):
        x = x or _Fake()
        if op == "fused":
            kw.setdefault("residual", _Fake(ptr=1024, dtype=x.dtype, shape=x.shape))
        return _forward_applies(x, op="ln" if op == "ln" else "rms", **kw)
    looped = ln_spec.GROUPED_FWD_LOOPED_COLS if op == "ln" else ()  # LayerNorm's only
    shortest = next(n for n in range(min_cols, family.GROUPED_MAX_COLS, BLOCK_N)
                    if n not in looped)
    assert applies(_Fake(shape=(8, shortest)))
    assert applies(_Fake(dtype=torch.float16, shape=(1, family.GROUPED_MAX_COLS)))
    # rows of up to 32K where the looped forward's whole-row pass 1 measured ahead
    assert not applies(_Fake(shape=(8, 32768)))
    assert op != "rms" or min_cols > 32768  # RMSNorm: every length to 32K (session 19)
    assert not any(applies(_Fake(shape=(8, n))) for n in looped)
    refused = {
        "fp32": applies(_Fake(dtype=torch.float32)),
        "fp32 weight": applies(w_dtype=torch.float32),
        "short rows": applies(_Fake(shape=(8, min_cols - BLOCK_N))),
        "long rows": applies(_Fake(shape=(8, family.GROUPED_MAX_COLS + BLOCK_N))),
        "not a multiple of the slice": applies(_Fake(shape=(8, 40960 + 16))),
        "no rows": applies(_Fake(shape=(0, 40960))),
        "cpu": applies(_Fake(device=-1, shape=(8, 40960))),
        "another arch": applies(_Fake(device=1, shape=(8, 40960))),
        "unaligned weight": applies(_Fake(shape=(8, 40960)), w_ptr=8),
        "unaligned stride": applies(_Fake(shape=(8, 40960), stride=40960 + 8)),
        "64-bit stride": applies(_Fake(shape=(8, 40960), stride=2**31)),
    }
    if op == "fused":
        x = _Fake(shape=(8, 40960))
        refused["fp16 residual"] = applies(x, residual=_Fake(ptr=1024, dtype=torch.float16,
                                                             shape=x.shape))
        refused["unaligned residual"] = applies(x, residual=_Fake(ptr=1032, shape=x.shape))
    if op == "ln":
        assert applies(_Fake(shape=(8, 40960)), bias=True)
    assert not any(refused.values()), [k for k, v in refused.items() if v]
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert applies(_Fake(shape=(8, 40960)))  # no atomics: deterministic as it is


def test_grouped_layer_norm_forward_refuses_an_unaligned_bias(sm90_forward):
    x = _Fake(shape=(8, 40960))
    w = _Fake(ptr=256, shape=(40960,))
    assert ln_mod.grouped_forward_applies(x, w, _Fake(ptr=512, shape=(40960,)))
    assert not ln_mod.grouped_forward_applies(x, w, _Fake(ptr=520, shape=(40960,)))
    assert not ln_mod.grouped_forward_applies(x, w, _Fake(ptr=512, dtype=torch.float32,
                                                          shape=(40960,)))


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_forward_off_switch_and_arch(monkeypatch, op):
    import liger_aot.runtime.device as device

    module = rms_mod if op == "rms" else ln_mod
    x = _Fake(shape=(8, 40960))
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm90", "fake"))
    for value, runs in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_FWD", value)
        monkeypatch.setattr(module, "_grouped_fwd_devices", {})
        assert _forward_applies(x, op=op) is runs, value
    monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_BWD", "0")  # the other switch
    monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_FWD", "1")
    monkeypatch.setattr(module, "_grouped_fwd_devices", {})
    assert _forward_applies(x, op=op)
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm80", "fake"))
    monkeypatch.setattr(module, "_grouped_fwd_devices", {})
    assert not _forward_applies(x, op=op)


def test_cpu_calls_take_the_other_forwards():
    """CPU tensors never take the grouped forwards: 40960-column bf16 rows through RMSNorm,
    the fused add and LayerNorm give torch's values (rms_norm_fwd, layer_norm_fwd)."""
    torch.manual_seed(0)
    n = 40960
    x = torch.randn(2, n).to(torch.bfloat16)
    r = torch.randn(2, n).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n)).to(torch.bfloat16)

    def rms(t):
        t = t.double()
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    y = rms_mod.rms_norm(x, w, 1e-6)
    y_fused, s = rms_mod.fused_add_rms_norm(x, r, w, 1e-6)
    y_ln = ln_mod.layer_norm(x + 3, w, b, 1e-6)
    want_ln = torch.nn.functional.layer_norm((x + 3).double(), (n,), w.double(), b.double(),
                                             1e-6)
    for got, want in ((y, rms(x)), (y_fused, rms(x + r)), (s, (x + r).double()),
                      (y_ln, want_ln)):
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2
