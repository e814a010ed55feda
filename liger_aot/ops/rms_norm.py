"""RMSNorm: y = x / rms(x) * (offset + w), forward and backward on AOT kernels; and the fused
residual add + RMSNorm (s = x + residual; returns (rmsnorm(s), s)) on the same kernels."""
from __future__ import annotations

import math
from typing import Optional

import torch

from liger_aot.kernel_src.rms_norm import spec
from liger_aot.kernel_src.spec import grouped_grid
from liger_aot.runtime import Kernel
from liger_aot.runtime._env import grouped_norm_backward, grouped_norm_forward

from ._common import (backward_follows, block_grid, check_float, check_same_device,
                      check_same_dtype, check_same_shape, grouped_backward_applies,
                      grouped_backward_buffers, grouped_layout_applies, multiprocessor_count,
                      norm_backward_grid, row_stride, rows_view, unused_stats,
                      weight_grad_buffers)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_fwd_grouped = Kernel(spec.FWD_GROUPED)
_grouped_fwd_devices = {}  # device index -> whether its arch runs the grouped forward
_bwd_grouped = Kernel(spec.BWD_GROUPED)
_grouped_devices = {}  # device index -> whether its arch runs the grouped backward
_bwd = Kernel(spec.BWD)


def _casting(mode) -> int:
    if isinstance(mode, int) and not isinstance(mode, bool) \
            and mode in spec.CASTING_MODES.values():
        return mode
    try:
        return spec.CASTING_MODES[mode]
    except (KeyError, TypeError):
        raise ValueError(f"casting_mode must be one of {sorted(spec.CASTING_MODES)}, "
                         f"got {mode!r}") from None


def _rows(x):
    """Number of rows of x viewed as (rows, x.shape[-1])."""
    return math.prod(x.shape[:-1])


def _forward(x, weight, eps, offset, casting, residual=None, stats=True):
    """x (and residual): (..., n). Returns (y as rows, s as rows, rstd (rows,) fp32) where s is
    the normalized input: x itself, or the new tensor x + residual. stats False (a forward no
    backward follows): rstd may be None, not written by the kernel."""
    n = x.shape[-1]
    x2 = rows_view("x", x, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if residual is None:
        s, r2, has_residual = y, x2, 0  # placeholders, never touched
    else:
        r2 = rows_view("residual", residual, n)
        s = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        has_residual = 1
    grouped = bool(rows and n) and grouped_forward_applies(
        x2, weight, None if residual is None else r2)
    rstd = None
    if stats or grouped:  # the grouped forward always writes it (1 row in 16K+ columns)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if grouped:
        _grouped_forward(y, s, rstd, x2, r2, weight, eps, offset, casting, has_residual)
    elif rows and n:
        device = x2.get_device()
        config = _fwd.select_config(device, n, residual is not None, dtype=x.dtype)
        _fwd.launch(block_grid(rows, device, config), y, x2, weight,
                    rstd if stats else unused_stats(x.device), rows, n,
                    row_stride(y), row_stride(x2), float(eps), float(offset),
                    s, r2, row_stride(s), row_stride(r2), has_residual, int(stats),
                    dtype=x.dtype, config=config, options=(("CASTING", casting),))
    elif has_residual:
        torch.add(x2, r2, out=s)  # no columns: s is empty; rows without columns: same
    return y, (x2 if residual is None else s), rstd


def grouped_forward_applies(x2, weight, r2=None) -> bool:
    """Whether the grouped forward (kernels.py: rms_norm_fwd_grouped, each row read once)
    takes an RMSNorm forward, or with the residual r2 the fused add's: rows from
    GROUPED_FWD_MIN_COLS (GROUPED_FWD_RES_MIN_COLS), see _common.grouped_layout_applies."""
    if weight.dtype != x2.dtype:
        return False
    min_cols, row_tensors = ((spec.GROUPED_FWD_MIN_COLS, (x2,)) if r2 is None
                             else (spec.GROUPED_FWD_RES_MIN_COLS, (x2, r2)))
    return grouped_layout_applies(spec, min_cols, _grouped_fwd_devices, grouped_norm_forward,
                                  row_tensors, (weight,))


def _grouped_forward(y, s, rstd, x2, r2, weight, eps, offset, casting, has_residual):
    """y, rstd (and s = x + r) of the rows x2 through rms_norm_fwd_grouped; without the
    residual, s and r2 are placeholders the kernel never touches."""
    rows, n = x2.shape
    device = x2.get_device()
    config = _fwd_grouped.select_config(device, bool(has_residual))
    split, programs = grouped_grid(rows, n, multiprocessor_count(device), config)
    words = torch.zeros(rows * split, dtype=torch.int64, device=x2.device)
    _fwd_grouped.launch((programs,), y, rstd, words, x2, weight, rows, n, row_stride(y),
                        row_stride(x2), float(eps), float(offset), s, r2, row_stride(s),
                        row_stride(r2), dtype=x2.dtype, config=config,
                        options=(("CASTING", casting),))


def _backward(dy, s2, weight, rstd, offset, casting, dres=None, in_place=False,
              need_dw=True):
    """Gradients of rmsnorm(s): (ds as rows [+ dres], dw or None). With in_place, ds is
    written into dy's buffer when dy is a dense tensor of s's dtype not shared with dres,
    and the config is not interleaved (rows over 16K columns by the rule)."""
    rows, n = s2.shape
    dy2 = rows_view("grad_output", dy, n)
    if dy2.dtype != s2.dtype:
        dy2 = dy2.to(s2.dtype)
    has_dres = dres is not None
    if has_dres:
        dres2 = rows_view("grad_residual", dres, n)
        if dres2.dtype != s2.dtype:
            dres2 = dres2.to(s2.dtype)
    else:
        dres2 = dy2  # placeholder, never read
    shared = has_dres and dres2.data_ptr() == dy2.data_ptr()
    device = s2.get_device()
    grouped_dres = dres2 if has_dres else None
    if grouped_applies(dy2, s2, weight, rstd, grouped_dres):
        return _grouped_backward(dy2, s2, weight, rstd, offset, casting,
                                 in_place and not shared, need_dw, grouped_dres)
    config = _bwd.select_config(device, n, has_dres, dtype=s2.dtype)
    # the interleaved layout's column programs read dy after row programs wrote dx
    interleaved = config.constexprs["CHUNK_ROWS"] > 0
    if in_place and dy2.is_contiguous() and not shared and not interleaved:
        dx = dy2
    else:
        dx = torch.empty((rows, n), dtype=s2.dtype, device=s2.device)
    grid = norm_backward_grid(rows, n, device, config, spec.SUM_BLOCK_N)
    (dw_sum,), (dw,), sync, atomic = weight_grad_buffers(config, rows, n, grid, 1,
                                                         s2.dtype, s2.device, dx)
    if rows and n:
        _bwd.launch((grid.programs,), dx, dw_sum, dy2, s2, weight, rstd, rows, n,
                    row_stride(dx), row_stride(dy2), row_stride(s2), float(offset),
                    grid.rows_per_program, dres2, row_stride(dres2), int(has_dres), dw, sync,
                    atomic, dtype=s2.dtype, config=config, options=(("CASTING", casting),))
    elif has_dres:
        dx.copy_(dres2)
    if not need_dw:
        return dx, None
    if atomic:
        return dx, dw
    return dx, dw_sum.sum(0).to(weight.dtype) if rows else torch.zeros_like(weight)


def grouped_applies(dy2, s2, weight, rstd, dres2=None) -> bool:
    """Whether the grouped backward (kernels.py: rms_norm_bwd_grouped, each row read once)
    takes an RMSNorm backward, with the fused add's residual gradient dres2 or without (see
    _common.grouped_backward_applies)."""
    return weight.dtype == s2.dtype and grouped_backward_applies(
        spec, _grouped_devices, grouped_norm_backward, s2, dy2, (weight, rstd),
        () if dres2 is None else (dres2,))


def _grouped_backward(dy2, s2, weight, rstd, offset, casting, in_place, need_dw, dres2):
    rows, n = s2.shape
    dx = dy2 if in_place and dy2.is_contiguous() else torch.empty_like(s2)
    config = _bwd_grouped.select_config(s2.get_device(), dres2 is not None)
    split, programs = grouped_grid(rows, n, multiprocessor_count(s2.get_device()), config)
    (dw_sum,), sync, words = grouped_backward_buffers(rows, n, split, 1, s2.device)
    dw = torch.empty(n, dtype=weight.dtype, device=s2.device)
    dres2 = dy2 if dres2 is None else dres2  # placeholder, never read without HAS_DRES
    _bwd_grouped.launch((programs,), dx, dw_sum, dw, sync, words, dy2, s2, weight, rstd, rows,
                        n, row_stride(dx), row_stride(dy2), row_stride(s2), float(offset),
                        dres2, row_stride(dres2), dtype=s2.dtype, config=config,
                        options=(("CASTING", casting),))
    return dx, (dw if need_dw else None)


# Kept for callers of the first API: (y with x's shape, x as rows, rstd) and (dx, dw).
def rms_norm_forward(x, weight, eps, offset, casting):
    y, x2, rstd = _forward(x, weight, eps, offset, casting)
    return y.view(x.shape), x2, rstd


def rms_norm_backward(dy, x2, weight, rstd, offset, casting, in_place=False):
    return _backward(dy, x2, weight, rstd, offset, casting, in_place=in_place)


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting, in_place=False):
        y, x2, rstd = _forward(x, weight, eps, offset, casting)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.offset, ctx.casting, ctx.x_shape, ctx.in_place = offset, casting, x.shape, in_place
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, x2, weight, rstd, ctx.offset, ctx.casting,
                           in_place=ctx.in_place, need_dw=ctx.needs_input_grad[1])
        return dx.view(ctx.x_shape), dw, None, None, None, None


class FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, casting, in_place=False):
        y, s2, rstd = _forward(x, weight, eps, offset, casting, residual)
        ctx.save_for_backward(s2, weight, rstd)
        ctx.offset, ctx.casting, ctx.x_shape, ctx.in_place = offset, casting, x.shape, in_place
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        return y.view(x.shape), s2.view(x.shape)

    @staticmethod
    def backward(ctx, dy, ds):
        s2, weight, rstd = ctx.saved_tensors
        if dy is None:  # only the residual output was used: it passes ds through
            if ds is None:
                return None, None, None, None, None, None, None
            dw = torch.zeros_like(weight) if ctx.needs_input_grad[2] else None
            return ds, ds, dw, None, None, None, None
        dx, dw = _backward(dy, s2, weight, rstd, ctx.offset, ctx.casting, dres=ds,
                           in_place=ctx.in_place, need_dw=ctx.needs_input_grad[2])
        dx = dx.view(ctx.x_shape)
        return dx, dx, dw, None, None, None, None  # d(x + residual) reaches both equally


# torch.compile path: the same forward/backward as custom ops, so dynamo traces a call as
# one node (no graph break) and autograd comes from register_autograd. Eager calls use the
# autograd.Functions above, which cost less host time than custom-op dispatch. The compile
# path never writes into a gradient's buffer (custom ops do not mutate their inputs):
# in_place only applies to eager calls.
@lazy_custom_op("liger_aot::rms_norm_fwd")
def rms_norm_fwd_op(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float,
                    casting: int) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = _forward(x, weight, eps, offset, casting)
    return y.view(x.shape), rstd


@rms_norm_fwd_op.register_fake
def _(x, weight, eps, offset, casting):
    return torch.empty_like(x), x.new_empty(_rows(x), dtype=torch.float32)


@lazy_custom_op("liger_aot::rms_norm_bwd")
def rms_norm_bwd_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                    offset: float, casting: int) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = _backward(dy, rows_view("x", x, x.shape[-1]), weight, rstd, offset, casting)
    return dx.view(x.shape), dw


@rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd, offset, casting):
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, _, offset, casting = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset, ctx.casting = offset, casting


def _backward_op(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd_op(dy, x, weight, rstd, ctx.offset, ctx.casting)
    return dx, dw, None, None, None


rms_norm_fwd_op.register_autograd(_backward_op, setup_context=_setup_context)


@lazy_custom_op("liger_aot::fused_add_rms_norm_fwd")
def fused_add_rms_norm_fwd_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                              eps: float, offset: float, casting: int
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, s2, rstd = _forward(x, weight, eps, offset, casting, residual)
    return y.view(x.shape), s2.view(x.shape), rstd


@fused_add_rms_norm_fwd_op.register_fake
def _(x, residual, weight, eps, offset, casting):
    return (torch.empty_like(x), torch.empty_like(x),
            x.new_empty(_rows(x), dtype=torch.float32))


@lazy_custom_op("liger_aot::fused_add_rms_norm_bwd")
def fused_add_rms_norm_bwd_op(dy: torch.Tensor, ds: Optional[torch.Tensor], s: torch.Tensor,
                              weight: torch.Tensor, rstd: torch.Tensor, offset: float,
                              casting: int) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = _backward(dy, rows_view("s", s, s.shape[-1]), weight, rstd, offset, casting,
                       dres=ds)
    return dx.view(s.shape), dw


@fused_add_rms_norm_bwd_op.register_fake
def _(dy, ds, s, weight, rstd, offset, casting):
    return torch.empty_like(s), torch.empty_like(weight)


def _fused_setup_context(ctx, inputs, output):
    _, _, weight, _, offset, casting = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.offset, ctx.casting = offset, casting


def _fused_backward_op(ctx, dy, ds, _drstd):
    s, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(s)
    dx, dw = fused_add_rms_norm_bwd_op(dy, ds, s, weight, rstd, ctx.offset, ctx.casting)
    return dx, dx, dw, None, None, None


fused_add_rms_norm_fwd_op.register_autograd(_fused_backward_op,
                                            setup_context=_fused_setup_context)


def _check_weight(x, weight):
    check_float("x", x)
    check_float("weight", weight)
    check_same_device(x=x, weight=weight)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last "
                         f"dimension, got {tuple(weight.shape)}")
    # Kernels read the weight in x's dtype: a weight of another dtype (fp32 master weights
    # with bf16 activations) is cast here, and its gradient cast back by autograd.
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    if not weight.is_contiguous():
        weight = weight.contiguous()
    return weight


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0,
             casting_mode="llama", in_place: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension of x with weight (n,): x / sqrt(mean(x^2) + eps) *
    (offset + weight). casting_mode: llama | gemma | none (see kernel_src/rms_norm/kernels.py).

    in_place (Liger-Kernel's option): the backward writes dx into the buffer of y's gradient
    to save memory. Off by default here (Liger-Kernel's functional defaults to True, as does
    the module LigerRMSNorm): it overwrites a gradient tensor the caller passed to backward,
    and it is wrong when y's gradient is shared with another consumer, e.g. when y is added to
    a residual (`h = r + rms_norm(x)`: autograd hands the same gradient tensor to both
    branches). Eager only; torch.compile never writes in place, nor does the backward of
    rows over 16K columns (its interleaved layout reads the gradient after writing dx)."""
    weight = _check_weight(x, weight)
    casting = _casting(casting_mode)
    if torch.compiler.is_compiling():
        return rms_norm_fwd_op(x, weight, float(eps), float(offset), casting)[0]
    if not backward_follows(x, weight):
        return _forward(x, weight, eps, offset, casting, stats=False)[0].view(x.shape)
    return RMSNormFunction.apply(x, weight, eps, offset, casting, bool(in_place))


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6, offset: float = 0.0, casting_mode="llama",
                       in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """s = x + residual; returns (rms_norm(s, weight, eps, offset, casting_mode), s).

    The backward gives x and residual the same gradient (the residual output's gradient plus
    the RMSNorm's), and weight its own. in_place as for rms_norm (off by default; Liger-Kernel's
    functional defaults to True, its module LigerFusedAddRMSNorm to False)."""
    weight = _check_weight(x, weight)
    check_float("residual", residual)
    check_same_device(x=x, residual=residual)
    check_same_dtype(x=x, residual=residual)
    check_same_shape(x=x, residual=residual)
    casting = _casting(casting_mode)
    if torch.compiler.is_compiling():
        y, s, _ = fused_add_rms_norm_fwd_op(x, residual, weight, float(eps), float(offset),
                                            casting)
        return y, s
    if not backward_follows(x, residual, weight):
        y, s2, _ = _forward(x, weight, eps, offset, casting, residual, stats=False)
        return y.view(x.shape), s2.view(x.shape)
    return FusedAddRMSNormFunction.apply(x, residual, weight, eps, offset, casting,
                                         bool(in_place))
