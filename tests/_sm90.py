"""Compiles one variant for sm90 in a child process (this one may run Triton's interpreter,
which Gluon cannot use) and reports what ptxas made of it: shared memory, registers, local
memory, stack (where ptxas's spills go) and the PTX. Shared by the staged kernels' tests."""
import json
import os
import re
import subprocess
import sys

from liger_aot.kernel_src import tuning

_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from liger_aot.kernel_src import all_specs, is_gluon, triton_function, tuning
from _sm90 import sm90_usage

name, options, record = json.loads(sys.argv[1])
spec = next(s for s in all_specs() if s.name == name)
variant = spec.variant("bf16", "a16", tuple(map(tuple, options)), tuning.record_config(record))
fn = triton_function(spec, variant.config)
source = (GluonASTSource if is_gluon(fn) else ASTSource)(
    fn, signature=variant.signature(), constexprs=variant.constexprs(),
    attrs=variant.divisibility_attrs())
kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                        options=variant.config.compile_options())
print(json.dumps({"shared": kernel.metadata.shared, "ptx": kernel.asm["ptx"],
                  **sm90_usage(kernel.asm["cubin"])}))
"""

SM90_SHARED_PER_BLOCK = 232448  # bytes: 227 KB a block
SM90_SHARED_PER_SM = 233472  # 228 KB an SM, of which each resident block reserves 1 KB
SM90_REGISTERS = 65536
SM90_SCHEDULERS = 4  # warp schedulers an SM, each holding its warps in a quarter of the file
SM90_REGISTER_UNIT = 256  # registers a warp's allocation is rounded up to
SM90_WARPS = 64  # resident warps an SM
SM90_BLOCKS = 32  # resident blocks an SM


def sm90_usage(cubin: bytes) -> dict:
    """ptxas's resource usage of a cubin, from Triton's cuobjdump: {"regs": registers a
    thread, "local": local memory bytes, "stack": stack bytes, where ptxas's spills show (as
    STL/LDL in the SASS), not under local}."""
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    return {key: int(re.search(rf"{word}:(\d+)", usage).group(1))
            for key, word in (("regs", "REG"), ("local", "LOCAL"), ("stack", "STACK"))}


def compile_sm90(spec, options, config) -> dict:
    """Compile the bf16 aligned variant of `spec` with `options` and `config` for sm90 in a
    child process: {"shared", "ptx", "regs", "local", "stack"}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the child imports sm90_usage from this folder
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.path.dirname(os.path.abspath(
        __file__)), env.get("PYTHONPATH"))))
    arg = json.dumps([spec.name, options, tuning.config_record(config)])
    done = subprocess.run([sys.executable, "-c", _COMPILE, arg], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def programs_fit(kernel: dict, config, programs_per_sm: int) -> bool:
    """Whether `programs_per_sm` programs of a compile_sm90 result fit an SM at once: their
    warps (config.num_warps each) in the registers, where a warp takes its registers x 32
    rounded up to SM90_REGISTER_UNIT and each scheduler holds whole warps in its quarter of
    the file, and their shared memory (1 KB reserved a block). The quarters matter: on an
    H200, 2-warp programs of 84 registers fit 10 an SM, not the 11 that the whole file's
    count allows (Nsight Compute's block limit; 11 an SM ran 30% slower, its last programs
    waiting for others to finish; docs/perf-notes.md, session 22)."""
    per_warp = -(-kernel["regs"] * 32 // SM90_REGISTER_UNIT) * SM90_REGISTER_UNIT
    warps = SM90_SCHEDULERS * (SM90_REGISTERS // SM90_SCHEDULERS // per_warp)
    return (config.num_warps * programs_per_sm <= min(warps, SM90_WARPS)
            and programs_per_sm <= SM90_BLOCKS
            and (kernel["shared"] + 1024) * programs_per_sm <= SM90_SHARED_PER_SM)


def assert_resident(kernel: dict, config, programs_per_sm: int):
    """A compile_sm90 result within what its grid assumes: registers under the config's
    cap, shared memory within a block's, and exactly `programs_per_sm` programs resident at
    once (a kernel whose programs wait on each other needs them all running; twice as many
    must not fit, or the check could not refuse)."""
    assert kernel["regs"] <= config.maxnreg
    assert kernel["shared"] <= SM90_SHARED_PER_BLOCK
    assert programs_fit(kernel, config, programs_per_sm)
    assert not programs_fit(kernel, config, 2 * programs_per_sm)


def entry_params(ptx: str) -> int:
    """The number of parameters of the PTX's kernel entry."""
    entry = ptx[ptx.index(".entry"):]
    return entry[:entry.index(")")].count(".param")
