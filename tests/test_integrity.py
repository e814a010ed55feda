"""Runtime refusals: a binary or manifest that does not match what this runtime needs is
refused with a RuntimeWarning that names the file and the problem, and the variant is then
missing (JIT fallback, or MissingVariantError in strict mode), never an exception.

Works on a copy of a built sm90 set (LIGER_AOT_ARTIFACT_DIR), with the device probe and the
driver replaced by fakes, so no GPU is needed."""
import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import liger_aot.runtime.driver as driver
import liger_aot.runtime.kernel as kernel_mod
import liger_aot.runtime.registry as registry
from liger_aot.cli import main as cli_main
from liger_aot.kernel_src import all_specs
from liger_aot.runtime import Kernel, MissingVariantError

from _artifacts import needs_shared_build, shared_build

# needs a build of sm90 and sm80 (shared with test_build.py)
pytestmark = [pytest.mark.slow, needs_shared_build("sm80", "sm90")]

SPEC = all_specs()[0]
OPTIONS = tuple((name, SPEC.options[name][0]) for name in sorted(SPEC.options))
CONFIG = SPEC.configs[0]
VARIANT = SPEC.variant("bf16", "a16", OPTIONS, CONFIG)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    root, _ = shared_build(tmp_path_factory, ("sm80", "sm90"))
    return root


# -- fakes ----------------------------------------------------------------------------------

class FakeModule:
    instances = []

    def __init__(self, image: bytes, device_index: int):
        self.image, self.device_index = image, device_index
        FakeModule.instances.append(self)


class FakeLauncher:
    def __init__(self, module, name, type_string, num_warps, warp_size, shared):
        self.module, self.name, self.type_string = module, name, type_string
        self.num_warps, self.warp_size, self.shared = num_warps, warp_size, shared
        self.calls = []

    def __call__(self, grid, values, args):
        self.calls.append((grid, values))


class FakeTensor:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def get_device(self):
        return 0

    def data_ptr(self):
        return self.ptr


def aligned_args(spec):
    return [FakeTensor(0x7F00_0000_0000 + i * 0x1000) if p.kind == "ptr" else
            0.5 if p.kind == "fp32" else 4096 if p.divisible else 7
            for i, p in enumerate(spec.params)]


@dataclass
class Art:
    root: Path  # LIGER_AOT_ARTIFACT_DIR
    dir: Path  # root / "sm90"
    built: Path  # the shared build (read only)

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_bytes())

    def write_manifest(self, manifest):
        self.manifest_path.write_text(json.dumps(manifest, indent=1))

    def entry(self, name=VARIANT.name) -> dict:
        return self.manifest()["variants"][name]

    def binary(self, name=VARIANT.name) -> Path:
        return self.dir / self.entry(name)["file"]


@pytest.fixture
def art(built, tmp_path, monkeypatch):
    root = tmp_path / "artifacts"
    shutil.copytree(built / "sm90", root / "sm90")
    monkeypatch.setenv("LIGER_AOT_ARTIFACT_DIR", str(root))
    monkeypatch.setenv("LIGER_AOT_IGNORE_CACHE", "1")
    monkeypatch.setenv("LIGER_AOT_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("LIGER_AOT_STRICT", "LIGER_AOT_DISABLE_JIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(registry, "device_arch", lambda index: ("sm90", "fake H200"))
    monkeypatch.setattr(driver, "LoadedModule", FakeModule)
    monkeypatch.setattr(driver, "Launcher", FakeLauncher)
    FakeModule.instances = []
    registry.reset()
    yield Art(root, root / "sm90", built)
    registry.reset()


def find(variant=VARIANT):
    """find_variant, returning (Found, [RuntimeWarning messages]). Any exception fails."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = registry.find_variant(variant, 0)
    return found, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


# -- the good case --------------------------------------------------------------------------

def test_good_set_gives_launcher_for_the_right_file(art):
    entry = art.entry()
    path = art.dir / entry["file"]
    found, warned = find()
    assert warned == []
    assert found.reasons == []
    assert found.arch == "sm90"
    assert found.where == str(path)
    launcher = found.launcher
    assert isinstance(launcher, FakeLauncher)
    assert launcher.module.image == path.read_bytes()
    assert launcher.module.device_index == 0
    assert launcher.name == entry["kernel_name"] == VARIANT.spec.function
    assert launcher.type_string == entry["type_string"] == VARIANT.spec.type_string
    assert (launcher.num_warps, launcher.warp_size, launcher.shared) == (
        entry["num_warps"], 32, entry["shared"])
    # the loaded module is kept: a second lookup loads nothing new
    again, _ = find()
    assert again.launcher.module is launcher.module
    assert len(FakeModule.instances) == 1
    # the other alignment class is a different binary
    other = SPEC.variant("bf16", "any", OPTIONS, CONFIG)
    found_any, _ = find(other)
    assert found_any.where == str(art.dir / art.entry(other.name)["file"]) != found.where


def test_good_set_through_kernel(art, monkeypatch):
    monkeypatch.setattr(kernel_mod, "_jit_launcher", lambda v: pytest.fail("JIT used"))
    k = Kernel(SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k((2,), *aligned_args(SPEC), dtype=torch.bfloat16, config=CONFIG, options=OPTIONS)
    launcher = k._launchers[(0, torch.bfloat16, True, OPTIONS, CONFIG)]
    assert isinstance(launcher, FakeLauncher)
    assert launcher.module.image == art.binary().read_bytes()
    assert len(launcher.calls) == 1


def test_verify_accepts_the_good_copy(art, capsys):
    assert cli_main(["verify", "--dir", str(art.root)]) == 0
    assert "0 bad" in capsys.readouterr().out


# -- refusals -------------------------------------------------------------------------------

def _flip_byte(art):
    path = art.binary()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return [str(path), "sha256", "does not match the manifest"]


def _truncate(art):
    path = art.binary()
    data = path.read_bytes()
    path.write_bytes(data[:100])
    return [str(path), "100 bytes", f"manifest says {len(data)}", "truncated"]


def _delete(art):
    path = art.binary()
    path.unlink()
    return [str(path), "unreadable", "No such file"]


def _edit_entry(field, value, expected):
    def mutate(art):
        manifest = art.manifest()
        path = art.dir / manifest["variants"][VARIANT.name]["file"]
        manifest["variants"][VARIANT.name][field] = value
        art.write_manifest(manifest)
        return [str(path)] + expected
    return mutate


def _other_arch(art):
    shutil.copy(art.built / "sm80" / "manifest.json", art.manifest_path)
    return [str(art.manifest_path), "manifest is for arch 'sm80', not 'sm90'"]


def _edit_manifest(edit, expected):
    def mutate(art):
        manifest = art.manifest()
        edit(manifest)
        art.write_manifest(manifest)
        return [str(art.manifest_path)] + expected
    return mutate


def _write_manifest_bytes(data, expected):
    def mutate(art):
        art.manifest_path.write_bytes(data)
        return [str(art.manifest_path)] + expected
    return mutate


def _old_triton(m):
    m["launch_abi"], m["triton_version"] = "triton-3.5", "3.5.0"


BINARY_CASES = {
    "sha256_differs": _flip_byte,
    "truncated": _truncate,
    "missing": _delete,
    "other_source": _edit_entry("source_sha256", "0" * 64,
                                ["built from other kernel source", f"installed {SPEC.family}"]),
    "type_string": _edit_entry("type_string", SPEC.type_string[:-3] + "PP",
                               ["parameter types", repr(SPEC.type_string[:-3] + "PP"),
                                repr(SPEC.type_string)]),
    "type_string_no_hidden": _edit_entry("type_string", SPEC.type_string[:-2],
                                         ["parameter types", repr(SPEC.type_string)]),
    "needs_scratch": _edit_entry("global_scratch_size", 1024, ["scratch memory"]),
    "no_kernel_name": _edit_entry("kernel_name", None, ["no valid kernel_name"]),
    "num_warps_not_int": _edit_entry("num_warps", "8", ["no valid num_warps"]),
}

SET_CASES = {
    "other_arch": _other_arch,
    "launch_abi": _edit_manifest(_old_triton, ["Triton 3.5.0", "'triton-3.5'",
                                               "supports triton-3.6"]),
    "unknown_abi_only": _edit_manifest(lambda m: m.update(launch_abi="triton-9.9"),
                                       ["'triton-9.9'", "supports triton-3.6"]),
    "unknown_format": _edit_manifest(lambda m: m.update(format=2),
                                     ["unknown manifest format 2 (expected 1)"]),
    "no_format": _edit_manifest(lambda m: m.pop("format"),
                                ["unknown manifest format None"]),
    "no_variants_table": _edit_manifest(lambda m: m.update(variants=[]),
                                        ["no variants table"]),
    "not_json": _write_manifest_bytes(b"{\"format\": 1, \"arch\": ", ["unreadable"]),
    "json_list": _write_manifest_bytes(b"[1, 2]", ["unknown manifest format 'list'"]),
    "empty": _write_manifest_bytes(b"", ["unreadable"]),
    "entry_not_a_table": _edit_manifest(
        lambda m: m["variants"].update({VARIANT.name: "junk"}),
        [f"manifest entry for {VARIANT.name} is not a table"]),
}


def _assert_refused(art, expected, capsys):
    found, warned = find()
    assert found.launcher is None and found.where is None
    assert found.arch == "sm90"
    assert len(warned) == 1, warned
    message = warned[0]
    assert message.startswith("liger_aot: refused ")
    for text in expected:
        assert text in message, (text, message)
    assert [r for r in found.reasons if all(t in r for t in expected)], found.reasons
    assert FakeModule.instances == []  # nothing was handed to the driver
    # asked again: the same answer, without a second warning
    again, warned_again = find()
    assert again.launcher is None and warned_again == []
    assert again.reasons == found.reasons
    return message


@pytest.mark.parametrize("case", sorted(BINARY_CASES))
def test_bad_binary_is_refused(art, case, capsys):
    expected = BINARY_CASES[case](art)
    _assert_refused(art, expected, capsys)
    # only that variant is refused: a neighbour still loads
    other = SPEC.variant("bf16", "any", OPTIONS, CONFIG)
    found, warned = find(other)
    assert found.launcher is not None and warned == []
    # `liger-aot verify` reports the same problem and fails
    capsys.readouterr()
    assert cli_main(["verify", "--dir", str(art.root)]) == 1
    out = capsys.readouterr().out
    assert f"BAD sm90: {expected[0]}" in out
    assert "1 bad" in out


@pytest.mark.parametrize("case", sorted(SET_CASES))
def test_bad_manifest_is_refused(art, case, capsys):
    expected = SET_CASES[case](art)
    _assert_refused(art, expected, capsys)
    capsys.readouterr()
    assert cli_main(["verify", "--dir", str(art.root)]) == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and str(art.manifest_path) in out


def test_variant_absent_from_manifest(art):
    manifest = art.manifest()
    del manifest["variants"][VARIANT.name]
    art.write_manifest(manifest)
    found, warned = find()
    assert found.launcher is None and warned == []
    assert found.reasons == ["not in any artifact set for sm90"]


def test_no_artifact_set(art, tmp_path, monkeypatch):
    monkeypatch.setenv("LIGER_AOT_ARTIFACT_DIR", str(tmp_path / "nowhere"))
    found, warned = find()
    assert found.launcher is None and warned == []
    assert found.reasons == ["not in any artifact set for sm90"]


def test_refused_set_falls_through_to_the_next(art, tmp_path, monkeypatch):
    """Two roots: the first one's binary is damaged, the second one's is good."""
    second = tmp_path / "second"
    shutil.copytree(art.dir, second / "sm90")
    bad = _flip_byte(art)[0]
    monkeypatch.setenv("LIGER_AOT_ARTIFACT_DIR", os.pathsep.join([str(art.root), str(second)]))
    found, warned = find()
    good = second / "sm90" / art.entry()["file"]
    assert found.where == str(good)
    assert found.launcher.module.image == good.read_bytes()
    assert len(warned) == 1 and bad in warned[0]


def test_unsupported_device(art, monkeypatch):
    monkeypatch.setattr(registry, "device_arch", lambda index: (None, "fake B200 (sm_100)"))
    found, warned = find()
    assert found.launcher is None and warned == []
    assert "fake B200 (sm_100)" in found.arch
    assert found.reasons == ["no ahead-of-time build exists for fake B200 (sm_100)"]


# -- strict mode and the JIT fallback -------------------------------------------------------

def _remove_variant(art):
    manifest = art.manifest()
    del manifest["variants"][VARIANT.name]
    art.write_manifest(manifest)


def test_strict_mode_raises_for_missing_variant(art, monkeypatch):
    _remove_variant(art)
    monkeypatch.setenv("LIGER_AOT_STRICT", "1")
    monkeypatch.setattr(kernel_mod, "_jit_launcher", lambda v: pytest.fail("JIT used"))
    k = Kernel(SPEC)
    with pytest.raises(MissingVariantError) as e:
        k._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    message = str(e.value)
    assert VARIANT.name in message
    assert "liger-aot build --arch sm90" in message
    assert "LIGER_AOT_STRICT=1" in message
    assert "not in any artifact set for sm90" in message
    assert e.value.variant_name == VARIANT.name and e.value.arch == "sm90"
    # through a call too; nothing is cached, so it raises every time
    for _ in range(2):
        with pytest.raises(MissingVariantError):
            k((2,), *aligned_args(SPEC), dtype=torch.bfloat16, config=CONFIG, options=OPTIONS)


def test_strict_mode_names_the_refused_file(art, monkeypatch):
    path = _truncate(art)[0]
    monkeypatch.setenv("LIGER_AOT_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(MissingVariantError) as e:
            Kernel(SPEC)._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    assert path in str(e.value) and "truncated" in str(e.value)


def test_disable_jit_raises(art, monkeypatch):
    _remove_variant(art)
    monkeypatch.setenv("LIGER_AOT_DISABLE_JIT", "1")
    monkeypatch.setattr(kernel_mod, "_jit_launcher", lambda v: pytest.fail("JIT used"))
    with pytest.raises(MissingVariantError) as e:
        Kernel(SPEC)._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    assert "LIGER_AOT_DISABLE_JIT=1" in str(e.value) and VARIANT.name in str(e.value)


def test_default_mode_warns_once_and_uses_jit(art, monkeypatch):
    _remove_variant(art)
    made, launched = [], []

    def fake_jit_launcher(variant):
        made.append(variant)
        return lambda grid, values, args: launched.append(grid)

    monkeypatch.setattr(kernel_mod, "_jit_launcher", fake_jit_launcher)
    k = Kernel(SPEC)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            k((2,), *aligned_args(SPEC), dtype=torch.bfloat16, config=CONFIG, options=OPTIONS)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert VARIANT.name in messages[0]
    assert "sm90" in messages[0] and "liger-aot build --arch sm90" in messages[0]
    assert "Triton JIT" in messages[0]
    assert [v.name for v in made] == [VARIANT.name]
    assert launched == [(2,)] * 3
    # _make_launcher itself, called directly, returns the JIT launcher too
    with pytest.warns(RuntimeWarning, match=VARIANT.name.replace(".", r"\.")):
        launcher = k._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    launcher((1,), (), ())
    assert launched[-1] == (1,)


def test_default_mode_on_unsupported_device(art, monkeypatch):
    monkeypatch.setattr(registry, "device_arch", lambda index: (None, "fake B200 (sm_100)"))
    monkeypatch.setattr(kernel_mod, "_jit_launcher", lambda v: (lambda g, v_, a: None))
    with pytest.warns(RuntimeWarning, match="fake B200"):
        Kernel(SPEC)._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    monkeypatch.setenv("LIGER_AOT_STRICT", "1")
    with pytest.raises(MissingVariantError) as e:
        Kernel(SPEC)._make_launcher(0, torch.bfloat16, True, OPTIONS, CONFIG)
    assert VARIANT.name in str(e.value) and "fake B200" in str(e.value)
