"""Kernel: the call site of one spec. Picks a variant per call and launches it.

Paths, in order of preference for a CUDA/HIP tensor:
  1. AOT binary from an artifact set (no triton import, no compiler).
  2. Triton JIT of the same source (default mode only; one warning per missing variant).
  3. Strict mode (LIGER_AOT_STRICT=1): a missing variant raises MissingVariantError.
CPU tensors run through Triton's interpreter.

The hot path is a dict lookup keyed by (device index, dtype, alignment, options, config).
Ops pick the config with Kernel.select_config: the device arch's tuned table, else the spec's
rule (see kernel_src/tuning.py), also one dict lookup once seen.
"""
from __future__ import annotations

import operator
import threading
import warnings

import torch

from liger_aot.kernel_src import tuning
from liger_aot.kernel_src.spec import Config, KernelSpec, staged_twin

from liger_aot.artifact_format import TARGETS

from . import _env
from .errors import LaunchError, MissingVariantError

TORCH_TO_TRITON = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_MAX_REMEMBERED = 1024  # configs remembered per kernel and device


class Kernel:
    """Call as kernel(grid, *args, dtype=, config=, options=()): pointer params take tensors,
    the rest numbers, in the spec's order; `options` is ((name, value), ...) sorted by name.

    The call path is generated per spec (see _fast_path_source) so it runs no per-parameter
    loop: fetch data pointers, test alignment with one OR, one dict lookup, launch. A driver
    launcher is called through its flat entry point (launcher.flat(grid, *values): no tuples
    to build); any other launcher (Triton JIT, test doubles) as launcher(grid, values, args)."""

    __slots__ = ("spec", "_launchers", "_flat", "_configs", "_lock", "launch")

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self._launchers = {}  # key -> launcher(grid, values, args)
        self._flat = {}  # key -> launcher.flat, for the launchers that have one
        self._configs = {}  # device index -> {(rule args, dtype): Config}
        self._lock = threading.Lock()
        namespace = {"get_flat": self._flat.get, "get": self._launchers.get,
                     "resolve": self._resolve, "interpret": self._interpret}
        exec(_fast_path_source(spec), namespace)  # noqa: S102 - source built from the spec
        self.launch = namespace["launch"]

    # kernel(...) is kernel.launch(...): the property hands Python's call slot the instance's
    # generated function itself, so a call through the instance costs no extra Python frame
    # and no re-packing of the arguments (operator.attrgetter runs in C).
    __call__ = property(operator.attrgetter("launch"))

    def select_config(self, device: int, *args, dtype: torch.dtype | None = None) -> Config:
        """The config for the spec's rule arguments `args` (e.g. n_cols) on `device` (a
        tensor's get_device(), -1 for CPU): the tuned table of the device's arch, else the
        spec's rule. With the call's data `dtype`, a tuned entry applies only to data of the
        element size it was measured with (see tuning.select). Resolved once per (device,
        args, dtype), then one dict lookup."""
        configs = self._configs.get(device)
        if configs is not None:
            config = configs.get((args, dtype))
            if config is not None:
                return config
        return self._select_config(device, args, dtype)

    def _select_config(self, device, args, dtype):
        arch = None
        if device >= 0:
            from .device import device_arch
            from .registry import tuned_table_usable

            arch = device_arch(device)[0]
            if arch is not None and not tuned_table_usable(arch):
                arch = None
        config = tuning.select(self.spec, arch, args, dtype.itemsize if dtype else 0)
        configs = self._configs.setdefault(device, {})
        if len(configs) < _MAX_REMEMBERED:  # bounded: row lengths could be unbounded
            configs[(args, dtype)] = config
        return config

    # -- slow path ------------------------------------------------------------------------
    def _resolve(self, key):
        with self._lock:
            launcher = self._launchers.get(key)
            if launcher is None:
                launcher = self._make_launcher(*key)
                self._launchers[key] = launcher
                flat = getattr(launcher, "flat", None)
                if flat is not None:
                    self._flat[key] = flat
            return launcher

    def _make_launcher(self, device_index, dtype, aligned, options, config):
        from .registry import find_variant  # deferred: keeps import of the package light

        variant = self.spec.variant(TORCH_TO_TRITON[dtype], "a16" if aligned else "any",
                                    options, config)
        found = find_variant(variant, device_index)
        if found.launcher is not None:
            return found.launcher
        if _env.strict() or not _env.jit_fallback_allowed():
            why = "LIGER_AOT_STRICT=1" if _env.strict() else "LIGER_AOT_DISABLE_JIT=1"
            raise MissingVariantError(variant.name, found.arch, found.reasons, why)
        hint = (f"Build it with `liger-aot build --arch {found.arch}`." if found.arch in TARGETS
                else "This device has no ahead-of-time arch.")
        warnings.warn(
            f"liger_aot: no ahead-of-time binary for {variant.name} on {found.arch} "
            f"({'; '.join(found.reasons)}); compiling it with Triton JIT. {hint}",
            RuntimeWarning, stacklevel=4)
        return _jit_launcher(variant)

    def _interpret(self, grid, args, dtype, config, options):
        key = ("interpret", dtype, options, config)
        fn = self._launchers.get(key)
        if fn is None:
            fn = _interpreted_function(self.spec)
            self._launchers[key] = fn
        constexprs = dict(options)
        # the interpreter runs no Gluon: a staged config runs its Triton twin
        constexprs.update(staged_twin(config, "", "any").constexprs)
        fn[tuple(grid)](*args, **constexprs)


def _interpreted_function(spec):
    """CPU tensors run through Triton's interpreter, which must be chosen before triton is
    imported (it replaces every @triton.jit function, tl.sum included, at decoration)."""
    import os
    import sys

    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    from liger_aot.kernel_src import triton_function
    from triton.runtime.interpreter import InterpretedFunction

    fn = triton_function(spec)
    if not isinstance(fn, InterpretedFunction):
        raise RuntimeError(
            "liger_aot: CPU tensors run through Triton's interpreter, but triton was imported "
            "without it. Set TRITON_INTERPRET=1 before anything imports triton, or move the "
            "tensors to a GPU.")
    return fn


def _fast_path_source(spec: KernelSpec) -> str:
    names = [f"a{i}" for i in range(len(spec.params))]
    ptrs = [i for i, p in enumerate(spec.params) if p.kind == "ptr"]
    checked = [f"p{i}" for i in ptrs] + [names[i] for i, p in enumerate(spec.params)
                                         if p.kind != "ptr" and p.divisible]
    values = [f"p{i}" if i in ptrs else names[i] for i in range(len(names))]
    lines = [
        f"def launch(grid, {', '.join(names)}, *, dtype, config, options=()):",
        f"    device = a{ptrs[0]}.get_device()",
        "    if device < 0:",
        f"        return interpret(grid, ({', '.join(names)},), dtype, config, options)",
    ]
    lines += [f"    p{i} = a{i}.data_ptr()" for i in ptrs]
    lines += [
        f"    key = (device, dtype, not (({' | '.join(checked)}) & 15), options, config)",
        "    flat = get_flat(key)",
        "    if flat is not None:",
        f"        flat(grid, {', '.join(values)})",
        "        return",
        "    launcher = get(key)",
        "    if launcher is None:",
        "        launcher = resolve(key)",
        f"    launcher(grid, ({', '.join(values)},), ({', '.join(names)},))",
    ]
    return "\n".join(lines) + "\n"


def _jit_launcher(variant):
    from liger_aot.kernel_src import jit_function

    fn = jit_function(variant.spec, variant.config)  # the AOT variant's specialization
    constexprs = variant.constexprs()
    options = variant.config.compile_options()

    def launch(grid, values, args):
        fn[tuple(grid)](*args, **constexprs, **options)

    return launch


__all__ = ["Kernel", "LaunchError", "MissingVariantError", "TORCH_TO_TRITON"]
