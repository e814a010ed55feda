"""DyT (dynamic tanh, Zhu et al. 2025): y = gamma * tanh(alpha * x) + beta over the last
dimension; forward and backward on AOT kernels."""
from __future__ import annotations

from typing import Optional

import torch

from liger_aot.kernel_src.dyt import spec
from liger_aot.runtime import Kernel

from ._common import (check_float, check_same_device, param_vector, persistent_grid,
                      row_stride, rows_view)
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def dyt_forward(x, alpha, gamma, beta):
    """x: (..., n), alpha one element, gamma (n,), beta (n,) or None. Returns (y with x's
    shape, x as rows)."""
    n = x.shape[-1]
    x2 = rows_view("x", x, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows and n:
        config = _fwd.select_config(x2.get_device(), n)
        block_m = config.constexprs["BLOCK_M"]
        _fwd.launch(((rows + block_m - 1) // block_m, spec.col_blocks(n, config)), y, x2,
                    alpha, gamma, gamma if beta is None else beta, rows, n,
                    row_stride(y), row_stride(x2), int(beta is not None),
                    dtype=x.dtype, config=config)
    return y.view(x.shape), x2


def dyt_backward(dy, x2, alpha, gamma):
    """Returns (dx as rows, dalpha () fp32, dgamma (n,) fp32, dbeta (n,) fp32)."""
    rows, n = x2.shape
    dy2 = rows_view("grad_output", dy, n)
    if dy2.dtype != x2.dtype:
        dy2 = dy2.to(x2.dtype)
    dx = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    config = _bwd.select_config(x2.get_device(), n)
    blocks = spec.col_blocks(n, config) if n else 0
    programs = 0
    if rows and n:
        # about four programs per SM in all, split over the column blocks
        programs, rows_per_program = persistent_grid(rows, x2.get_device(), split=blocks)
    dgamma_partial = torch.empty((programs, n), dtype=torch.float32, device=x2.device)
    dbeta_partial = torch.empty((programs, n), dtype=torch.float32, device=x2.device)
    dalpha_partial = torch.empty((programs, blocks), dtype=torch.float32, device=x2.device)
    if programs:
        _bwd.launch((programs, blocks), dx, dgamma_partial, dbeta_partial, dalpha_partial,
                    dy2, x2, alpha, gamma, rows, n, row_stride(dx), row_stride(dy2),
                    row_stride(x2), rows_per_program, dtype=x2.dtype, config=config)
    return dx, dalpha_partial.sum(), dgamma_partial.sum(0), dbeta_partial.sum(0)


class DyTFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, gamma, beta):
        y, x2 = dyt_forward(x, alpha, gamma, beta)
        ctx.save_for_backward(x2, alpha, gamma)
        ctx.x_shape = x.shape
        ctx.has_beta = beta is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, alpha, gamma = ctx.saved_tensors
        dx, dalpha, dgamma, dbeta = dyt_backward(dy, x2, alpha, gamma)
        return (dx.view(ctx.x_shape), dalpha.reshape(alpha.shape).to(alpha.dtype),
                dgamma.to(gamma.dtype), dbeta.to(gamma.dtype) if ctx.has_beta else None)


# torch.compile path: custom ops traced as single nodes (see ops/rms_norm.py).
@lazy_custom_op("liger_aot::dyt_fwd")
def dyt_fwd_op(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
               beta: Optional[torch.Tensor]) -> torch.Tensor:
    return dyt_forward(x, alpha, gamma, beta)[0]


@dyt_fwd_op.register_fake
def _(x, alpha, gamma, beta):
    return torch.empty_like(x)


@lazy_custom_op("liger_aot::dyt_bwd")
def dyt_bwd_op(dy: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dalpha, dgamma, dbeta = dyt_backward(dy, rows_view("x", x, x.shape[-1]), alpha, gamma)
    return (dx.view(x.shape), dalpha.reshape(alpha.shape).to(alpha.dtype),
            dgamma.to(gamma.dtype), dbeta.to(gamma.dtype))


@dyt_bwd_op.register_fake
def _(dy, x, alpha, gamma):
    return (torch.empty_like(x), torch.empty_like(alpha), torch.empty_like(gamma),
            torch.empty_like(gamma))


def _setup_context(ctx, inputs, output):
    x, alpha, gamma, beta = inputs
    ctx.save_for_backward(x, alpha, gamma)
    ctx.has_beta = beta is not None


def _backward_op(ctx, dy):
    x, alpha, gamma = ctx.saved_tensors
    dx, dalpha, dgamma, dbeta = dyt_bwd_op(dy, x, alpha, gamma)
    return dx, dalpha, dgamma, (dbeta if ctx.has_beta else None)


dyt_fwd_op.register_autograd(_backward_op, setup_context=_setup_context)


def dyt(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor,
        beta: Optional[torch.Tensor] = None) -> torch.Tensor:
    """gamma * tanh(alpha * x) + beta over the last dimension of x: alpha one element (shape
    (1,) or ()), gamma (n,), beta (n,) or None."""
    check_float("x", x)
    check_float("alpha", alpha)
    check_same_device(x=x, alpha=alpha)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension, got a 0-d tensor")
    n = x.shape[-1]
    if alpha.numel() != 1:
        raise ValueError(f"alpha must have one element, got shape {tuple(alpha.shape)}")
    gamma = param_vector("gamma", gamma, x, n)
    beta = param_vector("beta", beta, x, n, optional=True)
    if alpha.dtype != x.dtype:
        alpha = alpha.to(x.dtype)
    if torch.compiler.is_compiling():
        return dyt_fwd_op(x, alpha, gamma, beta)
    return DyTFunction.apply(x, alpha, gamma, beta)
