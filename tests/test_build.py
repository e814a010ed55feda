"""AOT build: every arch compiles, binaries are what they claim to be, the manifest is complete,
rebuilds are incremental, and interrupted / concurrent builds leave a usable set.

One full build of all four archs is shared by the whole session (see `shared`); tests that
change a set work on a copy. Builds use a session Triton cache under the pytest temp dir,
never ~/.triton or ~/.cache, and the CLI runs with LIGER_AOT_CACHE_DIR in the temp dir.
"""
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from liger_aot.artifact_format import (BINARY_EXT, MANIFEST_FORMAT, SUPPORTED_LAUNCH_ABIS,
                                       TARGETS, launch_abi_of)
from liger_aot.build_tools import aot
from liger_aot.cli import main as cli_main
from liger_aot.kernel_src import all_specs
from liger_aot.kernel_src.spec import HIDDEN_PARAMS, family_source_sha256

from _artifacts import environ, needs_shared_build, session_triton_cache, shared_build

REPO = Path(__file__).resolve().parents[1]
ALL_ARCHS = ("sm80", "sm90", "gfx90a", "gfx942")
# per arch: the specs' variants plus those of the arch's tuned table (kernel_src/tuned)
VARIANTS = {arch: {v.name: v for spec in all_specs() for v in spec.variants(arch)}
            for arch in ALL_ARCHS}
N_VARIANTS = {arch: len(variants) for arch, variants in VARIANTS.items()}
uses_shared = needs_shared_build(*ALL_ARCHS)  # every test with the `shared` fixture


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    root, results = shared_build(tmp_path_factory, ALL_ARCHS)
    return root, {r.arch: r for r in results}


def _build(tmp_path_factory, archs, out, log=None):
    """An in-process build with the session Triton cache (warm after `shared`)."""
    messages = []
    with environ(TRITON_CACHE_DIR=session_triton_cache(tmp_path_factory)):
        results = aot.build(list(archs), str(out), jobs=2, log=log or messages.append)
    return results, messages


def _cli_env(tmp_path_factory, triton_cache=None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["LIGER_AOT_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "liger-aot-cache")
    env["LIGER_AOT_IGNORE_CACHE"] = "1"
    env["TRITON_CACHE_DIR"] = str(triton_cache or session_triton_cache(tmp_path_factory))
    env.pop("LIGER_AOT_ARTIFACT_DIR", None)
    return env


def _cli(args, env, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "liger_aot", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


SUMMARY_ROW = re.compile(r"^(sm80|sm90|gfx90a|gfx942)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+"
                         r"([\d,]+)\s+([\d.]+)$", re.M)


def _summary(text: str) -> dict:
    """arch -> (variants, compiled, reused, removed) from a printed build summary."""
    return {m.group(1): tuple(int(m.group(i)) for i in (2, 3, 4, 5))
            for m in SUMMARY_ROW.finditer(text)}


def _mtimes(directory: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()
            if p.name != ".build.lock"}


def _copy_arch(shared_root: Path, arch: str, dest_root: Path) -> Path:
    shutil.copytree(shared_root / arch, dest_root / arch)  # copy2: mtimes kept
    return dest_root / arch


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_bytes())


# -- every arch builds; binaries are for the right target ----------------------------------

@uses_shared
@pytest.mark.slow
def test_all_archs_build(shared):
    root, results = shared
    assert set(results) == set(ALL_ARCHS)
    for arch, r in results.items():
        assert r.variants == N_VARIANTS[arch]
        assert r.failed == 0
        assert r.compiled + r.reused == N_VARIANTS[arch]
        assert r.bytes > 0
        assert (root / arch / "manifest.json").is_file()
        # nothing but the manifest, the lock and one binary + meta per distinct key
        names = {p.name for p in (root / arch).iterdir()}
        ext = BINARY_EXT[TARGETS[arch][0]]
        keys = {e["key"] for e in _manifest(root / arch)["variants"].values()}
        assert names == ({"manifest.json", ".build.lock"} | {f"{k}.{ext}" for k in keys}
                         | {f"{k}.meta.json" for k in keys})


def _elf_header(data: bytes) -> dict:
    assert data[:4] == b"\x7fELF", "not an ELF file"
    assert data[4] == 2 and data[5] == 1, "expected a 64-bit little-endian ELF"
    (e_type, e_machine, e_version, e_entry, e_phoff, e_shoff,
     e_flags) = struct.unpack_from("<HHIQQQI", data, 16)
    return {"osabi": data[7], "type": e_type, "machine": e_machine, "flags": e_flags}


EM_CUDA, EM_AMDGPU = 190, 224
ELFOSABI_AMDGPU_HSA = 64
CUDA_SM = {"sm80": 0x50, "sm90": 0x5A}
CUDA_ARCH_SPECIFIC = 0x800  # the "a" of sm_90a
AMDGPU_MACH = {"gfx90a": 0x3F, "gfx942": 0x4C}


@uses_shared
@pytest.mark.slow
@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_binaries_target_their_arch(shared, arch):
    root, _ = shared
    manifest = _manifest(root / arch)
    files = sorted({e["file"] for e in manifest["variants"].values()})
    assert len(files) > 0
    for name in files:
        data = (root / arch / name).read_bytes()
        h = _elf_header(data)
        if arch.startswith("sm"):
            assert name.endswith(".cubin")
            assert h["machine"] == EM_CUDA, name
            assert h["flags"] & 0xFF == CUDA_SM[arch], (name, hex(h["flags"]))
            if arch == "sm90":
                assert h["flags"] & CUDA_ARCH_SPECIFIC, f"{name}: not sm_90a ({h['flags']:#x})"
            else:
                assert not h["flags"] & CUDA_ARCH_SPECIFIC, f"{name}: {h['flags']:#x}"
        else:
            assert name.endswith(".hsaco")
            assert h["machine"] == EM_AMDGPU, name
            assert h["osabi"] == ELFOSABI_AMDGPU_HSA, name
            assert h["flags"] & 0xFF == AMDGPU_MACH[arch], (name, hex(h["flags"]))
            assert arch.encode() in data, name
            other = ({"gfx90a", "gfx942"} - {arch}).pop()
            assert other.encode() not in data, name


def _cuobjdump():
    spec = importlib.util.find_spec("triton")  # located without importing triton
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.is_file() and os.access(path, os.X_OK) else None


@uses_shared
@pytest.mark.slow
@pytest.mark.skipif(_cuobjdump() is None, reason="Triton's cuobjdump is not available")
@pytest.mark.parametrize("arch,expected", [("sm90", "90a"), ("sm80", "80")])
def test_cuobjdump_reports_target(shared, arch, expected):
    root, _ = shared
    entry = next(iter(_manifest(root / arch)["variants"].values()))
    out = subprocess.run([str(_cuobjdump()), "-elf", str(root / arch / entry["file"])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sms = re.findall(r"\bsm=(\w+)", out.stdout)
    assert sms and set(sms) == {expected}, out.stdout[:500]


@uses_shared
@pytest.mark.slow
def test_alignment_hints_reach_the_compiler(shared):
    """a16 and any variants compile to different code for most specs: the divisibility
    attrs are not silently dropped. (A kernel may legitimately gain nothing from them, so
    this asks for most specs, not all.)"""
    root, _ = shared
    for arch in ALL_ARCHS:
        entries = _manifest(root / arch)["variants"]
        # specs compiled for this arch in both classes (the staged cross entropy is a16 only)
        specs = [s for s in all_specs() if s.built_for(arch) and "any" in s.align_classes]
        differing = []
        for spec in specs:
            pairs = [(entries[v.name]["sha256"], entries[v.name.replace(".a16.", ".any.", 1)]
                      ["sha256"]) for v in spec.variants() if v.align == "a16"]
            assert pairs, spec.name
            if any(a != b for a, b in pairs):
                differing.append(spec.name)
        assert len(differing) * 2 > len(specs), (arch, differing)


# -- manifest contents ----------------------------------------------------------------------

@uses_shared
@pytest.mark.slow
@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_manifest_contents(shared, arch):
    import triton

    root, _ = shared
    directory = root / arch
    m = _manifest(directory)
    backend = TARGETS[arch][0]
    ext = BINARY_EXT[backend]
    assert m["format"] == MANIFEST_FORMAT
    assert m["arch"] == arch
    assert m["target"] == list(TARGETS[arch])
    assert m["triton_version"] == triton.__version__
    assert m["launch_abi"] == launch_abi_of(triton.__version__) == "triton-3.6"
    assert m["launch_abi"] in SUPPORTED_LAUNCH_ABIS
    if backend == "cuda":
        assert re.fullmatch(r"\d+\.\d+\.\d+", m["ptxas_version"]), m["ptxas_version"]
    else:
        assert m["ptxas_version"] is None
    assert set(m["variants"]) == set(VARIANTS[arch])

    toolchain = {"triton_version": m["triton_version"], "ptxas_version": m["ptxas_version"]}
    keys = set()
    for name, e in m["variants"].items():
        variant = VARIANTS[arch][name]
        spec = variant.spec
        assert re.fullmatch(r"[0-9a-f]{64}", e["key"]), name
        assert e["key"] == aot.variant_key(variant, arch, toolchain), name
        keys.add(e["key"])
        assert e["file"] == f"{e['key']}.{ext}"
        assert e["kernel_name"] == spec.function_name(variant.config)  # staged: the Gluon twin
        assert e["type_string"] == spec.type_string
        assert e["type_string"].endswith(HIDDEN_PARAMS) and HIDDEN_PARAMS == "PP"
        assert len(e["type_string"]) == len(spec.params) + 2
        assert e["num_warps"] == variant.config.num_warps
        assert e["num_stages"] == variant.config.num_stages
        assert isinstance(e["shared"], int) and e["shared"] >= 0
        assert e["global_scratch_size"] == 0 and e["profile_scratch_size"] == 0
        data = (directory / e["file"]).read_bytes()
        assert e["size"] == len(data)
        assert e["sha256"] == hashlib.sha256(data).hexdigest()
        assert e["source_sha256"] == family_source_sha256(spec.family)
        # the per-variant record agrees with the manifest
        meta = json.loads((directory / f"{e['key']}.meta.json").read_bytes())
        assert {k: v for k, v in meta.items()
                if k not in ("triton_version", "ptxas_version")} == e
        assert meta["triton_version"] == m["triton_version"]
    assert len(keys) == len(m["variants"])  # one key per variant


# -- incremental builds ---------------------------------------------------------------------

@uses_shared
@pytest.mark.slow
def test_rebuild_compiles_nothing(shared, tmp_path_factory):
    root, _ = shared
    before = {arch: _mtimes(root / arch) for arch in ALL_ARCHS}
    manifests = {arch: (root / arch / "manifest.json").read_bytes() for arch in ALL_ARCHS}
    results, _ = _build(tmp_path_factory, ALL_ARCHS, root)
    for r in results:
        assert (r.variants, r.compiled, r.reused, r.removed, r.failed) == (
            N_VARIANTS[r.arch], 0, N_VARIANTS[r.arch], 0, 0), r
    assert aot.format_summary(results, 0.1).endswith("nothing to compile: up to date")
    for arch in ALL_ARCHS:
        assert _mtimes(root / arch) == before[arch], arch
        assert (root / arch / "manifest.json").read_bytes() == manifests[arch]


@uses_shared
@pytest.mark.slow
def test_cli_rebuild_says_up_to_date(shared, tmp_path_factory, tmp_path):
    root, _ = shared
    before = {arch: _mtimes(root / arch) for arch in ALL_ARCHS}
    out = _cli(["build", "--arch", ",".join(ALL_ARCHS), "--out", str(root), "--jobs", "2"],
               _cli_env(tmp_path_factory), tmp_path)
    assert out.returncode == 0, out.stderr
    assert "nothing to compile: up to date" in out.stdout
    rows = _summary(out.stdout)
    assert rows == {arch: (N_VARIANTS[arch], 0, N_VARIANTS[arch], 0) for arch in ALL_ARCHS}, \
        out.stdout
    for arch in ALL_ARCHS:
        assert _mtimes(root / arch) == before[arch], arch
    assert not list(tmp_path.iterdir())  # nothing written into the working directory


def _damage(directory: Path, entry: dict, how: str):
    binary = directory / entry["file"]
    if how == "deleted":
        binary.unlink()
    elif how == "truncated":  # a binary cut short, its .meta.json still claiming it complete
        data = binary.read_bytes()
        binary.write_bytes(data[: len(data) // 2])
    elif how == "flipped":  # same size, one byte different
        data = bytearray(binary.read_bytes())
        data[len(data) // 2] ^= 0xFF
        binary.write_bytes(bytes(data))
    elif how == "meta_garbage":
        (directory / f"{entry['key']}.meta.json").write_bytes(b"{\"key\": ")
    elif how == "meta_deleted":
        (directory / f"{entry['key']}.meta.json").unlink()
    else:
        raise AssertionError(how)


@uses_shared
@pytest.mark.slow
@pytest.mark.parametrize("how", ["deleted", "truncated", "flipped", "meta_garbage",
                                 "meta_deleted"])
def test_damaged_variant_is_recompiled(shared, tmp_path_factory, tmp_path, how):
    root, _ = shared
    arch = "sm90"
    directory = _copy_arch(root, arch, tmp_path)
    manifest_bytes = (directory / "manifest.json").read_bytes()
    name = next(v.name for v in all_specs()[0].variants() if v.dtype == "bf16")
    entry = _manifest(directory)["variants"][name]
    # the binary's key is used by no other variant, so exactly one variant is affected
    assert sum(e["key"] == entry["key"] for e in _manifest(directory)["variants"].values()) == 1
    _damage(directory, entry, how)
    assert aot.load_complete(str(directory), entry["key"]) is None
    before = _mtimes(directory)

    results, _ = _build(tmp_path_factory, [arch], tmp_path)
    r = results[0]
    assert (r.compiled, r.reused, r.failed) == (1, N_VARIANTS[arch] - 1, 0), r
    data = (directory / entry["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert aot.load_complete(str(directory), entry["key"]) == {
        **entry, "triton_version": _manifest(directory)["triton_version"],
        "ptxas_version": _manifest(directory)["ptxas_version"]}
    # everything else untouched, the manifest byte-identical (so not rewritten)
    after = _mtimes(directory)
    changed = {n for n in after if after[n] != before.get(n)}
    assert changed <= {entry["file"], f"{entry['key']}.meta.json"}, changed
    assert (directory / "manifest.json").read_bytes() == manifest_bytes
    assert after["manifest.json"] == before["manifest.json"]
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]


@uses_shared
@pytest.mark.slow
def test_stale_binaries_are_removed(shared, tmp_path_factory, tmp_path):
    root, _ = shared
    directory = _copy_arch(root, "gfx942", tmp_path)
    stray = [directory / ("0" * 64 + ".hsaco"), directory / ("0" * 64 + ".meta.json")]
    for p in stray:
        p.write_bytes(b"old")
    results, _ = _build(tmp_path_factory, ["gfx942"], tmp_path)
    assert (results[0].compiled, results[0].removed) == (0, 2)
    assert not any(p.exists() for p in stray)


# -- interrupted and concurrent builds ------------------------------------------------------

def _live_group_members(pgid: int) -> list:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _written(directory, suffix: str) -> list:
    """Files of the build with that suffix, without temporaries: a kill between writing a
    temporary and renaming it leaves a whole `.tmp-*-<key>.meta.json` (pathlib's glob matches
    dot files), which the next build removes rather than reuses."""
    return [p for p in directory.glob("*" + suffix) if not p.name.startswith(".tmp-")]


@uses_shared
@pytest.mark.slow
def test_interrupted_build_recovers(shared, tmp_path_factory, tmp_path):
    arch = "sm80"
    out = tmp_path / "out"
    directory = out / arch
    cold_cache = tmp_path / "cold-triton-cache"  # slow enough to be killed mid-way
    log = (tmp_path / "build.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "liger_aot", "build", "--arch", arch, "--out", str(out),
         "--jobs", "2"], env=_cli_env(tmp_path_factory, cold_cache), cwd=tmp_path,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if directory.is_dir() and len(_written(directory, ".meta.json")) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the build finished before it could be interrupted"
        assert len(_written(directory, ".meta.json")) >= 3, "no binaries appeared"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its compile workers
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        log.close()
    deadline = time.monotonic() + 30
    while _live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _live_group_members(proc.pid)

    n_binaries = len(_written(directory, ".cubin"))
    assert 0 < n_binaries < N_VARIANTS[arch]
    manifest = directory / "manifest.json"
    if manifest.exists():  # never expected: the manifest is written last
        check = _cli(["verify", "--dir", str(out)], _cli_env(tmp_path_factory), tmp_path)
        assert check.returncode == 0, check.stdout + check.stderr
    # A kill in the middle of a write leaves a temporary; plant one to be sure there is one.
    (directory / ".tmp-abc123-deadbeef.cubin").write_bytes(b"partial")
    temporaries = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
    complete = sum(aot.load_complete(str(directory), p.name[: -len(".meta.json")]) is not None
                   for p in _written(directory, ".meta.json"))
    assert complete >= 3

    res = _cli(["build", "--arch", arch, "--out", str(out), "--jobs", "2"],
               _cli_env(tmp_path_factory), tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"removed {len(temporaries)} temporary file(s) left by an interrupted build" \
        in res.stdout
    variants, compiled, reused, removed = _summary(res.stdout)[arch]
    assert (variants, compiled, reused) == (N_VARIANTS[arch], N_VARIANTS[arch] - complete,
                                            complete)
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
    check = _cli(["verify", "--dir", str(out)], _cli_env(tmp_path_factory), tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{N_VARIANTS[arch]} ok, 0 bad, 0 of the specs' variants absent" in check.stdout


@uses_shared
@pytest.mark.slow
def test_concurrent_builds_share_the_work(shared, tmp_path_factory, tmp_path):
    """Two builds of one arch into the same empty root at once. To make them meet on the
    lock for certain (with a warm Triton cache a build takes ~1 s), the test holds the arch's
    build lock until both have reported that they are waiting, then lets them race."""
    arch = "sm90"
    out = tmp_path / "out"
    (out / arch).mkdir(parents=True)
    env = _cli_env(tmp_path_factory)
    env["PYTHONUNBUFFERED"] = "1"
    logs = [tmp_path / f"build{i}.log" for i in range(2)]
    gate = FileLock(str(out / arch / ".build.lock"))
    gate.acquire()
    procs = []
    try:
        for path in logs:
            with path.open("w") as f:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "liger_aot", "build", "--arch", arch,
                     "--out", str(out), "--jobs", "2"], env=env, cwd=tmp_path,
                    stdout=f, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while not all("waiting for it" in p.read_text() for p in logs):
            assert time.monotonic() < deadline, [p.read_text() for p in logs]
            assert all(p.poll() is None for p in procs), [p.read_text() for p in logs]
            time.sleep(0.05)
        assert not (out / arch / "manifest.json").exists()
    finally:
        gate.release()
        for p in procs:
            try:
                p.wait(timeout=300)
            finally:
                if p.poll() is None:
                    p.kill()
    outputs = [p.read_text() for p in logs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text
    rows = [_summary(text)[arch] for text in outputs]
    n = N_VARIANTS[arch]
    assert sum(r[1] for r in rows) == n, rows
    assert all(r[0] == n and r[1] + r[2] == n for r in rows), rows
    assert sorted(r[1] for r in rows) == [0, n], rows
    second = outputs[[r[1] for r in rows].index(0)]
    assert "nothing to compile: up to date" in second
    check = _cli(["verify", "--dir", str(out)], _cli_env(tmp_path_factory), tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{n} ok, 0 bad, 0 of the specs' variants absent" in check.stdout


# -- bad command lines ----------------------------------------------------------------------

def test_unknown_arch_exits_2(tmp_path_factory, tmp_path):
    res = _cli(["build", "--arch", "sm75", "--out", str(tmp_path / "out")],
               _cli_env(tmp_path_factory), tmp_path)
    assert res.returncode == 2
    assert "unknown arch sm75" in res.stderr
    for arch in ALL_ARCHS:
        assert arch in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,message", [
    (["build", "--arch", "sm90,bogus"], "unknown arch bogus"),
    (["build", "--arch", " , "], "no arch given"),
    (["wheel", "--arch", "gfx1100", "--no-build"], "unknown arch gfx1100"),
])
def test_bad_arch_lists_valid_archs(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("LIGER_AOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    if argv[0] == "build":
        argv = argv + ["--out", str(tmp_path / "out")]
    else:
        argv = argv + ["--out", str(tmp_path / "wheels"), "--build-dir", str(tmp_path / "b")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert all(arch in err for arch in ALL_ARCHS), err
    assert not list(tmp_path.iterdir())  # nothing created


@pytest.mark.parametrize("command", [[], ["build"], ["wheel"], ["inspect"], ["verify"],
                                     ["tune"]])
def test_help(command, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LIGER_AOT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as e:
        cli_main(command + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: liger-aot {' '.join(command)}".rstrip())
    if command in (["build"], ["wheel"]):
        assert "--arch" in out and all(arch in out for arch in ALL_ARCHS)
    # every command says what it does, between the usage and the options
    assert out.split("\n\n")[1].strip() and not out.split("\n\n")[1].startswith("options")
    if command in (["inspect"], ["verify"]):
        words = " ".join(out.split())  # as wrapped to the terminal's width
        assert "Needs no GPU" in words and "Exit status" in words
    assert not (tmp_path / "cache").exists()


def test_missing_arguments_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LIGER_AOT_CACHE_DIR", str(tmp_path / "cache"))
    for argv in ([], ["build"], ["frobnicate"]):
        with pytest.raises(SystemExit) as e:
            cli_main(argv)
        assert e.value.code == 2
    assert "usage: liger-aot" in capsys.readouterr().err
