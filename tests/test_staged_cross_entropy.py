"""The staged cross-entropy kernel (kernel_src/cross_entropy/kernels.py,
cross_entropy_fwd_staged): which variants exist, that it compiles for sm90 within what its
grid assumes (PROGRAMS_PER_SM resident programs an SM), the grid arithmetic, and when the op
takes it. Gluon kernels do not run in Triton's interpreter: their math is checked on a GPU
(tests/test_gpu_ops.py::test_staged_cross_entropy)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from _sm90 import assert_resident, compile_sm90, entry_params
from liger_aot.kernel_src import is_gluon, triton_function
from liger_aot.kernel_src.cross_entropy import spec
from liger_aot.ops import cross_entropy as ce_mod

CONFIG = spec.STAGED_CONFIG
PER_SM = CONFIG.constexprs["PROGRAMS_PER_SM"]


def test_variants_only_for_sm90_aligned_2_byte_data():
    names = [v.name for v in spec.STAGED.variants("sm90")]
    assert names == [f"cross_entropy_fwd_staged.{d}.a16.{CONFIG.tag}" for d in ("bf16", "fp16")]
    assert CONFIG.tag.endswith(".w2.s1.r64")  # the register cap is part of the variant
    for arch in ("sm80", "gfx90a", "gfx942"):
        assert list(spec.STAGED.variants(arch)) == []
    assert is_gluon(triton_function(spec.STAGED, CONFIG))
    # the flags the staged kernel implements are none of FEATURES=1's
    assert not spec.STAGED_FLAGS & (spec.FULL_FEATURE_FLAGS | spec.FLAG_ACCURACY)


def test_compiles_for_sm90_within_its_grid():
    kernel = compile_sm90(spec.STAGED, [], CONFIG)
    assert kernel["local"] == 0  # no spills
    assert_resident(kernel, CONFIG, PER_SM)  # the exchange's waits rely on it
    ptx = kernel["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert "ex2.approx.ftz.f32" in ptx
    # the exchange: tagged words written by relaxed atomics and polled, no fence
    assert "atom.global.gpu.relaxed.exch.b64" in ptx and "ld.volatile.global.b64" in ptx
    assert "membar" not in ptx and "fence" not in ptx and ".release" not in ptx
    assert entry_params(ptx) == len(spec.STAGED.type_string)


@pytest.mark.parametrize("n_rows,n_cols", [(8192, 128256), (8192, 256000), (4096, 151936),
                                           (3, 128256), (1, 65536), (5000, 262144)])
def test_staged_grid(n_rows, n_cols):
    sms = 132
    split, programs = spec.staged_grid(n_rows, n_cols, sms)
    assert split == -(-n_cols // spec.STAGED_SLICE) <= spec.MAX_STAGED_SPLIT
    assert (split - 1) * spec.STAGED_SLICE < n_cols <= split * spec.STAGED_SLICE
    assert programs % split == 0 and programs <= PER_SM * sms
    assert 1 <= programs // split <= n_rows  # no group without a row


class _Fake:
    """Just what staged_applies reads of a tensor."""

    def __init__(self, ptr=0, dtype=torch.bfloat16, shape=(8, 128256), device=0):
        self.ptr, self.dtype, self.shape, self.device = ptr, dtype, shape, device

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device


@pytest.fixture
def sm90_device(monkeypatch):
    monkeypatch.setattr(ce_mod, "_staged_devices", {0: True, 1: False})


def _applies(logits=None, flags=spec.FLAG_GRAD | spec.FLAG_MEAN, ptrs=(0, 256), ints=None,
             ignore_index=-100):
    logits = logits or _Fake()
    ints = ints if ints is not None else (logits.shape[1], logits.shape[1], logits.shape[1])
    return ce_mod.staged_applies(logits, flags, [logits] + [_Fake(p) for p in ptrs], ints,
                                 ignore_index)


def test_staged_applies(sm90_device):
    assert _applies()
    assert _applies(flags=spec.FLAG_GRAD | spec.FLAG_Z | spec.FLAG_ROW_SCALE)  # z, "none"
    assert _applies(_Fake(dtype=torch.float16, shape=(1, spec.STAGED_MIN_COLS)))
    assert _applies(_Fake(shape=(1, spec.STAGED_MAX_COLS)))
    assert _applies(ints=(128256, 2**31 - 16, 128256), ignore_index=-2**31)  # 32-bit limits
    refused = {
        "loss only": _applies(flags=spec.FLAG_MEAN | spec.FLAG_Z),
        "fp32": _applies(_Fake(dtype=torch.float32)),
        "short rows": _applies(_Fake(shape=(8, spec.STAGED_MIN_COLS - 16))),
        "long rows": _applies(_Fake(shape=(8, spec.STAGED_MAX_COLS + 16))),
        "cpu": _applies(_Fake(device=-1)),
        "another arch": _applies(_Fake(device=1)),
        "class weights": _applies(flags=spec.FLAG_GRAD | spec.FLAG_WEIGHT),
        "softcap": _applies(flags=spec.FLAG_SOFTCAP),
        "accuracy": _applies(flags=spec.FLAG_ACCURACY),
        "token scaling": _applies(flags=spec.FLAG_TOKEN_SCALING),
        "unaligned pointer": _applies(ptrs=(0, 8)),
        "unaligned stride": _applies(ints=(128256, 128264, 128248)),
        "64-bit stride": _applies(ints=(128256, 128256, 2**31)),
        "64-bit ignore_index": _applies(ignore_index=2**31),
        "64-bit negative ignore_index": _applies(ignore_index=-2**31 - 1),
    }
    assert not any(refused.values()), [k for k, v in refused.items() if v]


def test_off_switch_and_arch(monkeypatch):
    import liger_aot.runtime.device as device

    monkeypatch.setattr(device, "device_arch", lambda index: ("sm90", "fake"))
    for value, runs in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("LIGER_AOT_STAGED_CE", value)
        monkeypatch.setattr(ce_mod, "_staged_devices", {})
        assert ce_mod._staged_device(0) is runs, value
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm80", "fake"))
    monkeypatch.setattr(ce_mod, "_staged_devices", {})
    assert ce_mod._staged_device(0) is False


def test_cpu_calls_take_the_two_pass_kernel():
    """CPU tensors never take the staged kernel (the interpreter runs no Gluon): a long bf16
    row gives torch's loss and gradient through cross_entropy_fwd."""
    torch.manual_seed(0)
    n_cols = spec.STAGED_MIN_COLS + 16
    logits = (torch.randn(2, n_cols) * 2).to(torch.bfloat16).requires_grad_()
    target = torch.tensor([5, n_cols - 1])
    loss = ce_mod.cross_entropy(logits, target)
    loss.backward()
    ref = logits.detach().float().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref, target)
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-3 * abs(ref_loss.item())
    err = (logits.grad.float() - ref.grad).norm() / ref.grad.norm()
    assert err < 2e-2
