"""Cross entropy on one AOT kernel: ignore_index, label smoothing, class weights, z-loss,
logit softcap, token accuracy, reductions none / sum / mean.

The kernel writes each row's loss and, when the logits need a gradient, the gradient of the
reduced loss w.r.t. the logits, so backward is one multiply by grad_output. Nothing here
synchronizes with the host: the "mean" divisors are device tensors read by the kernel.

Memory. The gradient needs a (rows, V) buffer. It is written into
  * the kernel's own contiguous copy of the logits when one had to be made (free);
  * the logits themselves with ``in_place=True`` (Liger-Kernel's trick, one full logits
    buffer less): honoured only for a non-leaf logits tensor, i.e. one computed by the graph
    (a leaf is the caller's data, e.g. a parameter, and is never overwritten). Afterwards
    the logits tensor holds the gradient. Its version counter is bumped, so if anything
    else saved those logits for its own backward, autograd raises "modified by an inplace
    operation" instead of computing a wrong gradient;
  * else a new buffer.
Backward scales the stored gradient by grad_output in place (no new buffer) unless the
graph is being retained (``retain_graph=True`` / ``create_graph=True``), in which case it
must stay intact for the next backward and the product goes to a new tensor. In place, a
grad_output of 1 (plain `loss.backward()`) is detected by the scale kernel on the device and
costs no pass over the gradient (testing it on the host would synchronize). The
torch.compile path (custom ops) never works in place; the compiler plans those buffers.

Kernels. Long rows of bf16/fp16 logits on sm90 (staged_applies) take the staged kernel,
which reads each row once through shared memory (kernels.py: cross_entropy_fwd_staged);
everything else, and every CPU tensor, takes cross_entropy_fwd. Both compute the same
function; LIGER_AOT_STAGED_CE=0 turns the staged one off.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from liger_aot.kernel_src.cross_entropy import spec
from liger_aot.runtime import Kernel
from liger_aot.runtime._env import staged_cross_entropy

from ._common import (aligned16, check_float, check_same_device, check_tensor, device_runs,
                      graph_retained, last_dim_contiguous, multiprocessor_count)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_scale = Kernel(spec.SCALE)
_staged = Kernel(spec.STAGED)
_reduction_scales = Kernel(spec.REDUCTION_SCALES)
_reduce_rows = Kernel(spec.REDUCE_ROWS)
_STAGED_DTYPES = (torch.bfloat16, torch.float16)
_staged_devices = {}  # device index -> whether its arch runs the staged kernel

REDUCTIONS = ("mean", "sum", "none")


@dataclasses.dataclass
class CrossEntropyOutput:
    """What the functional returns when return_token_accuracy=True (Liger-Kernel's name)."""
    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None


# -- shared by cross entropy and fused linear cross entropy --------------------------------

def reduction_scales(target: torch.Tensor, ignore_index: int,
                     weight: Optional[torch.Tensor]) -> torch.Tensor:
    """(3,) float32 on the device, read by the kernel as SCALES: [1 / sum of the class
    weights of non-ignored targets (their count without weights), 1 / number of non-ignored
    targets, sum of all class weights (0 without weights)]. 1/0 = inf, so a "mean" over
    nothing comes out nan as in PyTorch. One kernel for up to spec.SMALL_MAX_ROWS targets
    (kernels.py: reduction_scales), else torch's reductions."""
    n_rows = target.shape[0]
    if n_rows <= spec.SMALL_MAX_ROWS:
        scales = torch.empty(3, dtype=torch.float32, device=target.device)
        n_classes = 1 if weight is None else weight.shape[0]
        _reduction_scales.launch((1,), scales, target, scales if weight is None else weight,
                                 n_rows, n_classes, ignore_index, dtype=torch.float32,
                                 config=spec.SMALL_CONFIG,
                                 options=(("WEIGHTED", int(weight is not None)),))
        return scales
    return _reduction_scales_torch(target, ignore_index, weight)


def _reduction_scales_torch(target, ignore_index, weight):
    valid = target != ignore_index
    n_valid = valid.sum(dtype=torch.float32)
    if weight is None:
        denom = n_valid
        w_sum = torch.zeros((), dtype=torch.float32, device=target.device)
    else:
        safe = target.clamp(0, max(weight.shape[0] - 1, 0))  # ignored / bad targets: any class
        denom = torch.where(valid, weight.gather(0, safe), 0.0).sum(dtype=torch.float32)
        w_sum = weight.sum(dtype=torch.float32)
    return torch.cat((torch.stack((denom, n_valid)).reciprocal(), w_sum[None]))


def needs_scales(reduction, return_acc, weight, label_smoothing) -> bool:
    return reduction == "mean" or return_acc or (weight is not None and label_smoothing != 0.0)


def row_buffers(target, device, ignore_index, reduction, weight, label_smoothing,
                lse_square_scale, return_z, return_acc):
    """What the row kernel needs besides the logits, for target's rows: (target contiguous,
    SCALES or None, whether the z-loss rows are stored, the loss / z-loss / accuracy row
    buffers, fp32 on `device`, None where not stored)."""
    target = target.contiguous()
    n_rows = target.shape[0]
    store_z = return_z or lse_square_scale != 0.0
    scales = reduction_scales(target, ignore_index, weight) \
        if needs_scales(reduction, return_acc, weight, label_smoothing) else None
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=device)
    z_rows = torch.empty(n_rows, dtype=torch.float32, device=device) if store_z else None
    acc_rows = torch.empty(n_rows, dtype=torch.float32, device=device) if return_acc else None
    return target, scales, store_z, loss_rows, z_rows, acc_rows


def check_options(ignore_index, reduction, label_smoothing, lse_square_scale, softcap,
                  return_z_loss, return_token_accuracy):
    """Validates the options shared with fused linear cross entropy; returns them normalized
    as (ignore_index, reduction, label_smoothing, lse_square_scale, softcap (0.0 = none))."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    lse_square_scale = float(lse_square_scale)
    if lse_square_scale != lse_square_scale or abs(lse_square_scale) == float("inf"):
        raise ValueError(f"lse_square_scale must be finite, got {lse_square_scale}")
    if softcap is None:
        softcap = 0.0
    else:
        softcap = float(softcap)
        if not 0.0 < softcap < float("inf"):
            raise ValueError(f"softcap must be None or a finite number > 0, got {softcap}")
    for name, value in (("return_z_loss", return_z_loss),
                        ("return_token_accuracy", return_token_accuracy)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    return int(ignore_index), reduction, label_smoothing, lse_square_scale, softcap


def check_class_weight(name: str, weight, n_classes: int, device) -> Optional[torch.Tensor]:
    """None, or the class weights as a contiguous float32 (V,) tensor."""
    if weight is None:
        return None
    check_tensor(name, weight)
    if not weight.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got {weight.dtype}")
    if weight.dim() != 1 or weight.shape[0] != n_classes:
        raise ValueError(f"{name} must have shape ({n_classes},) (one weight per class), "
                         f"got {tuple(weight.shape)}")
    if weight.device != device:
        raise ValueError(f"tensors must be on one device, got {name} on {weight.device}, "
                         f"logits on {device}")
    return weight.detach().to(torch.float32).contiguous()


def launch_rows(loss_rows, z_rows, acc_rows, grad, logits, target, weight, scales, row_scale,
                ignore_index, label_smoothing, lse_square_scale, softcap, flags):
    """One kernel launch over the rows of logits (n_rows, V), last dim contiguous. grad may
    be logits itself (in place) or None (FLAG_GRAD unset); optional pointers may be None."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    dummy = loss_rows  # never dereferenced: its flag is off or its load is masked
    stride_logits = logits.stride(0) if n_rows > 1 else n_cols
    stride_grad = grad.stride(0) if grad is not None and n_rows > 1 else n_cols
    grad = logits if grad is None else grad
    z_rows = dummy if z_rows is None else z_rows
    scales = dummy if scales is None else scales
    row_scale = dummy if row_scale is None else row_scale
    if staged_applies(logits, flags, (loss_rows, z_rows, grad, target, scales, row_scale),
                      (n_cols, stride_grad, stride_logits), ignore_index):
        device = logits.get_device()
        split, programs = spec.staged_grid(n_rows, n_cols, multiprocessor_count(device))
        stats = torch.zeros(n_rows * split * 2, dtype=torch.int64, device=logits.device)
        _staged.launch((programs,), loss_rows, z_rows, grad, logits, target, scales, row_scale,
                       stats, n_rows, n_cols, stride_grad, stride_logits, ignore_index,
                       label_smoothing, lse_square_scale, flags, dtype=logits.dtype,
                       config=spec.STAGED_CONFIG)
        return
    features = 1 if flags & spec.FULL_FEATURE_FLAGS else 0
    config = spec.select_config(n_rows, n_cols, multiprocessor_count(logits.get_device()),
                                grad=(flags & spec.FLAG_GRAD) != 0)
    _fwd.launch((n_rows,), loss_rows, z_rows, dummy if acc_rows is None else acc_rows, grad,
                logits, target, dummy if weight is None else weight, scales, row_scale,
                n_cols, stride_grad, stride_logits, ignore_index, label_smoothing,
                lse_square_scale, softcap if softcap else 1.0, flags,
                dtype=logits.dtype, config=config, options=(("FEATURES", features),))


def staged_applies(logits, flags, tensors, ints, ignore_index) -> bool:
    """Whether the staged kernel takes this launch: a gradient to write (the loss alone is
    one read for either kernel, and the two-pass one is faster at it: 0.69 against 0.95 ms at
    8192 x 128256 on an H200), a GPU whose arch it is built for (spec.STAGED_ARCHS), 2-byte
    logits, rows of spec.STAGED_MIN_COLS to STAGED_MAX_COLS, none of the flags it does not
    implement, and the aligned class (every pointer in `tensors` 16-byte aligned, every int
    in `ints` a multiple of 16: its copies are 16-byte vectors). Its strides (in `ints`) and
    ignore_index are 32-bit."""
    if not flags & spec.FLAG_GRAD or flags & ~spec.STAGED_FLAGS:
        return False
    if not -2**31 <= ignore_index < 2**31 or max(ints) >= 2**31:
        return False
    if logits.dtype not in _STAGED_DTYPES:
        return False
    if not spec.STAGED_MIN_COLS <= logits.shape[1] <= spec.STAGED_MAX_COLS:
        return False
    device = logits.get_device()
    if device < 0 or not _staged_device(device):
        return False
    return aligned16(tensors, ints)


def _staged_device(device: int) -> bool:
    return device_runs(_staged_devices, device, spec.STAGED_ARCHS, staged_cross_entropy)


def kernel_flags(*, grad=False, mean=False, weight=False, softcap=False, z=False,
                 accuracy=False, token_scaling=False, row_scale=False) -> int:
    return ((spec.FLAG_GRAD if grad else 0) | (spec.FLAG_MEAN if mean else 0)
            | (spec.FLAG_WEIGHT if weight else 0) | (spec.FLAG_SOFTCAP if softcap else 0)
            | (spec.FLAG_Z if z else 0) | (spec.FLAG_ACCURACY if accuracy else 0)
            | (spec.FLAG_TOKEN_SCALING if token_scaling else 0)
            | (spec.FLAG_ROW_SCALE if row_scale else 0))


def reduce_rows(loss_rows, z_rows, acc_rows, reduction, scales):
    """Per-row pieces -> (loss, z_loss or None, token_accuracy or None), on the device. The
    z-loss is part of the loss; token accuracy is a mean over non-ignored rows unless
    reduction is "none". One kernel for up to spec.SMALL_MAX_ROWS rows (kernels.py:
    reduce_loss_rows), else torch's reductions."""
    if reduction == "none":
        loss = loss_rows if z_rows is None else loss_rows + z_rows
        return loss, z_rows, acc_rows
    n_rows = loss_rows.shape[0]
    if n_rows > spec.SMALL_MAX_ROWS:
        return _reduce_rows_torch(loss_rows, z_rows, acc_rows, reduction, scales)
    loss = torch.empty((), dtype=torch.float32, device=loss_rows.device)
    z = None if z_rows is None else torch.empty_like(loss)
    acc = None if acc_rows is None else torch.empty_like(loss)
    flags = ((spec.REDUCE_MEAN if reduction == "mean" else 0)
             | (0 if z is None else spec.REDUCE_Z) | (0 if acc is None else spec.REDUCE_ACC))
    _reduce_rows.launch((1,), loss, loss if z is None else z, loss if acc is None else acc,
                        loss_rows, loss_rows if z_rows is None else z_rows,
                        loss_rows if acc_rows is None else acc_rows,
                        loss_rows if scales is None else scales, n_rows, flags,
                        dtype=torch.float32, config=spec.SMALL_CONFIG)
    return loss, z, acc


def _reduce_rows_torch(loss_rows, z_rows, acc_rows, reduction, scales):
    if reduction == "sum":
        loss = loss_rows.sum()
        z = None if z_rows is None else z_rows.sum()
    else:
        loss = loss_rows.sum() * scales[0]
        z = None if z_rows is None else z_rows.sum() * scales[1]
    if z is not None:
        loss = loss + z
    acc = None if acc_rows is None else acc_rows.sum() * scales[1]
    return loss, z, acc


def scale_grad(grad: torch.Tensor, grad_output: torch.Tensor, per_row: bool,
               in_place: bool) -> torch.Tensor:
    """grad * grad_output (0-d, or (rows,) when per_row), in grad's dtype, computed in fp32
    by one copy-bound kernel that reads grad_output on the device (in place, a grad_output
    of 1 costs one launch and no memory traffic)."""
    if not grad.is_contiguous() or grad.numel() == 0:
        go = grad_output[:, None] if per_row else grad_output
        return grad.mul_(go) if in_place else torch.mul(grad, go, out=torch.empty_like(grad))
    out = grad if in_place else torch.empty_like(grad)
    go = grad_output.to(device=grad.device, dtype=torch.float32).contiguous()
    n = grad.numel()
    block = spec.SCALE_CONFIG.constexprs["BLOCK"]
    programs = min((n + block - 1) // block,
                   spec.SCALE_PROGRAMS_PER_SM * multiprocessor_count(grad.get_device()))
    _scale.launch((programs,), out, grad, go, n, grad.shape[-1] if per_row else 1,
                  int(per_row), int(in_place), dtype=grad.dtype, config=spec.SCALE_CONFIG)
    return out


# -- cross entropy ------------------------------------------------------------------------

def cross_entropy_forward(logits, target, weight, ignore_index, reduction, label_smoothing,
                          lse_square_scale, softcap, return_z, return_acc, need_grad,
                          grad_into=None):
    """logits (n_rows, V) with a contiguous last dim, target (n_rows,) int64, weight None or
    fp32 (V,). Returns (loss, z_loss or None, token_accuracy or None, grad or None); grad is
    the gradient of the reduced loss w.r.t. logits, in logits' dtype, written to grad_into
    when given (logits itself for in place)."""
    n_rows, n_cols = logits.shape
    target, scales, store_z, loss_rows, z_rows, acc_rows = row_buffers(
        target, logits.device, ignore_index, reduction, weight, label_smoothing,
        lse_square_scale, return_z, return_acc)
    grad = None
    if need_grad:
        grad = grad_into if grad_into is not None else \
            torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
    flags = kernel_flags(grad=need_grad, mean=reduction == "mean", weight=weight is not None,
                         softcap=softcap != 0.0, z=store_z, accuracy=return_acc)
    launch_rows(loss_rows, z_rows, acc_rows, grad, logits, target, weight, scales, None,
                ignore_index, label_smoothing, lse_square_scale, softcap, flags)
    loss, z, acc = reduce_rows(loss_rows, z_rows, acc_rows, reduction, scales)
    return loss, (z if return_z else None), acc, grad


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing,
                lse_square_scale, softcap, return_z, return_acc, need_grad, in_place):
        # need_grad and in_place come from the caller: inside forward grad mode is always
        # off, and ctx.needs_input_grad stays True under torch.no_grad()
        logits2 = last_dim_contiguous(logits)
        grad_into = None
        if need_grad:
            if logits2 is not logits:
                grad_into = logits2  # our own copy: free to overwrite
            elif in_place:
                grad_into = logits
                torch.autograd.graph.increment_version(logits)
        loss, z, acc, grad = cross_entropy_forward(
            logits2, target, weight, ignore_index, reduction, label_smoothing,
            lse_square_scale, softcap, return_z, return_acc, need_grad, grad_into)
        ctx.reduction = reduction
        if grad is not None:
            ctx.save_for_backward(grad)
        extras = [t for t in (z, acc) if t is not None]
        if extras:
            ctx.mark_non_differentiable(*extras)  # for logging: no gradient flows from them
        return loss, z, acc

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, _grad_z, _grad_acc):
        (grad,) = ctx.saved_tensors
        dlogits = scale_grad(grad, grad_output, ctx.reduction == "none",
                             in_place=not graph_retained())
        return (dlogits,) + (None,) * 11


# torch.compile path: the forward as a custom op, so dynamo traces a call as one node (no
# graph break) and autograd comes from register_autograd. Always out of place.
@lazy_custom_op("liger_aot::cross_entropy_fwd")
def cross_entropy_fwd_op(logits: torch.Tensor, target: torch.Tensor,
                         weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
                         label_smoothing: float, lse_square_scale: float, softcap: float,
                         return_z: bool, return_acc: bool, need_grad: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logits2 = last_dim_contiguous(logits)
    loss, z, acc, grad = cross_entropy_forward(
        logits2, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale,
        softcap, return_z, return_acc, need_grad,
        grad_into=logits2 if logits2 is not logits else None)
    if z is None:
        z = logits.new_empty(0, dtype=torch.float32)
    if acc is None:
        acc = logits.new_empty(0, dtype=torch.float32)
    if grad is None:
        grad = logits.new_empty(0)
    return loss, z, acc, grad


@cross_entropy_fwd_op.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale,
      softcap, return_z, return_acc, need_grad):
    shape = (logits.shape[0],) if reduction == "none" else ()
    f32 = torch.float32
    return (logits.new_empty(shape, dtype=f32),
            logits.new_empty(shape if return_z else (0,), dtype=f32),
            logits.new_empty(shape if return_acc else (0,), dtype=f32),
            logits.new_empty(tuple(logits.shape) if need_grad else (0,)))


def _setup_context(ctx, inputs, output):
    ctx.reduction = inputs[4]
    ctx.need_grad = inputs[10]
    ctx.save_for_backward(output[3])


def _backward(ctx, grad_output, _grad_z, _grad_acc, _grad_grad):
    (grad,) = ctx.saved_tensors
    dlogits = None
    if ctx.need_grad:
        go = grad_output[:, None] if ctx.reduction == "none" else grad_output
        dlogits = (grad * go).to(grad.dtype)
    return (dlogits,) + (None,) * 10


cross_entropy_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _check_logits_target(logits, target):
    check_float("logits", logits)
    check_tensor("target", target)
    check_same_device(logits=logits, target=target)
    if target.dtype != torch.int64:
        raise TypeError(f"target must be int64 (torch.long) class indices, got {target.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (n_rows, vocab), got shape {tuple(logits.shape)}")
    if target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"target must have shape ({logits.shape[0]},) to match logits "
                         f"{tuple(logits.shape)}, got {tuple(target.shape)}")
    if logits.shape[1] == 0 and logits.shape[0] > 0:
        raise ValueError("logits must have at least one class (vocab size is 0)")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, *,
                  weight: Optional[torch.Tensor] = None, lse_square_scale: float = 0.0,
                  softcap: Optional[float] = None, return_z_loss: bool = False,
                  return_token_accuracy: bool = False, in_place: bool = False):
    """Like torch.nn.functional.cross_entropy for logits (n_rows, V) and int64 class indices
    target (n_rows,), returning float32 (what PyTorch gives on float32-upcast logits), plus
    Liger-Kernel's options:

    weight: class weights (V,); "mean" divides by the sum of the weights of the non-ignored
        targets, as PyTorch (no gradient flows to weight).
    lse_square_scale: z-loss s * logsumexp(x)^2 added to each non-ignored row's loss
        (unweighted; "mean" divides it by the number of non-ignored rows).
    softcap: x -> softcap * tanh(x / softcap) before the softmax (derivative included).
    return_z_loss: also return the z-loss part (reduced like the loss; no gradient).
    return_token_accuracy: return a CrossEntropyOutput(loss, z_loss, token_accuracy), where
        token_accuracy is the fraction of non-ignored rows whose argmax is the target (per
        row for reduction "none"; no gradient).
    in_place: write the logits' gradient into the logits buffer (see the module docstring).

    Returns loss, or (loss, z_loss) with return_z_loss, or CrossEntropyOutput with
    return_token_accuracy. reduction "mean" over no non-ignored target is nan. Targets outside
    [0, V) other than ignore_index are not checked (checking would synchronize with the
    device) and give meaningless values."""
    _check_logits_target(logits, target)
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap = check_options(
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss,
        return_token_accuracy)
    weight = check_class_weight("weight", weight, logits.shape[1], logits.device)
    need_grad = logits.requires_grad and torch.is_grad_enabled()
    if torch.compiler.is_compiling():
        loss, z, acc, _ = cross_entropy_fwd_op(
            logits, target, weight, ignore_index, reduction, label_smoothing,
            lse_square_scale, softcap, return_z_loss, return_token_accuracy, need_grad)
        z = z if return_z_loss else None
        acc = acc if return_token_accuracy else None
    else:
        # a leaf is the caller's data; overlapping rows (stride 0) cannot hold a gradient
        in_place = (bool(in_place) and need_grad and logits.grad_fn is not None
                    and (logits.shape[0] <= 1 or logits.stride(0) >= logits.shape[1]))
        loss, z, acc = CrossEntropyFunction.apply(
            logits, target, weight, ignore_index, reduction, label_smoothing,
            lse_square_scale, softcap, return_z_loss, return_token_accuracy, need_grad,
            in_place)
    if return_token_accuracy:
        return CrossEntropyOutput(loss=loss, z_loss=z, token_accuracy=acc)
    if return_z_loss:
        return loss, z
    return loss


def liger_cross_entropy(input: torch.Tensor, target: torch.Tensor,
                        weight: Optional[torch.Tensor] = None, size_average=None,
                        ignore_index: int = -100, reduce=None, reduction: str = "mean",
                        label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                        softcap: Optional[float] = None, return_z_loss: bool = False,
                        return_token_accuracy: bool = False):
    """Liger-Kernel's functional signature (torch.nn.functional.cross_entropy's order plus
    the Liger options). size_average / reduce are PyTorch's deprecated spellings of
    reduction and are honoured like PyTorch does. See cross_entropy for the rest."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    return cross_entropy(input, target, ignore_index, reduction, label_smoothing,
                         weight=weight, lse_square_scale=lse_square_scale, softcap=softcap,
                         return_z_loss=return_z_loss,
                         return_token_accuracy=return_token_accuracy)
