"""Plumbing shared by the row ops over one dimension (softmax, sparsemax): kernels on
(rows, n) views, lifted to the last dim of any shape, wrapped as an autograd Function for
eager calls and as the custom ops liger_aot::<name>_fwd / _bwd under torch.compile. The
backward of these ops needs only the output y."""
from __future__ import annotations

import torch

from ._common import rows_view
from ._custom_ops import lazy_custom_op


class RowOp:
    """forward(x2) -> y2 and backward(dy, y2) -> dx2 on (rows, n) views, as one op `name`."""

    def __init__(self, name: str, forward, backward):
        def last_dim_forward(x):
            if x.numel() == 0:
                return torch.empty(x.shape, dtype=x.dtype, device=x.device)
            return forward(rows_view("x", x, x.shape[-1])).view(x.shape)

        def last_dim_backward(dy, y):
            if y.numel() == 0:
                return torch.empty(y.shape, dtype=y.dtype, device=y.device)
            return backward(dy, rows_view("y", y, y.shape[-1])).view(y.shape)

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = last_dim_forward(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, dy):
                (y,) = ctx.saved_tensors
                return last_dim_backward(dy, y)

        Function.__name__ = Function.__qualname__ = f"{name.capitalize()}Function"
        Function.__doc__ = f"{name.capitalize()} over the last dim of x (at least 1-D)."

        def fwd(x: torch.Tensor) -> torch.Tensor:
            return last_dim_forward(x)

        def bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return last_dim_backward(dy, y)

        self.Function = Function
        self.fwd_op = lazy_custom_op(f"liger_aot::{name}_fwd", fwd)
        self.bwd_op = lazy_custom_op(f"liger_aot::{name}_bwd", bwd)
        self.fwd_op.register_fake(lambda x: torch.empty(x.shape, dtype=x.dtype, device=x.device))
        self.bwd_op.register_fake(
            lambda dy, y: torch.empty(y.shape, dtype=y.dtype, device=y.device))
        self.fwd_op.register_autograd(self._backward, setup_context=self._setup_context)

    @staticmethod
    def _setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def _backward(self, ctx, dy):
        (y,) = ctx.saved_tensors
        return self.bwd_op(dy, y)

    def last(self, x):
        """The op over x's last dim: the custom op under torch.compile, else the Function."""
        if torch.compiler.is_compiling():
            return self.fwd_op(x)
        return self.Function.apply(x)


def normalize_dim(x: torch.Tensor, dim) -> int:
    ndim = max(x.dim(), 1)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"dim must be an int in [{-ndim}, {ndim - 1}] for x of shape "
                         f"{tuple(x.shape)}, got {dim!r}")
    return dim % ndim


def over_dim(fn, x, dim):
    """fn (a last-dim op) applied over dimension `dim` of x."""
    if x.dim() == 0:
        return fn(x.reshape(1)).reshape(())
    dim = normalize_dim(x, dim)
    if dim == x.dim() - 1:
        return fn(x)
    return fn(x.movedim(dim, -1)).movedim(-1, dim)
