"""ReLU squared: y = relu(x)^2 elementwise, forward and backward on AOT kernels.

Eager calls go through ReLUSquaredFunction; under torch.compile the same helpers run as the
custom ops liger_aot::relu_squared_fwd / liger_aot::relu_squared_bwd.
"""
from __future__ import annotations

import torch

from liger_aot.kernel_src.relu_squared import spec
from liger_aot.runtime import Kernel

from ._common import check_float
from ._custom_ops import lazy_custom_op

_fwd = Kernel(spec.FWD)
_bwd = Kernel(spec.BWD)


def relu_squared_forward(x):
    """Returns (y, x as a contiguous tensor). y is contiguous, with x's shape."""
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n:
        config = spec.select_config(n)
        _fwd.launch(spec.grid(n, config), y, x, n, dtype=x.dtype, config=config)
    return y, x


def relu_squared_backward(dy, x):
    """x: the contiguous input saved by the forward."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    if n:
        dy = dy.to(x.dtype).contiguous()
        config = spec.select_config(n)
        _bwd.launch(spec.grid(n, config), dx, dy, x, n, dtype=x.dtype, config=config)
    return dx


class ReLUSquaredFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y, xc = relu_squared_forward(x)
        ctx.save_for_backward(xc)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return relu_squared_backward(dy, x)


@lazy_custom_op("liger_aot::relu_squared_fwd")
def relu_squared_fwd_op(x: torch.Tensor) -> torch.Tensor:
    return relu_squared_forward(x)[0]


@relu_squared_fwd_op.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@lazy_custom_op("liger_aot::relu_squared_bwd")
def relu_squared_bwd_op(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return relu_squared_backward(dy, x.contiguous())


@relu_squared_bwd_op.register_fake
def _(dy, x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return relu_squared_bwd_op(dy, x)


relu_squared_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x) ** 2 elementwise, any shape; float32, bfloat16 or float16."""
    check_float("x", x)
    if torch.compiler.is_compiling():
        return relu_squared_fwd_op(x)
    return ReLUSquaredFunction.apply(x)
