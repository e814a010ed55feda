"""Ops: one module per op family (autograd Functions over the AOT kernels). The functional
forms are collected in liger_aot.transformers.functional."""


def define_custom_ops():
    """Define the torch.compile custom ops of every op module imported so far, and of each
    one imported later, now rather than at TorchDynamo's first compile (see _custom_ops):
    needed only when torch._dynamo.reset() ran before any compile and the trace must not
    break (fullgraph=True)."""
    from ._custom_ops import define_all

    define_all()
