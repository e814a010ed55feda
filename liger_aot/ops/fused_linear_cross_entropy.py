"""Fused linear cross entropy: CE(x @ W^T + b) without materializing the (tokens, V) logits.

Tokens are processed in chunks of rows (chunk_rows: a budget that grows with the hidden size,
CHUNK_BYTES of logits at most; or chunk_size rows).
Per chunk: logits = x_chunk @ W^T + b by cuBLAS in the input dtype; the cross entropy kernel
(kernel_src/cross_entropy) writes the loss and, in place over the chunk's logits, their
gradient; then grad_x[chunk] = grad_logits @ W and grad_W += grad_logits^T @ x_chunk,
grad_b += sum of grad_logits rows. The "mean" divisors (non-ignored targets of the whole
batch, or the sum of their class weights) are computed on the device before the first chunk
and read by the kernel, so nothing synchronizes with the host.

Reductions "mean" and "sum" compute every gradient in the forward (as Liger-Kernel does) and
keep them; backward multiplies them by grad_output, in place unless the graph is retained
(a grad_output of 1, plain `loss.backward()`, is detected on the device and costs nothing).
Reduction "none" cannot: grad_W mixes rows with different grad_output values. Its forward
computes only the loss and its backward recomputes the chunk logits and runs the kernel with
grad_output as a per-row scale.

accum_dtype: dtype of the grad_W / grad_b accumulators (default: the weight's dtype, as
Liger-Kernel); torch.float32 with bf16/fp16 weights keeps the sum over chunks in fp32. The
returned gradients have the parameters' dtypes.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from ._common import (check_float, check_same_device, check_same_dtype, check_tensor,
                      graph_retained, liger_chunk_rows)
from ._custom_ops import lazy_custom_op
from .cross_entropy import (CrossEntropyOutput, check_class_weight, check_options,
                            kernel_flags, launch_rows, needs_scales, reduce_rows,
                            reduction_scales, row_buffers, scale_grad)

# Chunk policy (chunk_rows). A chunk's logits, (C, V) in the input dtype, are the op's only
# memory beyond what Liger-Kernel's fused linear cross entropy also holds (grad_x (BT, H) and
# grad_W (V, H) in the weight's dtype, fp32 per-row losses; both return them to autograd
# as they are), and they are alive while the forward runs, i.e. at the training step's
# activation peak. Every chunk after the first read-modify-writes the (V, H) grad_W, so the
# fixed cost of a chunk is ~4*V*H bytes of traffic against 6*C*V*H flops of matmuls: on an
# H200 about 130/C of the op's time at any H and V (chunks of 4096 rows: 3%; 192 rows: ~70%).
#
# Rows per chunk, at most:
#   * H*H/HIDDEN_REF rows (the chunk's logits = the weight's bytes * H/4096). With a large
#     hidden size the step's weights and optimizer state dwarf one chunk (Llama-3-8B shapes,
#     4 layers: the step's peak is AdamW's, equal to Liger-Kernel's with 1 GiB chunks), and
#     8192 x 4096 -> 128256 needs its 2 x 4096 rows (38.9 ms fwd+bwd, 40.5 at 1024 rows);
#     with a small one the chunk sits on the activation peak (Qwen2.5-0.5B shapes, 8 x 2048
#     tokens: 1 GiB chunks put the step 0.83 GiB above Liger-Kernel's, the chunk being 0.93:
#     the step absorbs ~0.10 GiB; Gemma-2-2B shapes absorb ~0.72 GiB at H 2304). Balanced:
#     Qwen 86 x 192 rows (0.054 GiB; ~192-row chunks measured 115.7k tok/s against 130.5k at
#     1 GiB, Liger-Kernel 101.6k), Gemma-2 7 x 1184 (0.56 GiB), H 4096 2 x 4096 (0.98 GiB).
#     The term does not shrink with the token count: a small-H model stepping fewer tokens
#     absorbs less than Qwen's 16K (pass chunk_size there);
#   * never fewer than Liger-Kernel's own chunk (next power of 2 of BT / ceil(V / H), about
#     x's bytes of logits) or MIN_CHUNK_BYTES of logits: a smaller chunk saves nothing of
#     note and multiplies the grad_W passes;
#   * never more than CHUNK_BYTES of logits (the kernel benchmark's budget is 1.2 GB beyond
#     inputs, weights and gradients).
# `chunk_size` overrides the policy per call.
CHUNK_BYTES = 1 << 30
HIDDEN_REF = 4096
MIN_CHUNK_BYTES = 16 << 20

ACCUM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def chunk_rows(n_rows: int, n_cols: int, itemsize: int, chunk_size: int = 0, *,
               hidden: int = 0) -> int:
    """Rows per chunk of n_rows tokens against a vocabulary of n_cols, logits of itemsize
    bytes, hidden size `hidden`: chunk_size when > 0; else the fewest chunks within the
    policy above (hidden 0: CHUNK_BYTES only), balanced (8192 rows in two chunks of 4096, not
    4186 + 4006) and rounded to a multiple of 16 so per-row buffers stay 16-byte aligned at
    every chunk start."""
    if chunk_size > 0:
        return max(1, min(chunk_size, n_rows))
    row_bytes = max(1, n_cols * itemsize)
    cap = max(1, CHUNK_BYTES // row_bytes)
    if hidden > 0:
        budget = max(hidden * hidden // HIDDEN_REF, liger_chunk_rows(n_rows, hidden, n_cols),
                     MIN_CHUNK_BYTES // row_bytes)
        cap = max(1, min(cap, budget))
    if n_rows <= cap:
        return max(1, n_rows)
    if cap > 16:
        cap -= cap % 16
    chunks = -(-n_rows // cap)
    rows = -(-n_rows // chunks)
    if cap >= 16:
        rows = -(-rows // 16) * 16  # <= cap: rows <= cap and cap is a multiple of 16
    return rows


_mm_out_dtype_works = {}  # device type -> whether torch.mm/addmm take out_dtype there


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool):
    """acc = a @ b (first) or acc += a @ b, accumulated in acc's dtype."""
    if acc.dtype == a.dtype:
        if first:
            torch.mm(a, b, out=acc)
        else:
            acc.addmm_(a, b)
        return
    kind = a.device.type
    if _mm_out_dtype_works.get(kind, kind == "cuda"):
        # cuBLAS with an fp32 output and fp32 accumulation: no (V, H) temporary
        try:
            if first:
                torch.mm(a, b, out_dtype=acc.dtype, out=acc)
            else:
                torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
            _mm_out_dtype_works[kind] = True
            return
        except (RuntimeError, NotImplementedError, TypeError) as error:
            if isinstance(error, torch.OutOfMemoryError):
                raise
            _mm_out_dtype_works[kind] = False  # not supported: a dispatch error, no work done
    prod = torch.mm(a, b)  # one (V, H) temporary in the input dtype
    if first:
        acc.copy_(prod)
    else:
        acc.add_(prod)


def _chunk_logits(x_chunk, weight, bias):
    if bias is None:
        return torch.mm(x_chunk, weight.t())
    return torch.addmm(bias, x_chunk, weight.t())


def _chunk_grads(grad_logits, x_chunk, weight, dx_chunk, dw, db, first):
    if dx_chunk is not None:
        torch.mm(grad_logits, weight, out=dx_chunk)
    if dw is not None:
        _accumulate_mm(dw, grad_logits.t(), x_chunk, first)
    if db is not None:
        s = grad_logits.sum(0, dtype=db.dtype)
        if first:
            db.copy_(s)
        else:
            db.add_(s)


def _grad_buffers(n_rows, n_cols, hidden, x, weight, bias, accum_dtype, need_dx, need_dw,
                  need_db):
    device = x.device
    accum = accum_dtype or weight.dtype
    dx = torch.empty((n_rows, hidden), dtype=x.dtype, device=device) if need_dx else None
    dw = torch.empty((n_cols, hidden), dtype=accum, device=device) if need_dw else None
    db = torch.empty(n_cols, dtype=accum_dtype or bias.dtype, device=device) \
        if need_db else None
    if n_rows == 0:  # no chunk will write them
        dw = dw.zero_() if dw is not None else None
        db = db.zero_() if db is not None else None
    return dx, dw, db


def _finish_grads(dw, db, weight, bias):
    dw = dw.to(weight.dtype) if dw is not None else None
    db = db.to(bias.dtype) if db is not None else None
    return dw, db


def fused_linear_cross_entropy_forward(x, weight, target, bias, ce_weight, ignore_index,
                                       lse_square_scale, label_smoothing, reduction, softcap,
                                       return_z, return_acc, accum_dtype, token_scaling,
                                       need_dx, need_dw, need_db, chunk_size=0):
    """x (n_rows, H), weight (V, H), target (n_rows,) int64, bias None or (V,), ce_weight None
    or fp32 (V,). Returns (loss, z_loss or None, token_accuracy or None, dx, dw, db): the
    gradients of the reduced loss (None where not needed, and always None for "none")."""
    n_rows, hidden = x.shape
    n_cols = weight.shape[0]
    target, scales, store_z, loss_rows, z_rows, acc_rows = row_buffers(
        target, x.device, ignore_index, reduction, ce_weight, label_smoothing,
        lse_square_scale, return_z, return_acc)
    grads = reduction != "none" and (need_dx or need_dw or need_db)
    dx = dw = db = None
    if grads:
        dx, dw, db = _grad_buffers(n_rows, n_cols, hidden, x, weight, bias, accum_dtype,
                                   need_dx, need_dw, need_db)
    flags = kernel_flags(grad=grads, mean=reduction == "mean", weight=ce_weight is not None,
                         softcap=softcap != 0.0, z=store_z, accuracy=return_acc,
                         token_scaling=token_scaling)
    step = chunk_rows(n_rows, n_cols, x.element_size(), chunk_size, hidden=hidden)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        x_chunk = x[start:end]
        logits = _chunk_logits(x_chunk, weight, bias)
        launch_rows(loss_rows[start:end], z_rows[start:end] if store_z else None,
                    acc_rows[start:end] if return_acc else None, logits if grads else None,
                    logits, target[start:end], ce_weight, scales, None, ignore_index,
                    label_smoothing, lse_square_scale, softcap, flags)
        if grads:
            _chunk_grads(logits, x_chunk, weight, dx[start:end] if dx is not None else None,
                         dw, db, first=start == 0)
        del logits
    dw, db = _finish_grads(dw, db, weight, bias)
    loss, z, acc = reduce_rows(loss_rows, z_rows, acc_rows, reduction, scales)
    return loss, (z if return_z else None), acc, dx, dw, db


def fused_linear_cross_entropy_backward_none(grad_rows, x, weight, target, bias, ce_weight,
                                             ignore_index, lse_square_scale, label_smoothing,
                                             softcap, accum_dtype, token_scaling, need_dx,
                                             need_dw, need_db, chunk_size=0):
    """Reduction "none": recompute each chunk's logits and their gradient scaled per row by
    grad_rows (n_rows,). Returns (dx, dw, db), None where not needed."""
    n_rows, hidden = x.shape
    n_cols = weight.shape[0]
    target = target.contiguous()
    row_scale = grad_rows.reshape(-1).to(torch.float32).contiguous()
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)  # scratch
    scales = reduction_scales(target, ignore_index, ce_weight) \
        if needs_scales("none", False, ce_weight, label_smoothing) else None
    dx, dw, db = _grad_buffers(n_rows, n_cols, hidden, x, weight, bias, accum_dtype,
                               need_dx, need_dw, need_db)
    flags = kernel_flags(grad=True, weight=ce_weight is not None, softcap=softcap != 0.0,
                         token_scaling=token_scaling, row_scale=True)
    step = chunk_rows(n_rows, n_cols, x.element_size(), chunk_size, hidden=hidden)
    for start in range(0, n_rows, step):
        end = min(start + step, n_rows)
        x_chunk = x[start:end]
        logits = _chunk_logits(x_chunk, weight, bias)
        launch_rows(loss_rows[start:end], None, None, logits, logits, target[start:end],
                    ce_weight, scales, row_scale[start:end], ignore_index, label_smoothing,
                    lse_square_scale, softcap, flags)
        _chunk_grads(logits, x_chunk, weight, dx[start:end] if dx is not None else None,
                     dw, db, first=start == 0)
        del logits
    dw, db = _finish_grads(dw, db, weight, bias)
    return dx, dw, db


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
                label_smoothing, reduction, softcap, return_z, return_acc, accum_dtype,
                token_scaling, need_dx, need_dw, need_db, chunk_size):
        # x (n_rows, H), target (n_rows,): the functional flattened them
        loss, z, acc, dx, dw, db = fused_linear_cross_entropy_forward(
            x, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
            label_smoothing, reduction, softcap, return_z, return_acc, accum_dtype,
            token_scaling, need_dx, need_dw, need_db, chunk_size)
        ctx.reduction = reduction
        ctx.needs = (need_dx, need_dw, need_db)
        if reduction == "none":
            ctx.save_for_backward(x, weight, target, bias, ce_weight)
            ctx.options = (ignore_index, lse_square_scale, label_smoothing, softcap,
                           accum_dtype, token_scaling, chunk_size)
        else:
            ctx.save_for_backward(dx, dw, db)
        extras = [t for t in (z, acc) if t is not None]
        if extras:
            ctx.mark_non_differentiable(*extras)  # for logging: no gradient flows from them
        return loss, z, acc

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output, _grad_z, _grad_acc):
        need_dx, need_dw, need_db = ctx.needs
        if ctx.reduction == "none":
            x, weight, target, bias, ce_weight = ctx.saved_tensors
            (ignore_index, lse_square_scale, label_smoothing, softcap, accum_dtype,
             token_scaling, chunk_size) = ctx.options
            dx, dw, db = fused_linear_cross_entropy_backward_none(
                grad_output, x, weight, target, bias, ce_weight, ignore_index,
                lse_square_scale, label_smoothing, softcap, accum_dtype, token_scaling,
                need_dx, need_dw, need_db, chunk_size)
        else:
            in_place = not graph_retained()
            dx, dw, db = (None if g is None else scale_grad(g, grad_output, False, in_place)
                          for g in ctx.saved_tensors)
        return (dx, dw, None, db) + (None,) * 14


# torch.compile path: custom ops (one node each for dynamo), autograd via register_autograd.
@lazy_custom_op("liger_aot::fused_linear_cross_entropy_fwd")
def fused_linear_cross_entropy_fwd_op(
        x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
        bias: Optional[torch.Tensor], ce_weight: Optional[torch.Tensor], ignore_index: int,
        lse_square_scale: float, label_smoothing: float, reduction: str, softcap: float,
        return_z: bool, return_acc: bool, accum_dtype: Optional[torch.dtype],
        token_scaling: bool, need_dx: bool, need_dw: bool, need_db: bool, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, z, acc, dx, dw, db = fused_linear_cross_entropy_forward(
        x, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
        reduction, softcap, return_z, return_acc, accum_dtype, token_scaling, need_dx,
        need_dw, need_db, chunk_size)
    f32 = torch.float32
    return (loss, z if z is not None else x.new_empty(0, dtype=f32),
            acc if acc is not None else x.new_empty(0, dtype=f32),
            dx if dx is not None else x.new_empty(0),
            dw if dw is not None else weight.new_empty(0),
            db if db is not None else weight.new_empty(0))


@fused_linear_cross_entropy_fwd_op.register_fake
def _(x, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
      reduction, softcap, return_z, return_acc, accum_dtype, token_scaling, need_dx, need_dw,
      need_db, chunk_size):
    shape = (x.shape[0],) if reduction == "none" else ()
    grads = reduction != "none"
    f32 = torch.float32
    return (x.new_empty(shape, dtype=f32),
            x.new_empty(shape if return_z else (0,), dtype=f32),
            x.new_empty(shape if return_acc else (0,), dtype=f32),
            x.new_empty(tuple(x.shape) if grads and need_dx else (0,)),
            weight.new_empty(tuple(weight.shape) if grads and need_dw else (0,)),
            (bias if bias is not None else weight).new_empty(
                (weight.shape[0],) if grads and need_db else (0,)))


@lazy_custom_op("liger_aot::fused_linear_cross_entropy_bwd")
def fused_linear_cross_entropy_bwd_op(
        grad_rows: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
        bias: Optional[torch.Tensor], ce_weight: Optional[torch.Tensor], ignore_index: int,
        lse_square_scale: float, label_smoothing: float, softcap: float,
        accum_dtype: Optional[torch.dtype], token_scaling: bool, need_dx: bool, need_dw: bool,
        need_db: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = fused_linear_cross_entropy_backward_none(
        grad_rows, x, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
        label_smoothing, softcap, accum_dtype, token_scaling, need_dx, need_dw, need_db,
        chunk_size)
    return (dx if dx is not None else x.new_empty(0),
            dw if dw is not None else weight.new_empty(0),
            db if db is not None else weight.new_empty(0))


@fused_linear_cross_entropy_bwd_op.register_fake
def _(grad_rows, x, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
      label_smoothing, softcap, accum_dtype, token_scaling, need_dx, need_dw, need_db,
      chunk_size):
    return (x.new_empty(tuple(x.shape) if need_dx else (0,)),
            weight.new_empty(tuple(weight.shape) if need_dw else (0,)),
            (bias if bias is not None else weight).new_empty(
                (weight.shape[0],) if need_db else (0,)))


def _setup_context(ctx, inputs, output):
    (x, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing,
     reduction, softcap, _, _, accum_dtype, token_scaling, need_dx, need_dw, need_db,
     chunk_size) = inputs
    ctx.reduction = reduction
    ctx.needs = (need_dx, need_dw, need_db)
    if reduction == "none":
        ctx.save_for_backward(x, weight, target, bias, ce_weight)
        ctx.options = (ignore_index, lse_square_scale, label_smoothing, softcap, accum_dtype,
                       token_scaling, chunk_size)
    else:
        ctx.save_for_backward(output[3], output[4], output[5])


def _backward(ctx, grad_output, *_unused):
    need_dx, need_dw, need_db = ctx.needs
    if ctx.reduction == "none":
        x, weight, target, bias, ce_weight = ctx.saved_tensors
        dx, dw, db = fused_linear_cross_entropy_bwd_op(
            grad_output, x, weight, target, bias, ce_weight, *ctx.options[:4],
            ctx.options[4], ctx.options[5], need_dx, need_dw, need_db, ctx.options[6])
    else:
        dx, dw, db = (g * grad_output for g in ctx.saved_tensors)  # 0-d: keeps g's dtype
    return ((dx if need_dx else None), (dw if need_dw else None), None,
            (db if need_db else None)) + (None,) * 14


fused_linear_cross_entropy_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def _check_inputs(x, weight, target, bias, accum_dtype, chunk_size):
    check_float("input", x)
    check_float("weight", weight)
    check_tensor("target", target)
    if bias is not None:
        check_float("bias", bias)
    check_same_device(input=x, weight=weight, target=target, bias=bias)
    check_same_dtype(input=x, weight=weight, bias=bias)
    if target.dtype != torch.int64:
        raise TypeError(f"target must be int64 (torch.long) class indices, got {target.dtype}")
    if x.dim() < 1:
        raise ValueError("input must have at least one dimension (..., hidden)")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must have shape (vocab, {x.shape[-1]}) to match input's "
                         f"last dimension, got {tuple(weight.shape)}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"target must have shape {tuple(x.shape[:-1])} (input's leading "
                         f"dimensions), got {tuple(target.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if weight.shape[0] == 0 and target.numel() > 0:
        raise ValueError("weight must have at least one row (vocab size is 0)")
    if accum_dtype is not None and accum_dtype not in ACCUM_DTYPES:
        raise ValueError(f"accum_dtype must be None or one of {ACCUM_DTYPES}, got "
                         f"{accum_dtype!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool)
                                   or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")


def fused_linear_cross_entropy(input: torch.Tensor, weight: torch.Tensor,
                               target: torch.Tensor, bias: Optional[torch.Tensor] = None,
                               ce_weight: Optional[torch.Tensor] = None,
                               ignore_index: int = -100, lse_square_scale: float = 0.0,
                               label_smoothing: float = 0.0, reduction: str = "mean",
                               softcap: Optional[float] = None, return_z_loss: bool = False,
                               accum_dtype: Optional[torch.dtype] = None,
                               use_token_scaling: bool = False,
                               return_token_accuracy: bool = False, *,
                               chunk_size: Optional[int] = None):
    """Cross entropy of logits = input @ weight^T + bias, never materialized in full.

    input (..., H) and target (...) int64 (flattened to rows), weight (V, H), bias (V,), all
    of input's dtype. ce_weight: class weights (V,). The CE options are those of
    liger_aot.ops.cross_entropy.cross_entropy (z-loss via lse_square_scale, softcap, label
    smoothing, ignore_index, reduction); use_token_scaling multiplies each row's loss (and
    gradient) by its detached predicted probability of the target, as Liger-Kernel.
    accum_dtype: grad_W / grad_b accumulation dtype (None: the weight's). chunk_size: rows
    per chunk (None: chunk_rows' policy, see the module). Returns loss (float32; shape of
    target for reduction "none"), or (loss, z_loss) with return_z_loss, or CrossEntropyOutput
    with return_token_accuracy.

    Under torch.autocast, input, weight and bias are cast to the autocast dtype first (as
    F.linear would be), so fp32 master weights with bf16 activations work; gradients flow
    back through the casts in the parameters' dtypes."""
    device_type = input.device.type if isinstance(input, torch.Tensor) else "cpu"
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        check_float("input", input)
        check_float("weight", weight)
        if bias is not None:
            check_float("bias", bias)
        with torch.autocast(device_type, enabled=False):
            return fused_linear_cross_entropy(
                input.to(dtype), weight.to(dtype), target,
                None if bias is None else bias.to(dtype), ce_weight, ignore_index,
                lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
                accum_dtype, use_token_scaling, return_token_accuracy, chunk_size=chunk_size)
    _check_inputs(input, weight, target, bias, accum_dtype, chunk_size)
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap = check_options(
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss,
        return_token_accuracy)
    if not isinstance(use_token_scaling, bool):
        raise TypeError(f"use_token_scaling must be a bool, got {use_token_scaling!r}")
    ce_weight = check_class_weight("ce_weight", ce_weight, weight.shape[0], input.device)
    grad_mode = torch.is_grad_enabled()
    need_dx = grad_mode and input.requires_grad
    need_dw = grad_mode and weight.requires_grad
    need_db = grad_mode and bias is not None and bias.requires_grad
    x2 = input.reshape(-1, input.shape[-1])
    t1 = target.reshape(-1)
    args = (ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
            return_token_accuracy, accum_dtype, use_token_scaling, need_dx, need_dw, need_db,
            chunk_size or 0)
    if torch.compiler.is_compiling():
        loss, z, acc, _, _, _ = fused_linear_cross_entropy_fwd_op(x2, weight, t1, bias,
                                                                  ce_weight, *args)
        z = z if return_z_loss else None
        acc = acc if return_token_accuracy else None
    else:
        loss, z, acc = FusedLinearCrossEntropyFunction.apply(x2, weight, t1, bias, ce_weight,
                                                             *args)
    if reduction == "none":
        loss = loss.view(target.shape)
        z = z.view(target.shape) if z is not None else None
        acc = acc.view(target.shape) if acc is not None else None
    if return_token_accuracy:
        return CrossEntropyOutput(loss=loss, z_loss=z, token_accuracy=acc)
    if return_z_loss:
        return loss, z
    return loss


liger_fused_linear_cross_entropy = fused_linear_cross_entropy
