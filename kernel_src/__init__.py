"""Triton kernel sources and their variant specs (installed as ``liger_aot.kernel_src``).

Each op family is a folder: ``spec.py`` (pure Python, read by build and runtime) and
``kernels.py`` (the ``@triton.jit`` functions, imported only by the build, the JIT fallback
and the interpreter path).
"""
from __future__ import annotations

import importlib

FAMILIES = ("rms_norm", "layer_norm", "group_norm", "poly_norm", "dyt", "rope", "llama4_rope",
            "swiglu", "relu_squared", "softmax", "sparsemax", "cross_entropy", "kl_div", "jsd",
            "tvd")


def family_spec_module(family: str):
    return importlib.import_module(f"{__name__}.{family}.spec")


def all_specs() -> list:
    """Every KernelSpec in the library, in a stable order."""
    specs = []
    for family in FAMILIES:
        specs.extend(family_spec_module(family).SPECS)
    return specs


def triton_function(spec):
    """The @triton.jit function behind a spec. Imports triton: never on the AOT path."""
    module = importlib.import_module(f"{__name__}.{spec.family}.kernels")
    return getattr(module, spec.function)
