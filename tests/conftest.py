"""Test setup. CPU tests run kernels through Triton's interpreter, which must be chosen
before triton is imported. GPU tests (marker `gpu`, run with `pytest -m gpu`) use the AOT
path, which never imports triton, so the setting does not touch them.

Tests marked `shared_build(*archs)` use the session's shared artifact build (_artifacts.py):
they run last, and that build starts in the background with the session."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402  (after the interpreter is chosen)

from _artifacts import (PREBUILD_ENV, start_background_build,  # noqa: E402
                        stop_background_builds)

_PREBUILD_ARCHS = pytest.StashKey[tuple]()


@pytest.hookimpl(trylast=True)  # after `-m` / `-k` deselected what they do not run
def pytest_collection_modifyitems(config, items):
    building = [item for item in items if item.get_closest_marker("shared_build")]
    if not building:
        return
    ids = {id(item) for item in building}
    items[:] = [item for item in items if id(item) not in ids] + building  # stable order
    archs = []
    for item in building:
        for marker in item.iter_markers("shared_build"):
            archs += [a for a in marker.args if a not in archs]
    config.stash[_PREBUILD_ARCHS] = tuple(archs)


@pytest.fixture(scope="session", autouse=True)
def _shared_build_in_background(request, tmp_path_factory):
    archs = request.config.stash.get(_PREBUILD_ARCHS, ())
    if archs and os.environ.get(PREBUILD_ENV, "1") != "0":
        start_background_build(tmp_path_factory, archs)
    yield
    stop_background_builds()
