"""Wheels: `liger-aot wheel` writes the package wheel and one artifact wheel per arch; they
are well-formed (RECORD, METADATA, entry points), reproducible, install side by side into a
fresh venv, and the installed package finds, verifies and runs its kernels from there."""
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import liger_aot
from liger_aot.kernel_src import FAMILIES, all_specs

from _artifacts import needs_shared_build, session_triton_cache, shared_build

REPO = Path(__file__).resolve().parents[1]
ARCHS = ("sm90", "sm80")
# builds artifacts (shared with test_build.py) and a venv
pytestmark = [pytest.mark.slow, needs_shared_build(*ARCHS)]
VERSION = liger_aot.__version__
N_VARIANTS = {arch: sum(1 for spec in all_specs() for _ in spec.variants(arch)) for arch in ARCHS}


# -- fixtures -------------------------------------------------------------------------------

def _clean_env(tmp: Path) -> dict:
    """No PYTHONPATH, no artifact dirs, caches in `tmp`, pip offline and without a cache."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LIGER_AOT_ARTIFACT_DIR", "TRITON_INTERPRET",
                        "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                        "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(LIGER_AOT_CACHE_DIR=str(tmp / "liger-aot-cache"), LIGER_AOT_IGNORE_CACHE="1",
               TRITON_CACHE_DIR=str(tmp / "triton-cache"), TRITON_HOME=str(tmp / "triton-home"),
               PIP_NO_CACHE_DIR="1", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONNOUSERSITE="1")
    return env


def _run(cmd, env, cwd, timeout=600):
    res = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd}:\n{res.stdout}\n{res.stderr}"
    return res


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Run `liger-aot wheel --arch sm90,sm80` (on a copy of the shared build, so the build
    step is incremental) and return (wheel dir, build dir, its output)."""
    shared, _ = shared_build(tmp_path_factory, ARCHS)
    tmp = tmp_path_factory.mktemp("wheel")
    build_dir = tmp / "build"
    for arch in ARCHS:
        shutil.copytree(shared / arch, build_dir / arch)
    out = tmp / "wheels"
    env = _clean_env(tmp)
    env["PYTHONPATH"] = str(REPO)
    env["TRITON_CACHE_DIR"] = str(session_triton_cache(tmp_path_factory))
    res = _run([sys.executable, "-m", "liger_aot", "wheel", "--arch", ",".join(ARCHS),
                "--out", out, "--build-dir", build_dir, "--jobs", "2"], env, tmp)
    return out, build_dir, res.stdout


@pytest.fixture(scope="module")
def venv(wheels, tmp_path_factory):
    """A fresh venv (system site-packages for torch and triton) with the three wheels."""
    out, _, _ = wheels
    tmp = tmp_path_factory.mktemp("venv")
    env = _clean_env(tmp)
    v = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", v], env, tmp)
    python = v / "bin" / "python"
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index",
          *sorted(out.glob("*.whl"))], env, tmp)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env, tmp).stdout.strip())
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return v, site, env, cwd


def _wheel_name(dist: str) -> str:
    return f"{dist.replace('-', '_')}-{VERSION}-py3-none-any.whl"


def _dist_info(dist: str) -> str:
    return f"{dist.replace('-', '_')}-{VERSION}.dist-info"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def _read_wheel(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None
        return {info.filename: zf.read(info) for info in zf.infolist()}


# -- the wheel files ------------------------------------------------------------------------

def test_wheel_files(wheels):
    out, _, stdout = wheels
    names = sorted(p.name for p in out.iterdir())
    expected = sorted([_wheel_name("liger-aot")] + [_wheel_name(f"liger-aot-{a}")
                                                    for a in ARCHS])
    assert names == expected
    for arch in ARCHS:
        assert any(arch in n for n in names)
    assert "nothing to compile: up to date" in stdout
    for name in names:
        assert f"wrote {out / name}" in stdout


@pytest.mark.parametrize("dist", ["liger-aot"] + [f"liger-aot-{a}" for a in ARCHS])
def test_record_matches_contents(wheels, dist):
    out, _, _ = wheels
    files = _read_wheel(out / _wheel_name(dist))
    info = _dist_info(dist)
    record_name = f"{info}/RECORD"
    rows = list(csv.reader(io.StringIO(files[record_name].decode())))
    rows = [r for r in rows if r]
    listed = {r[0] for r in rows}
    assert listed == set(files), set(files) ^ listed
    assert len(listed) == len(rows)  # no duplicates
    for name, digest, size in rows:
        if name == record_name:
            assert digest == "" and size == ""
            continue
        assert digest == _record_hash(files[name]), name
        assert int(size) == len(files[name]), name
    wheel_meta = files[f"{info}/WHEEL"].decode()
    assert "Wheel-Version: 1.0" in wheel_meta and "Tag: py3-none-any" in wheel_meta
    assert "Root-Is-Purelib: true" in wheel_meta


def _metadata(files: dict, dist: str) -> list:
    return files[f"{_dist_info(dist)}/METADATA"].decode().splitlines()


def test_package_wheel_metadata_and_contents(wheels):
    out, _, _ = wheels
    files = _read_wheel(out / _wheel_name("liger-aot"))
    meta = _metadata(files, "liger-aot")
    assert "Name: liger-aot" in meta and f"Version: {VERSION}" in meta
    assert any(line.startswith("Requires-Dist: torch") for line in meta)
    assert any(line.startswith("Requires-Dist: filelock") for line in meta)
    entry_points = files[f"{_dist_info('liger-aot')}/entry_points.txt"].decode()
    assert "[console_scripts]" in entry_points
    assert "liger-aot = liger_aot.cli:main" in entry_points
    names = set(files)
    for family in FAMILIES:  # the kernel sources travel with the package
        for part in ("__init__.py", "spec.py", "kernels.py"):
            name = f"liger_aot/kernel_src/{family}/{part}"
            assert name in names, name
            assert files[name] == (REPO / "kernel_src" / family / part).read_bytes()
    for name in ("liger_aot/__init__.py", "liger_aot/__main__.py", "liger_aot/cli.py",
                 "liger_aot/kernel_src/spec.py", "liger_aot/kernel_src/tuning.py",
                 "liger_aot/build_tools/aot.py", "liger_aot/build_tools/tune.py",
                 "liger_aot/build_tools/wheel.py", "liger_aot/runtime/driver.py",
                 "liger_aot/runtime/registry.py", "liger_aot/ops/__init__.py"):
        assert name in names, name
    for table in (REPO / "kernel_src" / "tuned").glob("*.json"):  # tuned tables travel too
        assert files[f"liger_aot/kernel_src/tuned/{table.name}"] == table.read_bytes()
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
    assert not [n for n in names if n.endswith((".cubin", ".hsaco"))]
    assert {n.split("/")[0] for n in names} == {"liger_aot", _dist_info("liger-aot")}


@pytest.mark.parametrize("arch", ARCHS)
def test_arch_wheel_metadata_and_contents(wheels, arch):
    out, build_dir, _ = wheels
    dist = f"liger-aot-{arch}"
    files = _read_wheel(out / _wheel_name(dist))
    meta = _metadata(files, dist)
    assert f"Name: {dist}" in meta and f"Version: {VERSION}" in meta
    assert f"Requires-Dist: liger-aot=={VERSION}" in meta
    package = f"liger_aot_{arch}"
    manifest_bytes = (build_dir / arch / "manifest.json").read_bytes()
    assert files[f"{package}/manifest.json"] == manifest_bytes
    manifest = json.loads(manifest_bytes)
    assert manifest["arch"] == arch and len(manifest["variants"]) == N_VARIANTS[arch]
    binaries = {f"{package}/{e['file']}" for e in manifest["variants"].values()}
    payload = {n for n in files if not n.startswith(_dist_info(dist))}
    assert payload == binaries | {f"{package}/__init__.py", f"{package}/manifest.json"}
    for e in manifest["variants"].values():
        assert hashlib.sha256(files[f"{package}/{e['file']}"]).hexdigest() == e["sha256"]


def test_wheels_are_reproducible(wheels, tmp_path):
    """Packing the same build again (--no-build) gives byte-identical wheels."""
    out, build_dir, _ = wheels
    env = _clean_env(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    again = tmp_path / "again"
    _run([sys.executable, "-m", "liger_aot", "wheel", "--arch", ",".join(ARCHS), "--out", again,
          "--build-dir", build_dir, "--no-build"], env, tmp_path)
    for path in out.iterdir():
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


# -- installed into a fresh venv ------------------------------------------------------------

def test_installed_package_is_imported_from_the_venv(venv):
    v, site, env, cwd = venv
    res = _run([v / "bin" / "python", "-c",
                "import sys, liger_aot, liger_aot_sm90, liger_aot_sm80, liger_aot.kernel_src; "
                "print(liger_aot.__file__); print(liger_aot_sm90.__file__); "
                "print(liger_aot_sm80.__file__); print(liger_aot.kernel_src.__file__); "
                "print(liger_aot.__version__)"], env, cwd)
    lines = res.stdout.split()
    real_venv = os.path.realpath(v)
    for line in lines[:4]:
        assert os.path.realpath(line).startswith(real_venv + os.sep), line
        assert not os.path.realpath(line).startswith(str(REPO) + os.sep), line
    assert os.path.realpath(lines[0]) == os.path.realpath(site / "liger_aot" / "__init__.py")
    assert lines[4] == VERSION


def test_arch_wheels_installed_side_by_side(venv, wheels):
    v, site, env, cwd = venv
    _, build_dir, _ = wheels
    records = {}
    for arch in ARCHS:
        manifest = site / f"liger_aot_{arch}" / "manifest.json"
        assert manifest.read_bytes() == (build_dir / arch / "manifest.json").read_bytes()
        info = site / _dist_info(f"liger-aot-{arch}")
        rows = [r for r in csv.reader(io.StringIO((info / "RECORD").read_text())) if r]
        records[arch] = {r[0] for r in rows if not r[0].startswith(_dist_info(
            f"liger-aot-{arch}"))}
        for name, digest, _ in rows:
            if digest:
                assert _record_hash((site / name).read_bytes()) == digest, name
    assert records["sm80"].isdisjoint(records["sm90"])
    assert (v / "bin" / "liger-aot").is_file()


def test_installed_cli_inspect(venv):
    v, site, env, cwd = venv
    res = _run([v / "bin" / "liger-aot", "inspect"], env, cwd)
    out = res.stdout
    for arch in ARCHS:
        line = f"{arch} [wheel] {site / f'liger_aot_{arch}'}"
        assert line in out, out
    assert "REFUSED" not in out
    for arch in ARCHS:
        assert f", {N_VARIANTS[arch]} variants, " in out, out
    assert "gfx942 [" not in out and "gfx90a [" not in out


def test_installed_cli_verify(venv):
    v, site, env, cwd = venv
    res = _run([v / "bin" / "liger-aot", "verify"], env, cwd)
    for arch in ARCHS:
        assert (f"{arch} [wheel] {site / f'liger_aot_{arch}'}: {N_VARIANTS[arch]} ok, 0 bad, "
                f"0 of the specs' variants absent") in res.stdout, res.stdout


OP_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
import liger_aot.kernel_src
from liger_aot.ops.rms_norm import rms_norm

torch.manual_seed(0)
x = torch.randn(5, 96)
w = torch.randn(96)
y = rms_norm(x, w, eps=1e-6)
ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
err = (y - ref).abs().max().item()
assert err < 1e-5, err
assert "triton" in sys.modules  # the interpreter ran the packaged Triton source
print(liger_aot.kernel_src.__file__)
"""


def test_installed_cpu_op_runs_through_the_interpreter(venv):
    v, site, env, cwd = venv
    res = _run([v / "bin" / "python", "-c", OP_SCRIPT], env, cwd)
    path = os.path.realpath(res.stdout.strip().splitlines()[-1])
    assert path.startswith(os.path.realpath(site) + os.sep), path
