"""Variant choice at the call site: device arch rules, the 16-byte alignment class, the specs'
config rules, and that the runtime path never imports triton. No GPU and no build needed:
Kernel's variant lookup is intercepted where it asks the registry for a binary."""
import ctypes
import inspect
import itertools
import random
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import liger_aot.runtime.driver as driver
import liger_aot.runtime.registry as registry
from liger_aot.kernel_src import FAMILIES, all_specs, family_spec_module
from liger_aot.kernel_src.spec import (ALIGN_CLASSES, SHARED_SOURCE_FILES, SOURCE_FILES,
                                      KernelSpec, family_source_sha256, files_sha256)
from liger_aot.runtime import Kernel
from liger_aot.runtime.device import arch_for_capability, arch_for_gcn_name

REPO = Path(__file__).resolve().parents[1]
SPECS = all_specs()


# -- device arch rules ----------------------------------------------------------------------

@pytest.mark.parametrize("capability,arch", [
    ((8, 0), "sm80"), ((8, 6), "sm80"), ((8, 7), "sm80"), ((8, 9), "sm80"),
    ((9, 0), "sm90"),
    ((7, 0), None), ((7, 5), None), ((9, 1), None), ((10, 0), None), ((12, 0), None),
])
def test_arch_for_capability(capability, arch):
    assert arch_for_capability(*capability) == arch


@pytest.mark.parametrize("name,arch", [
    ("gfx942:sramecc+:xnack-", "gfx942"), ("gfx942", "gfx942"),
    ("gfx90a", "gfx90a"), ("gfx90a:sramecc+:xnack-", "gfx90a"),
    ("gfx1100", None), ("gfx908", None), ("", None),
])
def test_arch_for_gcn_name(name, arch):
    assert arch_for_gcn_name(name) == arch


# -- alignment classes ----------------------------------------------------------------------

class FakeTensor:
    """What Kernel reads from a GPU tensor: its device index and data pointer."""

    def __init__(self, ptr: int, device: int = 0):
        self.ptr, self.device = ptr, device

    def get_device(self):
        return self.device

    def data_ptr(self):
        return self.ptr


class OnDevice:
    """A real (CPU) tensor presented as if it were on GPU `device`."""

    def __init__(self, tensor: torch.Tensor, device: int = 0):
        self.tensor, self.device = tensor, device

    def get_device(self):
        return self.device

    def data_ptr(self):
        return self.tensor.data_ptr()


BASE = 0x7F00_0000_0000  # 16-byte (and 4 KiB) aligned


def base_args(spec: KernelSpec) -> list:
    """16-byte aligned pointers, multiples of 16 for `divisible` ints, and odd values for the
    other ints (which must not matter)."""
    args = []
    for i, p in enumerate(spec.params):
        if p.kind == "ptr":
            args.append(FakeTensor(BASE + i * 0x10_0000))
        elif p.kind == "fp32":
            args.append(0.5)
        elif p.divisible:
            args.append(4096)
        else:
            args.append(7)
    return args


def first_options(spec: KernelSpec) -> tuple:
    return tuple((name, spec.options[name][0]) for name in sorted(spec.options))


@pytest.fixture
def recorder(monkeypatch):
    """Intercept the registry lookup: every launch records the variant it ran and what it was
    given; every lookup records (variant name, device index)."""
    lookups, launches = [], []

    def fake_find_variant(variant, device_index):
        lookups.append((variant.name, device_index))

        def launcher(grid, values, args):
            launches.append((variant.name, grid, tuple(values), args))

        return registry.Found(arch="sm90", launcher=launcher, where="fake")

    monkeypatch.setattr(registry, "find_variant", fake_find_variant)
    return lookups, launches


def _launch(kernel, args, dtype=torch.bfloat16, config=None, options=None):
    spec = kernel.spec
    config = config or spec.configs[0]
    kernel((3,), *args, dtype=dtype, config=config,
           options=first_options(spec) if options is None else options)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_aligned_call_uses_a16_variant(spec, recorder):
    lookups, launches = recorder
    kernel = Kernel(spec)
    args = base_args(spec)
    config = spec.configs[-1]
    _launch(kernel, args, config=config)
    expected = spec.variant("bf16", "a16", first_options(spec), config).name
    assert ".bf16.a16." in expected
    assert lookups == [(expected, 0)]
    name, grid, values, passed = launches[0]
    assert name == expected and grid == (3,)
    # tensors are replaced by their data pointers, everything else passed through
    assert values == tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    assert passed == tuple(args)
    # a second call with the same classes is served from the cache
    _launch(kernel, args, config=config)
    assert len(lookups) == 1 and len(launches) == 2


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("offset", [1, 2, 4, 8, 12])
def test_misaligned_pointer_uses_any_variant(spec, offset, recorder):
    lookups, launches = recorder
    ptr_slots = [i for i, p in enumerate(spec.params) if p.kind == "ptr"]
    for slot in ptr_slots:
        kernel = Kernel(spec)
        args = base_args(spec)
        args[slot] = FakeTensor(args[slot].ptr + offset)
        _launch(kernel, args)
        assert launches[-1][0] == spec.variant("bf16", "any", first_options(spec),
                                               spec.configs[0]).name, spec.params[slot].name
    assert all(".bf16.any." in name for name, _ in lookups)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.parametrize("value", [1, 8, 100, 4104])
def test_indivisible_int_uses_any_variant(spec, value, recorder):
    lookups, launches = recorder
    div_slots = [i for i, p in enumerate(spec.params) if p.kind != "ptr" and p.divisible]
    for slot in div_slots:
        kernel = Kernel(spec)
        args = base_args(spec)
        args[slot] = value
        _launch(kernel, args)
        assert ".bf16.any." in launches[-1][0], spec.params[slot].name
    # ints not marked divisible never change the class
    for slot in [i for i, p in enumerate(spec.params) if p.kind in ("i32", "i64")
                 and not p.divisible]:
        kernel = Kernel(spec)
        args = base_args(spec)
        args[slot] = value
        _launch(kernel, args)
        assert ".bf16.a16." in launches[-1][0], spec.params[slot].name


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_never_a16_on_misaligned_data(spec, recorder):
    """Random mixes of aligned and misaligned pointers and ints through one Kernel (so its
    launcher cache is exercised too): a16 exactly when every checked value is a multiple of
    16."""
    _, launches = recorder
    rng = random.Random(f"align-{spec.name}")
    kernel = Kernel(spec)
    ptr_offsets = (0, 0, 0, 16, 64, 1, 2, 4, 8, 12)
    int_values = (0, 16, 4096, 4096, 8192, 1, 2, 8, 24, 100, 4104)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    for _ in range(300):
        args = base_args(spec)
        checked = []
        for i, p in enumerate(spec.params):
            if p.kind == "ptr":
                args[i] = FakeTensor(args[i].ptr + rng.choice(ptr_offsets))
                checked.append(args[i].ptr)
            elif p.divisible:
                args[i] = rng.choice(int_values)
                checked.append(args[i])
        dtype = rng.choice(dtypes)
        config = rng.choice(spec.configs)
        _launch(kernel, args, dtype=dtype, config=config)
        align = "a16" if all(v % 16 == 0 for v in checked) else "any"
        assert launches[-1][0] == spec.variant(names[dtype], align, first_options(spec),
                                               config).name


def test_real_tensor_offsets(recorder):
    """Real tensors (CPU memory presented as device 0): a slice one element in is
    misaligned, a slice 16 bytes in is not."""
    _, launches = recorder
    spec = next(s for s in SPECS if s.name == "rms_norm_fwd")
    kernel = Kernel(spec)
    storage = {i: torch.zeros(4096, dtype=torch.bfloat16 if p.dtype == "{dtype}" else
                              {"fp32": torch.float32, "i64": torch.int64}[p.dtype])
               for i, p in enumerate(spec.params) if p.kind == "ptr"}
    for t in storage.values():
        assert t.data_ptr() % 16 == 0

    def call(shift):
        args = base_args(spec)
        for i, t in storage.items():
            args[i] = OnDevice(t[shift(i, t):])
        _launch(kernel, args)
        return launches[-1][0]

    assert ".a16." in call(lambda i, t: 0)
    assert ".a16." in call(lambda i, t: 16 // t.element_size())
    first = min(storage)
    assert ".any." in call(lambda i, t: 1 if i == first else 0)  # +2 bytes for bf16
    assert ".any." in call(lambda i, t: 1)


def test_device_index_reaches_the_registry(recorder):
    lookups, _ = recorder
    spec = SPECS[0]
    kernel = Kernel(spec)
    for device in (0, 1, 3):
        args = [FakeTensor(a.ptr, device) if isinstance(a, FakeTensor) else a
                for a in base_args(spec)]
        _launch(kernel, args)
    assert [d for _, d in lookups] == [0, 1, 3]


def test_variant_names_for_both_classes():
    spec = next(s for s in SPECS if s.name == "rms_norm_fwd")
    config = spec.configs[0]
    options = (("CASTING", 1),)
    tag = config.tag
    a16 = spec.variant("bf16", "a16", options, config).name
    anyv = spec.variant("bf16", "any", options, config).name
    assert a16 == f"rms_norm_fwd.bf16.a16.CASTING=1.{tag}"
    assert anyv == f"rms_norm_fwd.bf16.any.CASTING=1.{tag}"
    assert tag.endswith(f".w{config.num_warps}.s{config.num_stages}")
    for k, v in config.constexprs.items():
        assert f"{k}={v}" in tag


# -- the specs ------------------------------------------------------------------------------

def test_variant_names_unique():
    names = [v.name for spec in SPECS for v in spec.variants()]
    assert len(names) == len(set(names))
    assert len({s.name for s in SPECS}) == len(SPECS)
    for spec in SPECS:
        n_options = 1
        for values in spec.options.values():
            n_options *= len(values)
        assert set(spec.align_classes) <= set(ALIGN_CLASSES), spec.name
        assert sum(1 for _ in spec.variants()) == (len(spec.dtypes) * len(spec.align_classes)
                                                  * n_options * len(spec.configs))


def test_specs_are_well_formed():
    for spec in SPECS:
        assert spec.configs, spec.name
        assert any(p.kind == "ptr" for p in spec.params), spec.name
        assert len({p.name for p in spec.params}) == len(spec.params), spec.name
        assert spec.type_string.endswith("PP")
        assert len({id(c) for c in spec.configs}) == len(spec.configs)
        assert len({c.tag for c in spec.configs}) == len(spec.configs), spec.name
        assert spec.source_path().endswith(f"{spec.family}/kernels.py")
        assert Path(spec.source_path()).is_file()


def test_source_hash_covers_kernels_and_spec(tmp_path):
    # kernels.py takes compile-time constants from spec.py (rms_norm: SUM_BLOCK_N and the
    # residual limits), and two families' kernels.py import kernel_src/staged_rows.py, so an
    # edit to any of them must change the hash that keys the artifacts
    for spec in SPECS:
        folder = Path(spec.source_path()).parent
        assert family_source_sha256(spec.family) == files_sha256(str(folder)), spec.family
    folder = Path(SPECS[0].source_path()).parent
    copy = tmp_path / folder.name
    copy.mkdir()
    files = [copy / name for name in SOURCE_FILES]
    files += [tmp_path / name for name in SHARED_SOURCE_FILES]
    for path in files:
        shutil.copy((folder if path.parent == copy else folder.parent) / path.name, path)
    before = files_sha256(str(copy))
    for path in files:
        original = path.read_bytes()
        path.write_bytes(original + b"\n")
        assert files_sha256(str(copy)) != before, path.name
        path.write_bytes(original)
    assert files_sha256(str(copy)) == before
    assert set(SOURCE_FILES) == {"kernels.py", "spec.py"}
    assert set(SHARED_SOURCE_FILES) == {"staged_rows.py"}


SWEEP = range(1, 300_001)
# arguments for rules of several sizes (rows, cols, multiprocessor count, ...)
GRID_VALUES = sorted({1, 2, 3, 7, 15, 16, 17, 100, 127, 128, 129, 1000, 2047, 2048, 2049,
                      4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385, 32768,
                      65536, 131072, 262144, 300000} | {4 * k for k in (1, 27, 66, 132, 304)})


# Rules defined on part of their arguments' range, and what runs elsewhere: they raise
# ValueError there (a config for sizes a kernel cannot hold would compute a wrong result)
PARTIAL_RULES = {"rope_whole": "looped rope kernel"}


def _sweep(rule, refusal=None):
    """Every config the rule picks over the sweep; with `refusal`, arguments it refuses with
    a ValueError naming that are skipped (at least one must be refused)."""
    n = len(inspect.signature(rule).parameters)
    args = ((x,) for x in SWEEP) if n == 1 else itertools.product(GRID_VALUES, repeat=n)
    refused = 0
    for xs in args:
        try:
            yield rule(*xs)
        except ValueError as e:
            if refusal is None or refusal not in str(e):
                raise
            refused += 1
    assert refusal is None or refused, "a partial rule that refuses nothing"


def _family_rules():
    """(family, function name, function) for every select*config function of every family."""
    for family in FAMILIES:
        module = family_spec_module(family)
        for name, fn in vars(module).items():
            if name.startswith("select") and name.endswith("config") and callable(fn):
                yield family, name, fn


def test_rms_norm_rules_pick_compiled_configs():
    module = family_spec_module("rms_norm")
    fwd = {id(c) for c in module.FWD.configs}
    bwd = {id(c) for c in module.BWD.configs}
    chosen_fwd = {id(module.select_config(n)) for n in SWEEP}
    chosen_bwd = {id(module.select_bwd_config(n)) for n in SWEEP}
    assert chosen_fwd <= fwd
    assert chosen_bwd <= bwd
    assert chosen_fwd == fwd and chosen_bwd == bwd  # and no config is compiled for nothing


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_spec_rule_picks_compiled_configs(spec):
    if spec.rule is None:
        pytest.skip(f"{spec.name} has no rule")
    allowed = {id(c) for c in spec.configs}
    chosen = set()
    for config in _sweep(spec.rule, PARTIAL_RULES.get(spec.name)):
        assert id(config) in allowed, (spec.name, config.tag)
        chosen.add(id(config))
    assert chosen, spec.name


def test_every_family_rule_picks_compiled_configs():
    """Every select*config function of every family (also those used only by an op, not as a
    spec's rule) returns a config one of the family's specs compiles."""
    seen = 0
    for family, name, fn in _family_rules():
        module = family_spec_module(family)
        allowed = {id(c) for spec in module.SPECS for c in spec.configs}
        for config in _sweep(fn):
            assert id(config) in allowed, (family, name, config.tag)
        seen += 1
    assert seen >= len(FAMILIES)


# -- the runtime path never imports triton --------------------------------------------------

NO_TRITON = textwrap.dedent(r"""
    import ctypes, importlib.abc, os, sys, traceback

    repo = sys.argv[1]
    attempts = []

    class BlockTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                stack = [f.filename for f in traceback.extract_stack()]
                attempts.append((name, [f for f in stack if f.startswith(repo)]))
                raise ImportError(f"test: import of {name} blocked")
            return None

    sys.meta_path.insert(0, BlockTriton())

    loaded = []
    real_init = ctypes.CDLL.__init__

    def recording_init(self, name, *args, **kwargs):
        loaded.append(str(name))
        return real_init(self, name, *args, **kwargs)

    ctypes.CDLL.__init__ = recording_init  # PyDLL is a CDLL subclass

    import liger_aot, liger_aot.ops, liger_aot.runtime.registry, liger_aot.runtime.driver
    import liger_aot.runtime, liger_aot.runtime.kernel, liger_aot.runtime.device
    import liger_aot.kernel_src, liger_aot.artifact_format
    import importlib, pkgutil
    ops = [m.name for m in pkgutil.iter_modules(liger_aot.ops.__path__, "liger_aot.ops.")]
    for name in ops:  # every op module, not only what liger_aot.ops imports itself
        importlib.import_module(name)
    from liger_aot.kernel_src import all_specs
    from liger_aot.runtime import driver

    specs = all_specs()
    assert "triton" not in sys.modules, "triton was imported"
    ours = [a for a in attempts if a[1]]
    assert not ours, f"liger_aot tried to import triton: {ours}"
    assert driver._api is None, "the driver API was opened at import"
    gpu_libs = [n for n in loaded if "cuda" in n or "hip" in n]
    assert not gpu_libs, f"GPU driver libraries loaded at import: {gpu_libs}"
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert "libcuda" not in maps and "libamdhip64" not in maps
    print("OK", len(specs), len(ops), len(attempts))
""")


def test_runtime_imports_without_triton(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run([sys.executable, "-c", NO_TRITON, str(REPO)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("OK"), res.stdout


JIT_SPECIALIZATION = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction
    from liger_aot.kernel_src import all_specs, jit_function, triton_function

    for spec in all_specs():
        fn = jit_function(spec)
        assert isinstance(fn, JITFunction) and fn.fn is triton_function(spec).fn, spec.name
        params = {p.name: p for p in fn.params}
        for param in spec.params:
            p = params[param.name]
            assert p.do_not_specialize == (param.kind != "ptr" and not param.divisible), (
                spec.name, param.name)
            if p.do_not_specialize:  # a value of 1 stays a runtime value, as in the AOT build
                got = native_specialize_impl(BaseBackend, 1, False, False, True)
                assert got == ("i32", None), got
    print("OK", len(all_specs()))
""")


def test_jit_launches_specialize_as_the_aot_build(tmp_path):
    """The tuner and the JIT fallback compile through jit_function, which keeps Triton from
    turning a 1 in a runtime int (a flag such as has_dres) into a constant: the AOT build
    does not, and a tuner that did timed kernels other than the ones shipped."""
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run([sys.executable, "-c", JIT_SPECIALIZATION, str(REPO)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("OK"), res.stdout


# -- the driver launcher, against a stand-in libcuda -----------------------------------------

STUB_LIBCUDA = r"""
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t function, stream, extra;
    unsigned dims[7];
    int calls, ctx_sets, nparams;
    int rcs[4];  /* return codes of the next launches, 0 after */
    unsigned char params[8 * 64];
} record_t;

record_t stub;

int cuInit(unsigned flags) { return 0; }
int cuModuleLoadData(void **m, const void *image) { *m = (void *)0x10; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { *f = (void *)0xF00D; return 0; }
int cuFuncSetAttribute(void *f, int attr, int value) { return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = 0; return 0; }
int cuCtxSetCurrent(void *ctx) { stub.ctx_sets++; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)0x20; return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuGetErrorString(int code, const char **s) { *s = "stub error"; return 0; }

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
    int rc = stub.calls < 4 ? stub.rcs[stub.calls] : 0;
    stub.function = (uint64_t)f;
    stub.stream = (uint64_t)stream;
    stub.extra = (uint64_t)extra;
    memcpy(stub.dims, dims, sizeof dims);
    for (int i = 0; i < stub.nparams && i < 64; i++) memcpy(stub.params + 8 * i, params[i], 8);
    stub.calls++;
    return rc;
}
"""


class _StubRecord(ctypes.Structure):
    _fields_ = [("function", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                ("extra", ctypes.c_uint64), ("dims", ctypes.c_uint * 7),
                ("calls", ctypes.c_int), ("ctx_sets", ctypes.c_int), ("nparams", ctypes.c_int),
                ("rcs", ctypes.c_int * 4), ("params", ctypes.c_ubyte * (8 * 64))]


class _StubModule:
    device_index = 0

    def function(self, name, shared):
        return driver.api().function_handle  # set by the fixture


STREAM = 0x7FAB_CDEF_1230  # above 2**32: a stream passed as a 32-bit int would be cut


@pytest.fixture
def stub_cuda(tmp_path, monkeypatch):
    """driver.api() over a compiled stand-in libcuda that records the last cuLaunchKernel."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the stand-in libcuda")
    src = tmp_path / "stub_libcuda.c"
    src.write_text(STUB_LIBCUDA)
    lib = tmp_path / "libcuda_stub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    real_pydll = ctypes.PyDLL
    monkeypatch.setattr(ctypes, "PyDLL", lambda name, *a, **k: real_pydll(
        str(lib) if name == "libcuda.so.1" else name, *a, **k))
    monkeypatch.setattr(driver.torch.version, "hip", None)
    api = driver._Api("cuda")
    api.function_handle = 0xF00D
    monkeypatch.setattr(driver, "_api", api)
    monkeypatch.setattr(driver, "_get_device", lambda: 0)
    monkeypatch.setattr(driver, "_get_stream", lambda device: STREAM)
    return _StubRecord.in_dll(ctypes.CDLL(str(lib)), "stub")


def _stub_launcher(stub, spec, entry="launch", num_warps=4, shared=0):
    """A driver launcher over the stand-in, called as launch(grid, values, args) whichever
    entry point is tested (the flat one takes the values as separate arguments)."""
    stub.nparams = len(spec.type_string)
    launch = driver.Launcher(_StubModule(), spec.function, spec.type_string, num_warps, 32,
                             shared)
    if entry == "flat":
        return lambda grid, values, args: launch.flat(grid, *values)
    return launch


def _expected_params(spec, values) -> bytes:
    fmt = "<" + "".join(driver._SLOT_FORMAT[c] for c in spec.type_string[:-len("PP")])
    return struct.pack(fmt, *values) + bytes(16)  # hidden trailing pointers: NULL


ENTRIES = ["launch", "flat"]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("spec", [s for s in SPECS if s.name in ("swiglu_fwd", "rms_norm_fwd")],
                         ids=lambda s: s.name)
def test_launcher_passes_everything_to_the_driver(spec, entry, stub_cuda):
    stub = stub_cuda
    launch = _stub_launcher(stub, spec, entry, num_warps=8, shared=1024)
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    for grid, dims in (((5,), (5, 1, 1)), ((5, 3), (5, 3, 1)), ((2, 3, 4), (2, 3, 4)),
                       ([7, 2], (7, 2, 1)), ((2**31 - 1,), (2**31 - 1, 1, 1))):
        calls = stub.calls
        launch(grid, values, tuple(args))
        assert stub.calls == calls + 1
        assert stub.function == 0xF00D
        assert tuple(stub.dims) == dims + (8 * 32, 1, 1, 1024)
        assert stub.stream == STREAM and stub.extra == 0
        assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, values)
    # other values repack the same buffer
    other = tuple(v + 16 if isinstance(v, int) else v * 2 for v in values)
    launch((1,), other, tuple(args))
    assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, other)


@pytest.mark.parametrize("entry", ENTRIES)
def test_launcher_grid_edge_cases(entry, stub_cuda):
    """What the argtypes binding accepted (numpy and 0-d tensor ints) still launches; what it
    refused (floats) still raises ctypes.ArgumentError; an empty grid launches nothing; a
    value the packer refuses is a LaunchError naming the kernel and the values."""
    import numpy as np

    stub = stub_cuda
    spec = next(s for s in SPECS if s.name == "swiglu_fwd")
    launch = _stub_launcher(stub, spec, entry)
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    launch((np.int64(6), torch.tensor(2)), values, args)
    assert stub.calls == 1 and tuple(stub.dims[:3]) == (6, 2, 1)
    assert stub.stream == STREAM
    with pytest.raises(ctypes.ArgumentError):
        launch((2.0,), values, args)
    for grid in ((0,), (3, 0), (1, 1, 0)):
        launch(grid, values, args)
    assert stub.calls == 1
    bad = values[:3] + (1.5,) + values[4:]
    with pytest.raises(driver.LaunchError) as info:
        launch((1,), bad, args)
    assert str(info.value).startswith("liger_aot: bad argument for kernel swiglu_fwd: ")
    assert str(info.value).endswith(f"(values {bad})")
    assert info.value.__suppress_context__
    assert stub.calls == 1


def test_launcher_values_count_and_shared_code(stub_cuda):
    """launch(grid, values, args) with the wrong number of values is the packer's
    LaunchError, launching nothing; launchers of one parameter count share one compiled flat
    entry point (compiled once a process), each bound to its own buffer; a kernel with no
    visible parameters launches too."""
    stub = stub_cuda
    spec = next(s for s in SPECS if s.name == "swiglu_fwd")
    launch = _stub_launcher(stub, spec)
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    with pytest.raises(driver.LaunchError, match=r"bad argument for kernel swiglu_fwd: "
                                                 r"pack_into expected 9 items for packing "
                                                 r"\(got 8\)"):
        launch((1,), values[:-1], args[:-1])
    assert stub.calls == 0
    other = _stub_launcher(stub, spec)
    assert other.flat.__code__ is launch.flat.__code__
    launch((1,), values, args)
    shifted = tuple(v + 16 for v in values)
    other((2,), shifted, args)
    assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, shifted)
    launch((1,), values, args)  # its own buffer still holds its own values
    assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, values)
    assert stub.calls == 3
    bare = driver.Launcher(_StubModule(), "no_params", "PP", 1, 32, 0)
    stub.nparams = 2
    bare((4,), (), ())
    bare.flat((5,))
    assert stub.calls == 5 and tuple(stub.dims[:4]) == (5, 1, 1, 32)
    assert bytes(stub.params[:16]) == bytes(16)


@pytest.mark.parametrize("entry", ENTRIES)
def test_launcher_makes_its_device_current(entry, stub_cuda, monkeypatch):
    """Called while another device is current, a launcher launches inside
    torch.cuda.device(its device) and leaves the caller's device current afterwards."""
    stub = stub_cuda
    current, entered = [1], []

    class DeviceContext:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            entered.append(self.index)
            self.saved, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.saved

    monkeypatch.setattr(driver, "_get_device", lambda: current[0])
    monkeypatch.setattr(driver.torch.cuda, "device", DeviceContext)
    spec = next(s for s in SPECS if s.name == "swiglu_fwd")
    launch = _stub_launcher(stub, spec, entry)  # binds the patched device getter
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    launch((4,), values, args)
    assert entered == [0] and current == [1] and stub.calls == 1
    assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, values)
    current[0] = 0
    launch((4,), values, args)  # already current: no switch
    assert entered == [0] and stub.calls == 2


@pytest.mark.parametrize("entry", ENTRIES)
def test_launcher_driver_errors(entry, stub_cuda):
    stub = stub_cuda
    spec = next(s for s in SPECS if s.name == "swiglu_fwd")
    launch = _stub_launcher(stub, spec, entry)
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    stub.rcs[0], stub.rcs[1] = 201, 0  # CUDA_ERROR_INVALID_CONTEXT: set the context, retry
    launch((3,), values, args)
    assert stub.calls == 2 and stub.ctx_sets == 1 and stub.stream == STREAM
    stub.rcs[2] = 700
    with pytest.raises(driver.LaunchError, match=r"launching swiglu_fwd on grid \(3,\) failed: "
                                                 r"error 700 \(stub error\)"):
        launch((3,), values, args)


@pytest.mark.parametrize("entry", ENTRIES)
def test_launcher_stream_cache(entry, stub_cuda, monkeypatch):
    """The stream handle is converted once per handle and launcher; many distinct streams
    (more than the cache holds) still each reach the driver as they are."""
    stub = stub_cuda
    spec = next(s for s in SPECS if s.name == "swiglu_fwd")
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    current = [0]
    monkeypatch.setattr(driver, "_get_stream", lambda device: current[0])
    launch = _stub_launcher(stub, spec, entry)  # binds the patched stream getter
    streams = [0, STREAM] + [STREAM + 256 * i for i in range(1, 3 * driver._MAX_STREAMS)]
    for s in streams + streams[::-1]:
        current[0] = s
        launch((1,), values, args)
        assert stub.stream == s


def test_kernel_calls_driver_launchers_flat(stub_cuda, monkeypatch):
    """Through Kernel: the first call resolves the launcher and launches through
    launcher(grid, values, args), later ones through launcher.flat; both hand the driver the
    same block. A launcher without a flat entry point (the JIT's, test doubles) is always
    called as launcher(grid, values, args)."""
    stub = stub_cuda
    spec = next(s for s in SPECS if s.name == "rms_norm_fwd")
    stub.nparams = len(spec.type_string)
    made, calls = [], []

    def find_variant(variant, device_index):
        launch = driver.Launcher(_StubModule(), spec.function, spec.type_string,
                                 variant.config.num_warps, 32, 0)
        made.append(launch)
        real_flat = launch.flat

        def flat(grid, *values):
            calls.append("flat")
            return real_flat(grid, *values)

        def protocol(grid, values, args):
            calls.append("launch")
            return launch(grid, values, args)

        protocol.flat = flat
        return registry.Found(arch="sm90", launcher=protocol, where="stub")

    monkeypatch.setattr(registry, "find_variant", find_variant)
    kernel = Kernel(spec)
    args = base_args(spec)
    values = tuple(a.ptr if isinstance(a, FakeTensor) else a for a in args)
    for _ in range(3):
        _launch(kernel, args)
        assert bytes(stub.params[:8 * stub.nparams]) == _expected_params(spec, values)
        assert tuple(stub.dims[:3]) == (3, 1, 1)
    assert calls == ["launch", "flat", "flat"] and len(made) == 1 and stub.calls == 3
    assert list(kernel._flat) == list(kernel._launchers)


def test_kernel_without_flat_entry_point(recorder):
    lookups, launches = recorder
    spec = SPECS[0]
    kernel = Kernel(spec)
    for _ in range(3):
        _launch(kernel, base_args(spec))
    assert len(lookups) == 1 and len(launches) == 3 and not kernel._flat


def test_config_without_fp_fusion():
    # fp_fusion=False reaches Triton's compile options, the variant name and a tuned table's
    # record; a default config's tag and options are as before the field existed
    from liger_aot.kernel_src import tuning
    from liger_aot.kernel_src.rope import spec as rope_spec
    from liger_aot.kernel_src.spec import Config

    plain = Config({"BLOCK": 64}, num_warps=2)
    exact = Config({"BLOCK": 64}, num_warps=2, fp_fusion=False)
    assert plain.tag == "BLOCK=64.w2.s1" and exact.tag == "BLOCK=64.w2.s1.nofma"
    assert "enable_fp_fusion" not in plain.compile_options()
    assert exact.compile_options()["enable_fp_fusion"] is False
    assert "fp_fusion" not in tuning.config_record(plain)
    back = tuning.record_config(tuning.config_record(exact))
    assert back.fp_fusion is False and back.tag == exact.tag
    rope_configs = rope_spec.ROPE.configs + rope_spec.ROPE_WHOLE.configs
    assert all(not c.fp_fusion for c in rope_configs)
    assert all(v.name.endswith(".nofma") for v in rope_spec.ROPE_WHOLE.variants())
