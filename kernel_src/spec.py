"""Declarative variant specs: the single description of a kernel's variant space.

Read by the AOT build (what to compile), the runtime (what to look up and how to pack
arguments), the JIT fallback and the interpreter path. Pure Python: importing this module
must never import triton, because the runtime reads it on the AOT path.

A *variant* is one compiled binary: spec x data dtype x alignment class x option values x
config. Names look like ``rms_norm_fwd.bf16.a16.CASTING=0.BLOCK_N=4096.w8``.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

# Data dtypes a spec can be compiled for; Triton's signature names.
DTYPES = ("fp32", "bf16", "fp16")

# Alignment classes. "a16": every pointer is 16-byte aligned and every int marked
# ``divisible`` is a multiple of 16, so Triton may emit 16-byte vector loads.
# "any": no assumption. The runtime checks this at every call.
ALIGN_CLASSES = ("a16", "any")

# Parameter kinds and the one-character codes used in a manifest's type string.
# Triton 3.6 appends two hidden pointer parameters (global scratch, profile scratch).
KIND_CODES = {"ptr": "P", "i32": "i", "i64": "l", "fp32": "f"}
HIDDEN_PARAMS = "PP"


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "ptr" | "i32" | "i64" | "fp32"
    # For pointers: element type. "{dtype}" means the variant's data dtype.
    dtype: str = "{dtype}"
    # Part of the 16-byte alignment class: pointers must be 16-byte aligned,
    # ints must be multiples of 16 (element strides and row lengths).
    divisible: bool = False

    def __post_init__(self):
        if self.kind not in KIND_CODES:
            raise ValueError(f"param {self.name}: unknown kind {self.kind!r}")


@dataclass(eq=False)  # identity hash: configs are module-level singletons used as dict keys
class Config:
    """Tunable constexprs plus launch options. Chosen per call by the spec's rule."""
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 1
    # ptxas's register cap a thread (0: none). A kernel that must fit several programs an SM
    # needs it: the compiler otherwise spends every register it may have (the staged
    # cross entropy's 4-warp programs take 255 without a cap, one program where it needs 9).
    maxnreg: int = 0
    # Whether the backend may contract a multiply and an add into one fma (Triton's
    # enable_fp_fusion). False where a kernel must round like PyTorch's separate elementwise
    # ops (RoPE: fp32 results equal to Hugging Face's formula bit for bit).
    fp_fusion: bool = True

    @property
    def tag(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.constexprs.items())]
        launch = [f"w{self.num_warps}", f"s{self.num_stages}"]
        return ".".join(parts + launch + ([f"r{self.maxnreg}"] if self.maxnreg else [])
                        + ([] if self.fp_fusion else ["nofma"]))

    def compile_options(self) -> dict:
        """The launch options Triton's compile and JIT take."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg:
            options["maxnreg"] = self.maxnreg
        if not self.fp_fusion:
            options["enable_fp_fusion"] = False
        return options


def row_group_grid(n_rows: int, split: int, sm_count: int, config: Config) -> tuple:
    """(split, programs) of a kernel that splits each row over a group of `split` persistent
    programs (the staged cross-entropy, the grouped norm backward): whole groups, at most the
    config's PROGRAMS_PER_SM an SM, at most one group a row."""
    groups = max(1, min(n_rows, config.constexprs["PROGRAMS_PER_SM"] * sm_count // split))
    return split, groups * split


def grouped_grid(n_rows: int, n_cols: int, sm_count: int, config: Config) -> tuple:
    """(programs a row, programs) of a grouped norm backward (rms_norm/kernels.py,
    rms_norm_bwd_grouped, n_cols a multiple of BLOCK_N)."""
    return row_group_grid(n_rows, n_cols // config.constexprs["BLOCK_N"], sm_count, config)


# Staged configs: the norm forwards' Gluon kernels (<function>_staged in the family's
# kernels.py, kernel_src/staged_rows.py), which stream each row once through a ring of
# STAGES chunk buffers in shared memory. Their configs are their Triton twin's (persistent
# looped rows) plus these keys: STAGED, the chunks of BLOCK_N columns a row may have (the
# tuned bucket), and W_SHARED, whether the weights are staged in shared memory too.
STAGED_KEYS = ("STAGED", "W_SHARED")
STAGED_DTYPES = ("bf16", "fp16")


def is_staged(config: Config) -> bool:
    return "STAGED" in config.constexprs


def staged_twin(config: Config, dtype: str, align: str) -> Config:
    """The config a variant of `config` compiles. A staged config runs its Gluon kernel only
    on 2-byte data in the aligned class: the ring copies 16-byte vectors, and an fp32 ring
    of the same row would not fit in shared memory. Elsewhere it runs its Triton twin: the
    same persistent looped rows (BLOCK_N, PROGRAMS_PER_SM: the op's grid fits both) without
    the ring (STAGED keys dropped, STAGES 1)."""
    if not is_staged(config) or (align == "a16" and dtype in STAGED_DTYPES):
        return config
    constexprs = {k: v for k, v in config.constexprs.items() if k not in STAGED_KEYS}
    return replace(config, constexprs={**constexprs, "STAGES": 1})


# Looped norm forwards whose pass 1 loads PASS1_BLOCK columns whole may also have the row
# length compiled in (EXACT_KEY 1: n_cols == PASS1_BLOCK; no column masks, static trip counts
# in pass 2). An H200 read LayerNorm's 16K / 32K forwards at 88.2 / 85.6% of copy that way
# against 83.2 / 79.8%, RMSNorm's 32K / 64K at 89.1 / 85.3 against 87.2 / 83.4 (session
# 21). Such a config serves rows of that length only: tuning.select gives other lengths of
# its bucket its inexact twin, which the build compiles beside it.
EXACT_KEY = "EXACT_N"
# With EXACT_KEY, a kernel may also keep the row it loaded in pass 1 for pass 2 instead of
# reading it again from L2 (HOLD_KEY 1; LayerNorm's forward, session 39). Its inexact twin
# drops both.
HOLD_KEY = "HOLD_ROW"


def exact_length(config: Config) -> int:
    """The row length a config may compile in (EXACT_KEY), or 0 where it may not: looped rows
    whose pass 1 loads PASS1_BLOCK columns whole."""
    c = config.constexprs
    if c.get("LOOP") and c.get("PASS1_BLOCK", 0) > c.get("BLOCK_N", 0):
        return c["PASS1_BLOCK"]
    return 0


def inexact_twin(config: Config) -> Config:
    """The config without EXACT_KEY or HOLD_KEY (a new object; tuning.py keeps one per
    tag)."""
    return replace(config, constexprs={k: v for k, v in config.constexprs.items()
                                       if k not in (EXACT_KEY, HOLD_KEY)})


@dataclass(frozen=True)
class Variant:
    spec: "KernelSpec"
    dtype: str
    align: str
    options: tuple  # ((name, value), ...) sorted by name
    config: Config

    @property
    def name(self) -> str:
        opts = "".join(f".{k}={v}" for k, v in self.options)
        return f"{self.spec.name}.{self.dtype}.{self.align}{opts}.{self.config.tag}"

    def signature(self) -> dict:
        """Triton signature: param name -> type ("*bf16", "i32", "fp32", "constexpr")."""
        sig = {}
        for p in self.spec.params:
            if p.kind == "ptr":
                sig[p.name] = "*" + p.dtype.format(dtype=self.dtype)
            else:
                sig[p.name] = p.kind
        for name in self.constexprs():
            sig[name] = "constexpr"
        return sig

    def constexprs(self) -> dict:
        values = dict(self.options)
        if not is_staged(self.config):  # the Gluon twins take none of the defaulted ones
            values.update(self.spec.constexpr_defaults)
        values.update(self.config.constexprs)
        return values

    def divisibility_attrs(self) -> dict:
        """Triton attrs for the aligned class: {(index,): [["tt.divisibility", 16]]}."""
        if self.align != "a16":
            return {}
        return {(i,): [["tt.divisibility", 16]]
                for i, p in enumerate(self.spec.params) if p.kind == "ptr" or p.divisible}


@dataclass(frozen=True)
class KernelSpec:
    name: str  # unique across the library, e.g. "rms_norm_fwd"
    family: str  # op family = module folder under kernel_src, e.g. "rms_norm"
    function: str  # name of the @triton.jit function in kernel_src/<family>/kernels.py
    params: tuple  # tuple[Param, ...] in kernel order, constexprs excluded
    configs: tuple  # tuple[Config, ...]: every config the rule may pick (tuning.py adds an
    # arch's tuned configs)
    dtypes: tuple = ("fp32", "bf16", "fp16")
    # Feature constexprs compiled as separate variants: name -> allowed values.
    options: dict = field(default_factory=dict)
    # Which sizes pick which config, e.g. lambda n_cols: CONFIGS[...]
    rule: Callable | None = None
    # Whether kernels.py has a Gluon twin <function>_staged, which runs the staged configs
    # (see staged_twin) a tuned table may choose
    staged: bool = False
    # The archs whose builds hold this spec (empty: all of them), and its alignment classes:
    # a kernel written for one chip's instructions (cp.async into shared memory, a grid sized
    # for its shared memory) is compiled only where the op runs it.
    archs: tuple = ()
    align_classes: tuple = ALIGN_CLASSES
    # Constexprs of the Triton kernel that configs may leave out, with the kernel's defaults:
    # an ahead-of-time compile names every constexpr, Triton's JIT fills them in itself
    constexpr_defaults: dict = field(default_factory=dict)

    def built_for(self, arch: str | None) -> bool:
        return arch is None or not self.archs or arch in self.archs

    @property
    def type_string(self) -> str:
        """One character per launch parameter, hidden trailing parameters included."""
        return "".join(KIND_CODES[p.kind] for p in self.params) + HIDDEN_PARAMS

    def variants(self, arch: str | None = None) -> Iterator[Variant]:
        """Every variant of the heuristic configs; with an arch, also of the configs its tuned
        table chose (kernel_src/tuned/<arch>.json, see tuning.py), and none where the spec is
        not built for that arch (see archs)."""
        if not self.built_for(arch):
            return
        configs = self.configs
        if arch is not None:
            from .tuning import arch_configs  # tuning imports this module

            configs = arch_configs(self, arch)
        option_names = sorted(self.options)
        seen = set()  # a staged config's Triton twin may be one of the configs already
        for dtype in self.dtypes:
            for align in self.align_classes:
                for values in itertools.product(*(self.options[n] for n in option_names)):
                    for config in configs:
                        variant = self.variant(dtype, align, tuple(zip(option_names, values)),
                                               config)
                        if variant.name not in seen:
                            seen.add(variant.name)
                            yield variant

    def variant(self, dtype: str, align: str, options: tuple, config: Config) -> Variant:
        """The variant that runs `config` on this data (see staged_twin)."""
        return Variant(self, dtype, align, options, staged_twin(config, dtype, align))

    def function_name(self, config: Config) -> str:
        """The kernel function a config compiles: the Gluon twin for staged configs."""
        if not is_staged(config):
            return self.function
        if not self.staged:
            raise ValueError(f"{self.name} has no staged kernel for config {config.tag}")
        return self.function + "_staged"

    def source_path(self) -> str:
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), self.family, "kernels.py")

    def source_sha256(self) -> str:
        return family_source_sha256(self.family)


_SOURCE_SHA: dict = {}


# What a family's compiled code depends on: its Triton source, and its spec, from which the
# source takes compile-time constants that the ops use too (e.g. the interleaved backwards'
# SUM_BLOCK_N, which sizes their grids): an artifact built with another value must not load.
SOURCE_FILES = ("kernels.py", "spec.py")
# Files of kernel_src itself that every family's hash includes: the Gluon helpers of the
# staged forwards (kernels.py of two families imports them).
SHARED_SOURCE_FILES = ("staged_rows.py",)


def family_source_sha256(family: str) -> str:
    """sha256 of an op family's SOURCE_FILES: part of every artifact key, and what the runtime
    compares to refuse artifacts built from other kernel code. Read once per process."""
    digest = _SOURCE_SHA.get(family)
    if digest is None:
        digest = _SOURCE_SHA[family] = files_sha256(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), family))
    return digest


def files_sha256(folder: str) -> str:
    """sha256 over the SOURCE_FILES of `folder` and the SHARED_SOURCE_FILES of the folder
    above it, each as its name, its length and its bytes (so no two different pairs of
    contents hash alike)."""
    h = hashlib.sha256()
    paths = [os.path.join(folder, name) for name in SOURCE_FILES]
    paths += [os.path.join(folder, os.pardir, name) for name in SHARED_SOURCE_FILES]
    for path in paths:
        name = os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
