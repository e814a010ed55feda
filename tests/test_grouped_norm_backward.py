"""The grouped RMSNorm backward (kernel_src/rms_norm/kernels.py, rms_norm_bwd_grouped): which
variants exist, that it compiles for sm90 within what its grid assumes (PROGRAMS_PER_SM
resident programs an SM), the grid arithmetic, and when the op takes it. Gluon kernels do
not run in Triton's interpreter: its math is checked on a GPU
(tests/test_gpu_ops.py::test_grouped_rms_norm_backward)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _sm90 import assert_resident, compile_sm90, entry_params
from liger_aot.kernel_src import is_gluon, triton_function
from liger_aot.kernel_src.rms_norm import spec
from liger_aot.kernel_src.spec import grouped_grid
from liger_aot.ops import rms_norm as rms_mod

CONFIG = spec.GROUPED_CONFIG
PER_SM = CONFIG.constexprs["PROGRAMS_PER_SM"]
BLOCK_N = CONFIG.constexprs["BLOCK_N"]


def test_variants_only_for_sm90_aligned_2_byte_data():
    variants = list(spec.BWD_GROUPED.variants("sm90"))
    assert {(v.dtype, v.align) for v in variants} == {("bf16", "a16"), ("fp16", "a16")}
    assert {dict(v.options)["CASTING"] for v in variants} == {0, 1, 2}
    for arch in ("sm80", "gfx90a", "gfx942"):
        assert not list(spec.BWD_GROUPED.variants(arch))
    assert is_gluon(triton_function(spec.BWD_GROUPED, CONFIG))


@pytest.mark.parametrize("casting", [0, 1, 2])
def test_compiles_for_sm90_within_its_grid(casting):
    kernel = compile_sm90(spec.BWD_GROUPED, [["CASTING", casting]], CONFIG)
    assert kernel["local"] == 0 and kernel["stack"] == 0  # no spills
    assert_resident(kernel, CONFIG, PER_SM)  # the exchange's waits rely on it
    ptx = kernel["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    # the row's dot: tagged words by relaxed atomics, polled; one acq_rel ticket a program
    # at the end (the dw slice's last program)
    assert "atom.global.gpu.relaxed.exch.b64" in ptx and "ld.volatile.global.b64" in ptx
    assert ptx.count(".acq_rel") == 1
    assert entry_params(ptx) == len(spec.BWD_GROUPED.type_string)


@pytest.mark.parametrize("n_rows,n_cols", [(4096, 16384), (2048, 32768), (1024, 65536),
                                           (3, 65536), (1, 16384), (5000, 20480)])
def test_grouped_grid(n_rows, n_cols):
    sms = 132
    split, programs = grouped_grid(n_rows, n_cols, sms, CONFIG)
    assert split == n_cols // BLOCK_N <= spec.MAX_GROUPED_SPLIT
    assert programs % split == 0 and programs <= PER_SM * sms
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


def _applies(x=None, dy=None, w_dtype=None, ptrs=(256, 512)):
    x = x or _Fake()
    dy = dy or _Fake(dtype=x.dtype, shape=x.shape, device=x.device)
    w = _Fake(ptr=ptrs[0], dtype=w_dtype or x.dtype, shape=(x.shape[1],))
    rstd = _Fake(ptr=ptrs[1], dtype=torch.float32, shape=(x.shape[0],))
    return rms_mod.grouped_applies(dy, x, w, rstd)


def test_grouped_applies(sm90_device, monkeypatch):
    assert _applies()
    assert _applies(_Fake(dtype=torch.float16, shape=(1, spec.GROUPED_MIN_COLS)))
    assert _applies(_Fake(shape=(3, spec.GROUPED_MAX_COLS)))
    refused = {
        "fp32": _applies(_Fake(dtype=torch.float32)),
        "fp32 weight": _applies(w_dtype=torch.float32),
        "short rows": _applies(_Fake(shape=(8, spec.GROUPED_MIN_COLS - BLOCK_N))),
        "long rows": _applies(_Fake(shape=(8, spec.GROUPED_MAX_COLS + BLOCK_N))),
        "not a multiple of the slice": _applies(_Fake(shape=(8, 32768 + 16))),
        "no rows": _applies(_Fake(shape=(0, 32768))),
        "cpu": _applies(_Fake(device=-1)),
        "another arch": _applies(_Fake(device=1)),
        "unaligned pointer": _applies(ptrs=(8, 512)),
        "unaligned stride": _applies(_Fake(stride=32768 + 8)),
        "64-bit stride": _applies(_Fake(stride=2**31)),
    }
    assert not any(refused.values()), [k for k, v in refused.items() if v]
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not _applies()  # its dw sums are atomic adds


def test_off_switch_and_arch(monkeypatch):
    import liger_aot.runtime.device as device

    monkeypatch.setattr(device, "device_arch", lambda index: ("sm90", "fake"))
    for value, runs in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("LIGER_AOT_GROUPED_NORM_BWD", value)
        monkeypatch.setattr(rms_mod, "_grouped_devices", {})
        assert _applies() is runs, value
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm80", "fake"))
    monkeypatch.setattr(rms_mod, "_grouped_devices", {})
    assert not _applies()


def test_cpu_calls_take_the_other_backwards():
    """CPU tensors never take the grouped kernel (the interpreter runs no Gluon): a 16K bf16
    row gives torch's gradients through rms_norm_bwd."""
    torch.manual_seed(0)
    n = spec.GROUPED_MIN_COLS
    x = torch.randn(2, n).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(n)).to(torch.bfloat16).requires_grad_()
    rms_mod.rms_norm(x, w, 1e-6, in_place=False).backward(torch.ones(2, n, dtype=torch.bfloat16))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w64).sum().backward()
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad)):
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
    assert words.shape == (rows * split * sums,) and words.dtype == torch.int64
    assert all(p.data_ptr() % 16 == 0 for p in parts)  # the aligned class
    assert all(not p.any() for p in parts)  # zeroed
    ends = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in parts)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no overlap
