"""The session's shared artifact build, used by test_build.py, test_integrity.py,
test_wheel.py and test_first_call_cost.py: one build into the pytest base temp dir, guarded by
a file lock so a module reuses what another already built.

Tests that use it carry the marker `shared_build(*archs)`. When the session selects any, the
build of their archs starts in a child process with the session (conftest.py), those tests run
last, and `shared_build` first waits for that child: the compile (minutes on a 2-core CI
machine) overlaps the tests that need no build. The child only fills the directory; the
in-process build after it checks the set and compiles whatever is missing, so a failed or
killed child costs time, not correctness. LIGER_AOT_TEST_PREBUILD=0 turns the child off."""
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from liger_aot.build_tools import aot

REPO = Path(__file__).resolve().parents[1]
PREBUILD_ENV = "LIGER_AOT_TEST_PREBUILD"
PREBUILD_WAIT_S = 3600

_background = {}  # shared root -> the child process building into it


def needs_shared_build(*archs):
    """Marker for a test that uses the session's shared build of `archs`."""
    return pytest.mark.shared_build(*archs)


@contextlib.contextmanager
def environ(**values):
    """Set environment variables (as strings) for the block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def session_triton_cache(tmp_path_factory) -> Path:
    """A Triton cache the caller chose (CI exports a fresh one), else one for this session."""
    chosen = os.environ.get("TRITON_CACHE_DIR")
    return Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "triton-cache"


def _shared_root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "liger-aot-shared"


def _build_jobs() -> int:
    """Compile workers of the shared build, in the background child and in-process alike:
    one a core, at least two."""
    return max(2, os.cpu_count() or 1)


def _shared_env(tmp_path_factory) -> dict:
    base = tmp_path_factory.getbasetemp()
    return {"TRITON_CACHE_DIR": session_triton_cache(tmp_path_factory),
            "LIGER_AOT_CACHE_DIR": base / "liger-aot-cache"}


def start_background_build(tmp_path_factory, archs) -> None:
    """Start `liger-aot build` of `archs` into the shared root in a child process. It gets
    as many compile workers as the in-process build (_build_jobs): the tests running beside
    it share the cores, so none idles while either has work left. Its output goes to a log
    beside the root."""
    base = tmp_path_factory.getbasetemp()
    root = _shared_root(tmp_path_factory)
    if root in _background:
        return
    env = dict(os.environ)
    env.update({k: str(v) for k, v in _shared_env(tmp_path_factory).items()})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    env.pop("TRITON_INTERPRET", None)  # a build never runs a kernel
    with open(base / "liger-aot-shared-background.log", "wb") as log:
        _background[root] = subprocess.Popen(
            [sys.executable, "-m", "liger_aot", "build", "--arch", ",".join(archs),
             "--out", str(root), "--jobs", str(_build_jobs())],
            env=env, cwd=str(base), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group, so stop_* ends its workers too


def _wait_for_background(root: Path) -> None:
    child = _background.get(root)
    if child is None:
        return
    try:
        child.wait(timeout=PREBUILD_WAIT_S)
    except subprocess.TimeoutExpired:
        _kill(child)


def _kill(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def stop_background_builds() -> None:
    """End any background build still running (the session is over)."""
    for child in _background.values():
        if child.poll() is None:
            _kill(child)
    _background.clear()


def shared_build(tmp_path_factory, archs):
    """Build `archs` into the session's shared artifact root (a no-op for archs another
    module or the background build already built). Returns (root, [ArchResult])."""
    base = tmp_path_factory.getbasetemp()
    root = _shared_root(tmp_path_factory)
    _wait_for_background(root)
    with FileLock(str(base / "liger-aot-shared.lock")):
        with environ(**_shared_env(tmp_path_factory)):
            messages = []
            try:
                results = aot.build(list(archs), str(root), jobs=_build_jobs(),
                                    log=messages.append)
            except Exception as e:
                raise AssertionError(f"the shared build failed: {e}\n" + "\n".join(messages))
    return root, results
