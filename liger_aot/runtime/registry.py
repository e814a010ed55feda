"""Artifact sets: where compiled variants are found, and the checks before one is trusted.

Sources, searched in this order for the device's arch:
  1. LIGER_AOT_ARTIFACT_DIR (one or more roots, each holding <arch>/manifest.json)
  2. installed arch wheels: the package liger_aot_<arch> (found without importing it)
  3. the local build cache (`liger-aot build` default output, LIGER_AOT_CACHE_DIR)

A manifest or binary that fails a check is refused with a warning that says what and where,
and the variant is then treated as missing (JIT fallback, or an error in strict mode).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
import warnings
from dataclasses import dataclass, field

from liger_aot.artifact_format import TARGETS, WHEEL_PACKAGE, validate_manifest
from liger_aot.kernel_src import tuning
from liger_aot.kernel_src.spec import family_source_sha256

from . import _env
from .device import device_arch


@dataclass
class ArtifactSet:
    arch: str
    directory: str
    source: str  # "env" | "wheel" | "cache"
    manifest: dict | None = None
    error: str | None = None  # why the whole set was refused
    modules: dict = field(default_factory=dict)  # (file, device_index) -> LoadedModule

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.directory, "manifest.json")


def candidate_dirs(arch: str):
    for root in _env.artifact_dirs():
        for d in (os.path.join(root, arch), root):
            if os.path.isfile(os.path.join(d, "manifest.json")):
                yield d, "env"
                break
    try:
        spec = importlib.util.find_spec(WHEEL_PACKAGE.format(arch=arch))
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        yield list(spec.submodule_search_locations)[0], "wheel"
    if "cache" not in _env.disabled_sources():
        d = os.path.join(_env.cache_dir(), arch)
        if os.path.isfile(os.path.join(d, "manifest.json")):
            yield d, "cache"


def load_set(directory: str, source: str, arch: str) -> ArtifactSet:
    s = ArtifactSet(arch=arch, directory=directory, source=source)
    try:
        with open(s.manifest_path, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        s.error = f"{s.manifest_path}: missing"
        return s
    except (OSError, ValueError) as e:
        s.error = f"{s.manifest_path}: unreadable ({e})"
        return s
    reason = validate_manifest(manifest, arch)
    if reason:
        s.error = f"{s.manifest_path}: {reason}"
    else:
        s.manifest = manifest
    return s


_sets: dict = {}
_sets_lock = threading.Lock()
_warned: set = set()


def artifact_sets(arch: str) -> list:
    """The artifact sets for `arch`, in search order. Read once per process."""
    with _sets_lock:
        sets = _sets.get(arch)
        if sets is None:
            sets = []
            seen = set()
            for directory, source in candidate_dirs(arch):
                real = os.path.realpath(directory)
                if real in seen:
                    continue
                seen.add(real)
                s = load_set(directory, source, arch)
                if s.error:
                    _refuse(s.error)
                sets.append(s)
            _sets[arch] = sets
        return sets


def reset():
    """Forget discovered sets and loaded modules (tests; after installing a wheel)."""
    with _sets_lock:
        _sets.clear()
        _warned.clear()


def tuned_table_usable(arch: str) -> bool:
    """Whether the runtime may pick configs from the arch's tuned table: it has one, and the
    first usable artifact set was built with it (the manifest's tuned_sha256), or there is no
    set (the JIT compiles any config). A set built with another table or none lacks the
    tuned variants: warn once and keep the heuristic configs."""
    digest = tuning.table_sha256(arch)
    if digest is None:
        return False
    for s in artifact_sets(arch):
        if s.manifest is None:
            continue
        if s.manifest.get("tuned_sha256") == digest:
            return True
        message = (f"liger_aot: {s.manifest_path} was built with another tuned table than "
                   f"{tuning.table_path(arch)}; using the heuristic configs. Rebuild with "
                   f"`liger-aot build --arch {arch}`.")
        if message not in _warned:
            _warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)
        return False
    return True


def _refuse(message: str):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"liger_aot: refused {message}", RuntimeWarning, stacklevel=3)


def check_entry(entry: dict, variant, path: str) -> tuple:
    """(binary bytes, None) if the entry and the file on disk pass every check,
    else (None, reason)."""
    spec = variant.spec
    if entry.get("type_string") != spec.type_string:
        return None, (f"{path}: parameter types {entry.get('type_string')!r} differ from the "
                      f"spec's {spec.type_string!r}")
    missing = [k for k, kind in (("kernel_name", str), ("num_warps", int), ("shared", int))
               if not isinstance(entry.get(k), kind)]
    if missing:
        return None, f"{path}: manifest entry has no valid {', '.join(missing)}"
    if entry.get("source_sha256") != family_source_sha256(spec.family):
        return None, f"{path}: built from other kernel source than the installed {spec.family}"
    if entry.get("global_scratch_size", 0) or entry.get("profile_scratch_size", 0):
        return None, f"{path}: needs scratch memory, which this loader does not provide"
    try:
        with open(path, "rb") as f:
            image = f.read()
    except OSError as e:
        return None, f"{path}: unreadable ({e.strerror})"
    if len(image) != entry.get("size"):
        return None, f"{path}: {len(image)} bytes, manifest says {entry.get('size')} (truncated?)"
    digest = hashlib.sha256(image).hexdigest()
    if digest != entry.get("sha256"):
        return None, f"{path}: sha256 {digest[:16]}... does not match the manifest's"
    return image, None


@dataclass
class Found:
    arch: str
    launcher: object = None
    reasons: list = field(default_factory=list)
    where: str | None = None


def find_variant(variant, device_index: int) -> Found:
    from .driver import Launcher, LoadedModule  # needs a GPU driver: only here

    arch, description = device_arch(device_index)
    if arch is None:
        return Found(arch=f"unsupported device {description}",
                     reasons=[f"no ahead-of-time build exists for {description}"])
    found = Found(arch=arch)
    warp_size = TARGETS[arch][2]
    for s in artifact_sets(arch):
        if s.manifest is None:
            found.reasons.append(s.error)
            continue
        entry = s.manifest["variants"].get(variant.name)
        if entry is None:
            continue
        path = os.path.join(s.directory, entry.get("file", ""))
        key = (path, device_index)
        module = s.modules.get(key)
        if module is None:
            image, reason = check_entry(entry, variant, path)
            if reason:
                _refuse(reason)
                found.reasons.append(reason)
                continue
            module = LoadedModule(image, device_index)
            s.modules[key] = module
        found.launcher = Launcher(module, entry["kernel_name"], entry["type_string"],
                                  entry["num_warps"], warp_size, entry["shared"])
        found.where = path
        return found
    if not found.reasons:
        found.reasons.append("not in any artifact set for " + arch)
    return found
