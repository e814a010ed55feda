"""Test setup. CPU tests run kernels through Triton's interpreter, which must be chosen
before triton is imported. GPU tests (marker `gpu`, run with `pytest -m gpu`) use the AOT
path, which never imports triton, so the setting does not touch them.

Tests marked `shared_build(*archs)` use the session's shared artifact build (_artifacts.py):
they run last, and that build starts in the background with the session.

GPU tests run the ops on an artifact set (gpu_artifact_dir): LIGER_AOT_ARTIFACT_DIR, else the
device's arch built once a session. Without one the ops would fall back to Triton JIT, which
the interpreter setting above turns into the interpreter on CUDA tensors, and fail."""
import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402  (after the interpreter is chosen)

from _artifacts import (PREBUILD_ENV, start_background_build,  # noqa: E402
                        stop_background_builds)

if os.environ["TRITON_INTERPRET"] == "1":
    import _interpreter_sums  # noqa: E402

    _interpreter_sums.install()  # LayerNorm's pair of sums with NumPy, not element by element

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


def gpu_arch():
    """The arch of GPU 0; skips the test where there is no GPU or it has no ahead-of-time
    arch."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from liger_aot.runtime.device import device_arch

    arch, description = device_arch(0)
    if arch is None:
        pytest.skip(f"{description} has no ahead-of-time arch")
    return arch


@pytest.fixture(scope="session")
def gpu_artifact_dir(tmp_path_factory):
    """The artifact set the GPU tests run on: LIGER_AOT_ARTIFACT_DIR when set, else the
    device's arch built into a temporary directory (a subprocess: the build needs triton,
    the runtime under test not)."""
    arch = gpu_arch()
    given = os.environ.get("LIGER_AOT_ARTIFACT_DIR")
    if given:
        return given
    out = str(tmp_path_factory.mktemp("artifacts"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-m", "liger_aot", "build", "--arch", arch, "--out", out],
                   check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   env=env)
    return out


@pytest.fixture(autouse=True)
def _gpu_tests_run_on_the_build(request):
    """A `gpu` test's ops run on gpu_artifact_dir."""
    if request.node.get_closest_marker("gpu") is not None:
        request.getfixturevalue("_runtime_on_the_gpu_build")


@pytest.fixture(scope="session")
def _runtime_on_the_gpu_build(gpu_artifact_dir):
    """Points this process's runtime at gpu_artifact_dir, once a session: the registry's
    discovery of artifact sets is redone with it."""
    from liger_aot.runtime import registry

    os.environ["LIGER_AOT_ARTIFACT_DIR"] = gpu_artifact_dir
    registry.reset()
