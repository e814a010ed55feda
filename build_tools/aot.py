"""Ahead-of-time build: every variant of every spec, compiled for explicit targets.

Output layout, per arch:  <out>/<arch>/manifest.json  and  <out>/<arch>/<key>.<cubin|hsaco>
(plus <key>.meta.json, the per-variant record that marks a binary as complete).

Guarantees:
- Content-addressed keys (kernel source, Triton and ptxas versions, target, signature,
  constexprs, hints, options): a rebuild with nothing changed compiles nothing.
- An arch with a tuned table (kernel_src/tuned/<arch>.json) also compiles the configs it chose;
  the manifest records the table's sha256, which the runtime checks before using the table.
- One build per arch directory at a time (filelock); every file is written to a temporary
  name and renamed into place, binary first, then its .meta.json, then the manifest. A build
  killed at any point leaves either complete files or temporaries that the next build
  removes; the runtime also checks every binary's size and sha256 against the manifest.
"""
from __future__ import annotations

import concurrent.futures as futures
import hashlib
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass

from filelock import FileLock, Timeout

from liger_aot.kernel_src import all_specs, tuning
from liger_aot.artifact_format import BINARY_EXT, MANIFEST_FORMAT, TARGETS, launch_abi_of

BUILDER_VERSION = 1  # bump when the build's output for the same inputs changes


def parse_archs(text: str) -> list:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    if not archs:
        raise ValueError("no arch given: use --arch with one or more of " + ",".join(TARGETS))
    unknown = [a for a in archs if a not in TARGETS]
    if unknown:
        raise ValueError(f"unknown arch {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    return list(dict.fromkeys(archs))


def atomic_write(path: str, data: bytes):
    """Write to a temporary file in the same directory, fsync, then rename over `path`."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# -- per-variant work (runs in worker processes) --------------------------------------------

def _toolchain(backend: str) -> dict:
    import triton

    info = {"triton_version": triton.__version__, "ptxas_version": None}
    if backend == "cuda":
        from triton.backends.nvidia.compiler import get_ptxas_version

        text = get_ptxas_version()
        match = re.search(r"V(\d+\.\d+\.\d+)", text)
        info["ptxas_version"] = match.group(1) if match else text.strip()
    return info


def variant_key(variant, arch: str, toolchain: dict) -> str:
    backend, target_arch, warp = TARGETS[arch]
    record = {
        "builder": BUILDER_VERSION,
        "source_sha256": variant.spec.source_sha256(),
        "function": variant.spec.function,
        "toolchain": toolchain,
        "target": [backend, target_arch, warp],
        "signature": variant.signature(),
        "constexprs": {k: repr(v) for k, v in variant.constexprs().items()},
        "attrs": sorted(str(i) for i in variant.divisibility_attrs()),
        "options": [variant.config.num_warps, variant.config.num_stages]
        + ([variant.config.maxnreg] if variant.config.maxnreg else []),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _worker_init():
    os.environ.pop("TRITON_INTERPRET", None)  # compile for real even if the parent interprets


def _job(variant, arch: str, key: str, directory: str, toolchain: dict) -> tuple:
    """A compile job. It describes its variant in full (config included), so the worker needs
    neither the tuned table nor the parent's objects."""
    described = (variant.spec.name, variant.dtype, variant.align, variant.options,
                 tuning.config_record(variant.config))
    return variant.name, arch, key, directory, toolchain, described


def _described_variant(name: str, described: tuple):
    spec_name, dtype, align, options, record = described
    spec = next(s for s in all_specs() if s.name == spec_name)
    variant = spec.variant(dtype, align, options, tuning.record_config(record))
    assert variant.name == name, (variant.name, name)
    return variant


def compile_variant(job: tuple) -> dict:
    """Compile one variant and write <key>.<ext> and <key>.meta.json. Runs in a worker."""
    name, arch, key, directory, toolchain, described = job
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from liger_aot.kernel_src import is_gluon, triton_function

    variant = _described_variant(name, described)
    backend, target_arch, warp = TARGETS[arch]
    started = time.perf_counter()
    fn = triton_function(variant.spec, variant.config)
    if is_gluon(fn):  # a staged config's kernel (kernel_src/staged_rows.py)
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    source = ASTSource(fn, signature=variant.signature(),
                       constexprs=variant.constexprs(), attrs=variant.divisibility_attrs())
    compiled = triton.compile(source, target=GPUTarget(backend, target_arch, warp),
                              options=variant.config.compile_options())
    ext = BINARY_EXT[backend]
    image = compiled.asm[ext]
    md = compiled.metadata
    meta = {
        "key": key,
        "file": f"{key}.{ext}",
        "kernel_name": md.name,
        "type_string": variant.spec.type_string,
        "num_warps": md.num_warps,
        "num_stages": md.num_stages,
        "shared": md.shared,
        "global_scratch_size": getattr(md, "global_scratch_size", 0) or 0,
        "profile_scratch_size": getattr(md, "profile_scratch_size", 0) or 0,
        "sha256": hashlib.sha256(image).hexdigest(),
        "size": len(image),
        "source_sha256": variant.spec.source_sha256(),
        "triton_version": toolchain["triton_version"],
        "ptxas_version": toolchain["ptxas_version"],
    }
    atomic_write(os.path.join(directory, meta["file"]), image)
    atomic_write(os.path.join(directory, f"{key}.meta.json"),
                 json.dumps(meta, sort_keys=True).encode())
    meta["seconds"] = time.perf_counter() - started
    return meta


def load_complete(directory: str, key: str) -> dict | None:
    """The meta record of an already-built key whose binary is intact, else None."""
    try:
        with open(os.path.join(directory, f"{key}.meta.json"), "rb") as f:
            meta = json.loads(f.read())
        path = os.path.join(directory, meta["file"])
        if os.path.getsize(path) != meta["size"] or sha256_file(path) != meta["sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError):
        return None


# -- orchestration -----------------------------------------------------------------------

@dataclass
class ArchResult:
    arch: str
    variants: int = 0
    compiled: int = 0
    reused: int = 0
    removed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failed: int = 0


class Progress:
    """One updating line on a terminal; a line every few seconds otherwise (CI logs)."""

    def __init__(self, arch: str, total: int, stream=sys.stdout):
        self.arch, self.total, self.stream = arch, total, stream
        self.done = 0
        self.tty = stream.isatty()
        self.started = self.last = time.perf_counter()

    def step(self, name: str):
        self.done += 1
        now = time.perf_counter()
        if self.tty:
            self.stream.write(f"\r[{self.arch}] {self.done}/{self.total} compiled  "
                              f"{now - self.started:6.1f}s  {name[:60]:<60}")
            self.stream.flush()
        elif now - self.last > 5 or self.done == self.total:
            self.last = now
            print(f"[{self.arch}] {self.done}/{self.total} compiled, "
                  f"{now - self.started:.1f}s", file=self.stream, flush=True)

    def close(self):
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _clean_temporaries(directory: str) -> int:
    removed = 0
    for name in os.listdir(directory):
        if name.startswith(".tmp-"):
            os.unlink(os.path.join(directory, name))
            removed += 1
    return removed


def plan_arch(arch: str, toolchain: dict) -> dict:
    """variant name -> (variant, key): everything the arch's build holds."""
    return {v.name: (v, variant_key(v, arch, toolchain))
            for spec in all_specs() for v in spec.variants(arch)}


def build_arch(arch: str, out: str, pool, log=print, lock_timeout: float = -1) -> ArchResult:
    backend = TARGETS[arch][0]
    directory = os.path.join(out, arch)
    os.makedirs(directory, exist_ok=True)
    result = ArchResult(arch)
    started = time.perf_counter()
    lock = FileLock(os.path.join(directory, ".build.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"[{arch}] another build holds {lock.lock_file}; waiting for it")
        lock.acquire(timeout=lock_timeout)
    try:
        leftovers = _clean_temporaries(directory)
        if leftovers:
            log(f"[{arch}] removed {leftovers} temporary file(s) left by an interrupted build")
        toolchain = _toolchain(backend)
        plan = plan_arch(arch, toolchain)
        result.variants = len(plan)
        entries, todo = {}, []
        for name, (variant, key) in plan.items():
            meta = load_complete(directory, key)
            if meta is None:
                todo.append(_job(variant, arch, key, directory, toolchain))
            else:
                entries[name] = meta
        result.reused = len(entries)
        if todo:
            progress = Progress(arch, len(todo))
            pending = {pool.submit(compile_variant, job): job[0] for job in todo}
            errors = []
            for fut in futures.as_completed(pending):
                name = pending[fut]
                try:
                    meta = fut.result()
                except Exception as e:  # report every failure, keep the rest
                    errors.append(f"{name}: {type(e).__name__}: {e}")
                    continue
                meta.pop("seconds", None)
                entries[name] = meta
                result.compiled += 1
                progress.step(name)
            progress.close()
            if errors:
                result.failed = len(errors)
                for line in errors[:20]:
                    log(f"[{arch}] FAILED {line}")
                raise RuntimeError(f"{len(errors)} variant(s) of {arch} failed to compile; "
                                   f"the manifest was not updated")
        manifest = {
            "format": MANIFEST_FORMAT,
            "arch": arch,
            "target": list(TARGETS[arch]),
            "launch_abi": launch_abi_of(toolchain["triton_version"]),
            "triton_version": toolchain["triton_version"],
            "ptxas_version": toolchain["ptxas_version"],
            "tuned_sha256": tuning.table_sha256(arch),
            "variants": {name: {k: v for k, v in entries[name].items()
                                if k not in ("triton_version", "ptxas_version")}
                         for name in sorted(entries)},
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        manifest_path = os.path.join(directory, "manifest.json")
        try:
            with open(manifest_path, "rb") as f:
                unchanged = f.read() == data
        except OSError:
            unchanged = False
        if not unchanged:
            atomic_write(manifest_path, data)
        keep = {m["file"] for m in entries.values()} | {f"{m['key']}.meta.json"
                                                        for m in entries.values()}
        for name in os.listdir(directory):
            if name.endswith((".cubin", ".hsaco", ".meta.json")) and name not in keep:
                os.unlink(os.path.join(directory, name))
                result.removed += 1
        result.bytes = sum(m["size"] for m in entries.values())
    finally:
        lock.release()
    result.seconds = time.perf_counter() - started
    return result


def build(archs: list, out: str, jobs: int, log=print) -> list:
    """Build every arch; returns one ArchResult each. Raises on a compile failure."""
    os.makedirs(out, exist_ok=True)
    jobs = max(1, jobs)
    ctx = multiprocessing.get_context("spawn")  # workers import triton, never torch
    results = []
    with futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx,
                                     initializer=_worker_init) as pool:
        for arch in archs:
            results.append(build_arch(arch, out, pool, log=log))
    return results


def format_summary(results: list, total_seconds: float) -> str:
    lines = [f"{'arch':<8} {'variants':>8} {'compiled':>8} {'reused':>7} {'removed':>7} "
             f"{'bytes':>12} {'seconds':>8}"]
    for r in results:
        lines.append(f"{r.arch:<8} {r.variants:>8} {r.compiled:>8} {r.reused:>7} {r.removed:>7} "
                     f"{r.bytes:>12,} {r.seconds:>8.1f}")
    compiled = sum(r.compiled for r in results)
    lines.append(f"total {total_seconds:.1f}s; " + (
        f"compiled {compiled} variant(s)" if compiled else "nothing to compile: up to date"))
    return "\n".join(lines)
