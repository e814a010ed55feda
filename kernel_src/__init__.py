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


def triton_function(spec, config=None):
    """The @triton.jit function behind a spec (with a staged config, its @gluon.jit twin: see
    spec.staged_twin). Imports triton: never on the AOT path."""
    module = importlib.import_module(f"{__name__}.{spec.family}.kernels")
    return getattr(module, spec.function if config is None else spec.function_name(config))


def is_gluon(fn) -> bool:
    """Whether a kernel function is Gluon's (compiled from GluonASTSource)."""
    return bool(getattr(fn, "is_gluon", lambda: False)())


_jit_functions = {}


def jit_function(spec, config=None):
    """triton_function(spec, config) for launches through Triton's (or Gluon's) JIT (the
    tuner, the runtime's JIT fallback), specialized as the AOT build compiles the spec's
    variants: the JIT would make
    an int argument equal to 1 a constant (and one divisible by 16 an aligned value), so a
    runtime flag such as has_dres = 1 would have its branch compiled away, which the AOT
    binary keeps. Only the params the spec marks divisible keep the JIT's specialization
    (the a16 variants assume it for them). Under the interpreter: triton_function(spec)."""
    fn = triton_function(spec, config)
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        return fn
    key = (spec.family, fn.fn.__name__)
    jitted = _jit_functions.get(key)
    if jitted is None:
        if is_gluon(fn):
            from triton.experimental.gluon import jit
        else:
            from triton import jit

        names = [p.name for p in spec.params if p.kind != "ptr" and not p.divisible]
        jitted = _jit_functions[key] = jit(do_not_specialize=names)(fn.fn)
    return jitted
