"""Load binaries and launch kernels through the CUDA driver API (libcuda) or HIP's module API
(libamdhip64), with ctypes: no C extension, no compiler, no triton.

Launch cost: the argument block is packed with one precompiled struct.pack_into into a
buffer owned by the launcher, whose parameter-pointer array is built once. The library is
opened with ctypes.PyDLL so the launch call keeps the GIL: no release/reacquire cost, and no
other thread can repack the shared buffer while the driver reads it. The launch entry point
is called without ctypes argtypes (pointer arguments prebuilt as ctypes objects), and each
launcher has a flat entry point generated for its parameter count (see Launcher).

HIP status: written to the same shape as the CUDA path, compiled artifacts checked in CI,
but never run on an AMD GPU (none was available). See README.md, "Unverified".
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading

import torch

from liger_aot.kernel_src.spec import HIDDEN_PARAMS

from .errors import LaunchError, LigerAOTError

# One 8-byte slot per parameter; hidden trailing pointers are passed as NULL (their
# scratch sizes are checked to be 0 when the manifest is read).
_SLOT_FORMAT = {"P": "Q", "l": "q", "i": "i4x", "f": "f4x"}

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CUDA_ERROR_INVALID_CONTEXT = 201
_STATIC_SHARED_LIMIT = 48 * 1024


class _Api:
    """The handful of driver entry points, for CUDA or HIP."""

    def __init__(self, backend: str):
        self.backend = backend
        c_void_p, c_int, c_uint = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        if backend == "cuda":
            lib = ctypes.PyDLL("libcuda.so.1")
            names = dict(init="cuInit", load="cuModuleLoadData", get_function="cuModuleGetFunction",
                         launch="cuLaunchKernel", error_string="cuGetErrorString")
        else:
            lib = ctypes.PyDLL("libamdhip64.so")
            names = dict(init="hipInit", load="hipModuleLoadData",
                         get_function="hipModuleGetFunction",
                         launch="hipModuleLaunchKernel", error_string=None)
        self.lib = lib
        self.init = getattr(lib, names["init"])
        self.init.argtypes, self.init.restype = [c_uint], c_int
        self.load = getattr(lib, names["load"])
        self.load.argtypes, self.load.restype = [ctypes.POINTER(c_void_p), c_void_p], c_int
        self.get_function = getattr(lib, names["get_function"])
        self.get_function.argtypes = [ctypes.POINTER(c_void_p), c_void_p, ctypes.c_char_p]
        self.get_function.restype = c_int
        self.launch = getattr(lib, names["launch"])
        self.launch.argtypes = [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                                c_void_p, c_void_p, c_void_p]
        self.launch.restype = c_int
        # The same entry point without argtypes, for the launchers' hot path: ctypes then
        # converts each argument directly (ints as 32-bit C ints, ctypes objects and None as
        # pointers) instead of through one from_param call per argtype (~0.7 us per launch).
        # Callers pass the pointer arguments as c_void_p objects (see Launcher).
        self.launch_unchecked = lib[names["launch"]]  # indexing gives a separate function object
        self.launch_unchecked.restype = c_int
        if backend == "cuda":
            self.set_attribute = lib.cuFuncSetAttribute
            self.set_attribute.argtypes, self.set_attribute.restype = [c_void_p, c_int, c_int], c_int
            self.ctx_get_current = lib.cuCtxGetCurrent
            self.ctx_get_current.argtypes = [ctypes.POINTER(c_void_p)]
            self.ctx_set_current = lib.cuCtxSetCurrent
            self.ctx_set_current.argtypes = [c_void_p]
            self.primary_ctx_retain = lib.cuDevicePrimaryCtxRetain
            self.primary_ctx_retain.argtypes = [ctypes.POINTER(c_void_p), c_int]
            self.device_get = lib.cuDeviceGet
            self.device_get.argtypes = [ctypes.POINTER(c_int), c_int]
            self.error_string_fn = lib.cuGetErrorString
            self.error_string_fn.argtypes = [c_int, ctypes.POINTER(ctypes.c_char_p)]
        else:
            self.error_string_fn = lib.hipGetErrorString
            self.error_string_fn.argtypes, self.error_string_fn.restype = [c_int], ctypes.c_char_p
        self.check(self.init(0), "init")

    def error_string(self, code: int) -> str:
        try:
            if self.backend == "cuda":
                out = ctypes.c_char_p()
                self.error_string_fn(code, ctypes.byref(out))
                text = out.value
            else:
                text = self.error_string_fn(code)
            return text.decode() if text else "unknown error"
        except Exception:  # the message must never mask the original failure
            return "unknown error"

    def check(self, code: int, what: str):
        if code != 0:
            raise LigerAOTError(f"liger_aot: {self.backend} driver call {what} failed: "
                                f"error {code} ({self.error_string(code)})")

    def make_context_current(self, device_index: int):
        """Make the device's primary context (the one torch uses) current on this thread."""
        if self.backend != "cuda":
            return
        device = ctypes.c_int()
        self.check(self.device_get(ctypes.byref(device), device_index), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(self.primary_ctx_retain(ctypes.byref(ctx), device.value),
                   "cuDevicePrimaryCtxRetain")
        self.check(self.ctx_set_current(ctx), "cuCtxSetCurrent")


_api = None
_api_lock = threading.Lock()


def api() -> _Api:
    global _api
    if _api is None:
        with _api_lock:
            if _api is None:
                _api = _Api("hip" if torch.version.hip else "cuda")
    return _api


class LoadedModule:
    """A binary loaded on one device; keeps the module handle alive."""

    def __init__(self, image: bytes, device_index: int):
        a = api()
        self.device_index = device_index
        self._image = ctypes.create_string_buffer(image, len(image))
        with torch.cuda.device(device_index):
            torch.cuda.init()
            a.make_context_current(device_index)
            handle = ctypes.c_void_p()
            a.check(a.load(ctypes.byref(handle), self._image), "module load")
        self.handle = handle

    def function(self, name: str, shared: int):
        a = api()
        fn = ctypes.c_void_p()
        a.check(a.get_function(ctypes.byref(fn), self.handle, name.encode()),
                f"get function {name}")
        if a.backend == "cuda" and shared > _STATIC_SHARED_LIMIT:
            a.check(a.set_attribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
                    f"set max dynamic shared memory of {name} to {shared}")
        return fn.value


# Hot-path bindings. CPU-only torch builds lack them: fall back to the public API there, so
# that this module still imports (it never launches anything without a GPU).
_get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)


def Launcher(module: LoadedModule, name: str, type_string: str, num_warps: int,  # noqa: N802
             warp_size: int, shared: int):
    """A launch function for one loaded kernel: launch(grid, values, args), where `values`
    are the launch arguments with tensors already replaced by their data pointers; and the
    same as launch.flat(grid, *values), which takes the values as separate arguments (what
    Kernel calls: no tuple to build and unpack per launch).

    Everything constant is bound as a closure variable; the hidden trailing parameters are
    zeroed once in the buffer and never repacked. Only flat is generated code, compiled once
    per parameter count (_flat_code: a cold process builds a launcher a variant, and the
    compile was most of that); launch unpacks its values into flat. The driver call goes
    through the entry point without argtypes (api().launch_unchecked) with the function
    handle and the parameter array as prebuilt ctypes objects and the stream as a cached
    c_void_p; a grid value that call cannot convert (e.g. a numpy integer) is retried through
    the argtypes binding, so what is accepted and what is refused, with which error, is
    unchanged."""
    a = api()
    function = module.function(name, shared)
    n = len(type_string)
    visible = type_string[:n - len(HIDDEN_PARAMS)]
    count = len(visible)
    buffer = ctypes.create_string_buffer(8 * n)  # zero-filled: hidden pointers stay NULL
    base = ctypes.addressof(buffer)
    params = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
    function_p = ctypes.c_void_p(function)
    device, threads = module.device_index, num_warps * warp_size
    get_stream = _get_stream  # bound now, as the generated code binds it
    streams = {}  # raw stream handle -> c_void_p, see _stream_pointer

    # The rare paths, out of the generated code (smaller code compiles faster):
    def on_device(grid, values):  # called while another device is current
        with torch.cuda.device(device):
            return flat(grid, *values)

    def launch_checked(gx, gy, gz, stream):  # a grid value the unchecked call cannot convert
        return a.launch(function, gx, gy, gz, threads, 1, 1, shared, stream, params, None)

    def retry_or_fail(rc, grid, gx, gy, gz):
        if rc == _CUDA_ERROR_INVALID_CONTEXT and a.backend == "cuda":
            a.make_context_current(device)  # a thread torch never set up
            stream = get_stream(device)
            try:
                rc = a.launch_unchecked(function_p, gx, gy, gz, threads, 1, 1, shared,
                                        _stream_pointer(streams, stream), params, None)
            except ctypes.ArgumentError:
                rc = launch_checked(gx, gy, gz, stream)
        if rc:
            raise LaunchError(f"liger_aot: launching {name} on grid {tuple(grid)} failed: "
                              f"error {rc} ({api().error_string(rc)})")

    def bad_argument(e, values):
        raise LaunchError(f"liger_aot: bad argument for kernel {name}: {e} "
                          f"(values {values})") from None

    namespace = {
        "ctypes": ctypes, "struct": struct,
        "pack": struct.Struct("<" + "".join(_SLOT_FORMAT[c] for c in visible)).pack_into,
        "buffer": buffer, "params": params, "launch_c": a.launch_unchecked,
        "launch_checked": launch_checked, "function_p": function_p, "device": device,
        "threads": threads, "shared": shared, "get_device": _get_device,
        "get_stream": get_stream, "streams": streams, "stream_pointer": _stream_pointer,
        "on_device": on_device, "retry_or_fail": retry_or_fail, "bad_argument": bad_argument,
    }
    exec(_flat_code(count), namespace)  # noqa: S102 - source built from a count
    flat = namespace["flat"]

    def launch(grid, values, args):
        if len(values) != count:  # as the packer says it, rather than flat's TypeError
            bad_argument(struct.error(f"pack_into expected {count} items for packing (got "
                                      f"{len(values)})"), values)
        return flat(grid, *values)

    for f in (launch, flat):
        f.kernel_name = name
        f.module = module  # keeps the module (and its image) alive with the launcher
    launch.flat = flat
    return launch


# The body of a launcher's flat entry point, flat(grid, v0, v1, ...): the launch path only,
# the rare paths are the launcher's closures. Names not defined here are constants of the
# launcher (Launcher's namespace).
_FLAT_BODY = """
    if get_device() != device:
        return on_device(grid, (VS,))
    k = len(grid)
    gx = grid[0]
    gy = grid[1] if k > 1 else 1
    gz = grid[2] if k > 2 else 1
    if not (gx and gy and gz):
        return
    try:
        pack(buffer, 0, VS)
    except struct.error as e:
        bad_argument(e, (VS,))
    stream = get_stream(device)
    sp = streams.get(stream)
    if sp is None:
        sp = stream_pointer(streams, stream)
    try:
        rc = launch_c(function_p, gx, gy, gz, threads, 1, 1, shared, sp, params, None)
    except ctypes.ArgumentError:  # raised before the call: nothing was launched
        rc = launch_checked(gx, gy, gz, stream)
    if rc:
        retry_or_fail(rc, grid, gx, gy, gz)
"""


def _flat_source(count: int) -> str:
    vs = ", ".join(f"v{i}" for i in range(count))
    header = f"def flat(grid{', ' if count else ''}{vs}):"
    # with no values, "(VS,)" must still be an empty tuple and pack takes no values
    return header + (_FLAT_BODY.replace("(VS,)", f"({vs},)" if count else "()")
                     .replace(", VS", f", {vs}" if count else ""))


@functools.lru_cache(maxsize=None)
def _flat_code(count: int):
    """flat's code for `count` values, compiled once per process: executing it in a
    launcher's namespace defines that launcher's flat."""
    return compile(_flat_source(count), f"<liger_aot launcher, {count} values>", "exec")


_MAX_STREAMS = 64  # per launcher; more distinct streams than this just start the cache over


def _stream_pointer(streams: dict, stream: int):
    """The stream handle as a c_void_p (the unchecked launch call needs pointer arguments as
    ctypes objects: a plain int would be passed as a 32-bit C int), cached per handle."""
    if len(streams) >= _MAX_STREAMS:
        streams.clear()
    sp = streams[stream] = ctypes.c_void_p(stream)
    return sp
