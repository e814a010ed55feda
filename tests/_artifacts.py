"""The session's shared artifact build, used by test_build.py, test_integrity.py and
test_wheel.py: one build into the pytest base temp dir, guarded by a file lock so a module
reuses what another already built."""
import contextlib
import os
from pathlib import Path

from filelock import FileLock

from liger_aot.build_tools import aot


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


def shared_build(tmp_path_factory, archs):
    """Build `archs` into the session's shared artifact root (a no-op for archs another
    module already built). Returns (root, [ArchResult])."""
    base = tmp_path_factory.getbasetemp()
    root = base / "liger-aot-shared"
    with FileLock(str(base / "liger-aot-shared.lock")):
        with environ(TRITON_CACHE_DIR=session_triton_cache(tmp_path_factory),
                     LIGER_AOT_CACHE_DIR=base / "liger-aot-cache"):
            messages = []
            try:
                results = aot.build(list(archs), str(root), jobs=max(2, os.cpu_count() or 1),
                                    log=messages.append)
            except Exception as e:
                raise AssertionError(f"the shared build failed: {e}\n" + "\n".join(messages))
    return root, results
