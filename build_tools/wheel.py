"""Wheel packer: the pure-Python package wheel and one artifact wheel per arch.

  liger_aot-<ver>-py3-none-any.whl       the package (runtime, ops, kernel sources, CLI)
  liger_aot_sm90-<ver>-py3-none-any.whl  package liger_aot_sm90: manifest + cubins; requires
                                         liger-aot==<ver>

Arch wheels hold disjoint files, so several install side by side (a mixed cluster's image) and
the runtime picks the one that fits the device. Written directly with zipfile (the format is
small: PEP 427) so packing needs no build backend and no network, and is reproducible: entries
are sorted and time-stamped with SOURCE_DATE_EPOCH (default 2020-01-01).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import time
import zipfile

import liger_aot
from liger_aot.artifact_format import TARGETS, WHEEL_DIST, WHEEL_PACKAGE, validate_manifest

from .aot import atomic_write

PACKAGE_ROOT = os.path.dirname(os.path.abspath(liger_aot.__file__))
REQUIRES = ("torch>=2.11", "filelock>=3.12")
BUILD_EXTRA = ("triton==3.6.*", "transformers>=5,<6")


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _timestamp():
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "1577836800"))
    return time.gmtime(max(epoch, 315532800))[:6]  # zip cannot hold dates before 1980


def write_wheel(path: str, files: dict, dist_name: str, version: str, metadata_lines: list,
                entry_points: str = ""):
    """files: archive name -> bytes. Writes the wheel atomically and returns its path."""
    dist_info = f"{dist_name.replace('-', '_')}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {dist_name}", f"Version: {version}"]
    meta += metadata_lines
    files = dict(files)
    files[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: liger-aot build_tools.wheel\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()
    if entry_points:
        files[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    top = sorted({name.split("/")[0] for name in files if not name.startswith(dist_info)})
    files[f"{dist_info}/top_level.txt"] = ("\n".join(top) + "\n").encode()
    record_name = f"{dist_info}/RECORD"
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(files.items())]
    record.append(f"{record_name},,")
    files[record_name] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    stamp = _timestamp()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        names = sorted(n for n in files if n != record_name) + [record_name]  # RECORD last
        for name in names:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, buffer.getvalue())
    return path


def package_files() -> dict:
    """The liger_aot package as archive name -> bytes (symlinked kernel_src and build_tools
    followed; caches and compiled files skipped)."""
    files = {}
    for root, dirs, names in os.walk(PACKAGE_ROOT, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, os.path.dirname(PACKAGE_ROOT)).replace(os.sep, "/")
            with open(full, "rb") as f:
                files[rel] = f.read()
    return files


def pack_package(out_dir: str) -> str:
    version = liger_aot.__version__
    lines = ["Summary: Liger-style Triton training kernels compiled ahead of time",
             "Requires-Python: >=3.10"]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    lines += ["Provides-Extra: build"] + [f"Requires-Dist: {r}; extra == \"build\""
                                         for r in BUILD_EXTRA]
    path = os.path.join(out_dir, f"liger_aot-{version}-py3-none-any.whl")
    return write_wheel(path, package_files(), "liger-aot", version, lines,
                       entry_points="[console_scripts]\nliger-aot = liger_aot.cli:main\n")


def pack_arch(arch: str, build_dir: str, out_dir: str) -> str:
    """Pack <build_dir>/<arch> (manifest + every binary it names, checked) into a wheel."""
    if arch not in TARGETS:
        raise ValueError(f"unknown arch {arch!r}: choose from {', '.join(TARGETS)}")
    version = liger_aot.__version__
    directory = os.path.join(build_dir, arch)
    manifest_path = os.path.join(directory, "manifest.json")
    try:
        with open(manifest_path, "rb") as f:
            manifest_bytes = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{manifest_path} does not exist: run "
                                f"`liger-aot build --arch {arch}` first") from None
    manifest = json.loads(manifest_bytes)
    reason = validate_manifest(manifest, arch)
    if reason:
        raise ValueError(f"{manifest_path}: {reason}")
    package = WHEEL_PACKAGE.format(arch=arch)
    files = {
        f"{package}/__init__.py": (f'"""liger-aot ahead-of-time kernels for {arch}: data only, '
                                   f'found by liger_aot.runtime without importing it."""\n'
                                   ).encode(),
        f"{package}/manifest.json": manifest_bytes,
    }
    for name, entry in manifest["variants"].items():
        with open(os.path.join(directory, entry["file"]), "rb") as f:
            image = f.read()
        if hashlib.sha256(image).hexdigest() != entry["sha256"]:
            raise ValueError(f"{directory}/{entry['file']} ({name}) does not match its "
                             f"manifest sha256: rebuild with `liger-aot build --arch {arch}`")
        files[f"{package}/{entry['file']}"] = image
    dist = WHEEL_DIST.format(arch=arch)
    lines = [f"Summary: liger-aot kernels compiled ahead of time for {arch} "
             f"(Triton {manifest['triton_version']})",
             f"Requires-Dist: liger-aot=={version}"]
    path = os.path.join(out_dir, f"{dist.replace('-', '_')}-{version}-py3-none-any.whl")
    return write_wheel(path, files, dist, version, lines)
