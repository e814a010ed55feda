"""The ops' torch.compile path: torch.library custom ops, defined when TorchDynamo first
compiles instead of when an op module is imported.

Eager calls go through the ops' torch.autograd.Functions and never use these custom ops, yet
defining them (schema inference, the dispatcher, the fake and autograd registrations) costs
~3 ms each. A patched model imports its op modules in its first forward, so a cold first
step paid for ops it would not use: on the H200 host, importing a Qwen2 model's four op
modules (11 ops) took 47-48 ms with them defined and 14 ms without (docs/perf-notes.md,
"Cold start, session 16"). An op declared with lazy_custom_op is defined:
  - when Dynamo starts its first compile in the process (a compile-start callback): every op
    declared so far, and from then on each op as it is declared;
  - at declaration, as torch.library.custom_op would, when that callback cannot be installed:
    torch._dynamo not imported yet (importing it only for this costs far more than it
    saves) or a torch without torch._dynamo.callback;
  - at its first call otherwise (torch._dynamo.reset() clears the callbacks, so a compile
    after a reset that came before any compile finds the op undefined): it works, at the
    cost of a graph break in that trace; torch.compile(fullgraph=True) then fails. Call
    liger_aot.ops.define_custom_ops() (define_all here) before compiling to rule that out.
"""
from __future__ import annotations

import sys
import threading

import torch

_declared: list = []
_lock = threading.RLock()
# True once ops are defined at declaration: after the first compile, or when no callback.
_define_at_declaration = True


class LazyCustomOp:
    """torch.library.custom_op(qualname, fn, mutates_args=()) defined on demand (see the
    module docstring). Calling it calls the custom op; register_fake and register_autograd
    are kept until it is defined. `custom_op` is the defined CustomOpDef (for opcheck)."""

    def __init__(self, qualname: str, fn):
        self.qualname = qualname
        self._fn = fn
        self._fake = None
        self._autograd = None
        self._op = None
        with _lock:
            _declared.append(self)
            if _define_at_declaration:
                self._define()

    def register_fake(self, fake):
        with _lock:
            self._fake = fake
            if self._op is not None:
                self._op.register_fake(fake)
        return fake

    def register_autograd(self, backward, *, setup_context=None):
        with _lock:
            self._autograd = (backward, setup_context)
            if self._op is not None:
                self._op.register_autograd(backward, setup_context=setup_context)

    def _define(self):
        with _lock:
            if self._op is None:
                op = torch.library.custom_op(self.qualname, self._fn, mutates_args=())
                if self._fake is not None:
                    op.register_fake(self._fake)
                if self._autograd is not None:
                    op.register_autograd(self._autograd[0], setup_context=self._autograd[1])
                self._op = op
            return self._op

    @property
    def custom_op(self):
        return self._define()

    def __call__(self, *args, **kwargs):
        op = self._op
        if op is None:
            op = self._define()
        return op(*args, **kwargs)

    def __repr__(self):
        return f"LazyCustomOp({self.qualname!r}, defined={self._op is not None})"


def lazy_custom_op(qualname: str, fn=None):
    """Decorator (or call with fn) declaring a custom op with no mutated arguments."""
    if fn is None:
        return lambda f: LazyCustomOp(qualname, f)
    return LazyCustomOp(qualname, fn)


def define_all():
    """Define every declared op now, and each later one at its declaration."""
    global _define_at_declaration
    with _lock:
        _define_at_declaration = True
        for op in _declared:
            op._define()


def _on_compile_start(*_args):
    if not _define_at_declaration:  # after the first compile: one check
        define_all()


def _install_compile_hook():
    global _define_at_declaration
    callback = sys.modules.get("torch._dynamo.callback")
    if callback is None and "torch._dynamo" in sys.modules:
        try:
            import torch._dynamo.callback as callback
        except ImportError:
            callback = None
    register = getattr(callback, "on_compile_start", None)
    if register is not None:
        register(_on_compile_start)
        _define_at_declaration = False


_install_compile_hook()


def saved_inputs_autograd(name, forward, backward, bwd_op):
    """The two autograd paths of a loss op(t0, t1, t2, *args) whose gradient flows to t0
    alone and whose backward recomputes from the saved t0, t1, t2 (tensors or None) and the
    non-tensor args: forward(t0, t1, t2, *args) and backward(grad_output, t0, t1, t2, *args)
    are the op's helpers. Returns (the autograd.Function `name` for eager calls, and the
    backward and setup_context to register on the forward custom op, whose backward calls
    bwd_op)."""

    def eager_forward(ctx, t0, t1, t2, *args):
        ctx.save_for_backward(t0, t1, t2)
        ctx.args = args
        return forward(t0, t1, t2, *args)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])
        ctx.args = tuple(inputs[3:])

    def backward_through(grad_of_t0):  # a gradient for t0, None for the other inputs
        def backward_of_saved(ctx, grad_output):
            return (grad_of_t0(grad_output, *ctx.saved_tensors, *ctx.args),
                    *(None for _ in range(2 + len(ctx.args))))
        return backward_of_saved

    # built with type() so the class, and the autograd node torch derives from it
    # (grad_fn <name>Backward), carry the op's own name
    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(eager_forward),
        "backward": staticmethod(backward_through(backward)),
        "__module__": forward.__module__})
    return function, backward_through(bwd_op), setup_context
