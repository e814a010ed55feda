"""Build-time tuning: the tuned table (kernel_src/tuning.py), the runtime's choice from it, the
build's variant set per arch, and `liger-aot tune` (build_tools/tune.py), measured here with
a fake timer while Triton's interpreter computes the kernels on CPU tensors.

Every test uses a table directory of its own; kernel_src/tuned is only read (by the check of
committed tables)."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from liger_aot.build_tools import aot, tune
from liger_aot.cli import main as cli_main
from liger_aot.kernel_src import all_specs, tuning
from liger_aot.kernel_src.layer_norm import spec as ln
from liger_aot.kernel_src.relu_squared import spec as relu_squared
from liger_aot.kernel_src.rms_norm import spec as rms
from liger_aot.kernel_src.spec import (ALIGN_CLASSES, DTYPES, EXACT_KEY, HOLD_KEY, STAGED_KEYS,
                                       Config, exact_length, inexact_twin, is_staged,
                                       staged_twin)
from liger_aot.kernel_src.swiglu import spec as swiglu
from liger_aot.runtime import Kernel, device, registry

from _artifacts import environ, session_triton_cache

REPO = Path(__file__).resolve().parents[1]
TOOLCHAIN = {"triton_version": "3.6.0", "ptxas_version": "12.8.93"}
NEW_RMS = Config({"BLOCK_M": 2, "BLOCK_N": 4096, "LOOP": False, "STAGES": 1,
                  "PROGRAMS_PER_SM": 0}, num_warps=16)


def _entry(config: Config) -> dict:
    return {"config": tuning.config_record(config), "ms": 1.0}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """write(arch, {spec name: {bucket key: Config}}) into a table directory of the test's
    own; returns the table's path."""
    directory = tmp_path / "tuned"
    directory.mkdir()
    monkeypatch.setattr(tuning, "TUNED_DIR", str(directory))
    tuning.reset()

    def write(arch, specs):
        table = {"format": tuning.TABLE_FORMAT, "arch": arch,
                 "specs": {name: {key: _entry(c) for key, c in buckets.items()}
                           for name, buckets in specs.items()}}
        path = directory / f"{arch}.json"
        path.write_bytes(tuning.format_table(table))
        tuning.reset()
        return path

    yield write
    tuning.reset()


# -- table: lookup, fallback, singletons ---------------------------------------------------

def test_bucket_keys():
    assert tuning.bucket_key(rms.FWD, (3000, False)) == "n_cols=4096,residual=False"
    assert tuning.bucket_key(rms.FWD, (3000,)) == "n_cols=4096,residual=False"  # default
    assert tuning.bucket_key(rms.FWD, (4096, True)) == "n_cols=4096,residual=True"
    assert tuning.bucket_key(rms.BWD, (4097, True)) == "n_cols=8192,dres=True"
    assert tuning.bucket_key(swiglu.FWD, (14336,)) == "n_cols=16384"
    assert tuning.bucket_key(swiglu.FWD, (1,)) == "n_cols=1"


def test_without_a_table_everything_is_the_rule(tables):
    for spec in all_specs():
        assert [v.name for v in spec.variants("sm90")] == [v.name for v in spec.variants()]
    for n in (1, 100, 3000, 4096, 5000, 65536, 300000):
        for flag in (False, True):
            assert tuning.select(rms.FWD, "sm90", (n, flag)) is rms.select_config(n, flag)
            assert tuning.select(rms.BWD, "sm90", (n, flag)) is rms.select_bwd_config(n, flag)


def test_table_lookup_and_fallback(tables):
    heuristic_1024 = rms.select_config(1024, False)
    tables("sm90", {"rms_norm_fwd": {
        "n_cols=4096,residual=False": NEW_RMS,
        "n_cols=1024,residual=False": Config(dict(heuristic_1024.constexprs),
                                             heuristic_1024.num_warps)}})
    got = tuning.select(rms.FWD, "sm90", (3000, False))
    assert got.tag == NEW_RMS.tag
    assert got is tuning.select(rms.FWD, "sm90", (4096, False))  # one object per process
    assert got is tuning.select(rms.FWD, "sm90", (2049,))  # the rule's default filled in
    assert tuning.select(rms.FWD, "sm90", (1000, False)) is heuristic_1024  # the spec's own
    for args in ((3000, True), (8192, False), (100, False), (300000, False)):  # other buckets
        assert tuning.select(rms.FWD, "sm90", args) is rms.select_config(*args)
    assert tuning.select(rms.FWD, "sm80", (3000, False)) is rms.select_config(3000, False)
    assert tuning.select(rms.FWD, None, (3000, False)) is rms.select_config(3000, False)
    assert tuning.select(rms.BWD, "sm90", (3000, False)) is rms.select_bwd_config(3000, False)
    assert tuning.select(rms.FWD, "sm90", (3000, False), 2) is got
    assert tuning.select(rms.FWD, "sm90", (3000, False), 4) is rms.select_config(3000, False)


def _wide_pass1(exact: bool) -> Config:
    return Config({"BLOCK_M": 1, "BLOCK_N": 8192, "LOOP": True, "STAGES": 1,
                   "PROGRAMS_PER_SM": 0, "PASS1_BLOCK": 32768,
                   **({EXACT_KEY: 1} if exact else {})}, num_warps=16)


def test_an_exact_length_config_serves_its_length_and_its_twin_the_rest(tables):
    """A tuned config with the row length compiled in (EXACT_KEY) runs rows of that length
    only; the bucket's other lengths take its twin without the key, which the build compiles
    too, and both are one object a process."""
    tables("sm90", {"rms_norm_fwd": {"n_cols=32768,residual=False": _wide_pass1(True)}})
    exact = tuning.select(rms.FWD, "sm90", (32768, False))
    assert exact.constexprs[EXACT_KEY] == 1 and exact_length(exact) == 32768
    twin = tuning.select(rms.FWD, "sm90", (20480, False))
    assert twin.tag == _wide_pass1(False).tag
    assert twin is tuning.select(rms.FWD, "sm90", (32752, False))
    assert exact is tuning.select(rms.FWD, "sm90", (32768,))
    built = {c.tag: c for c in tuning.arch_configs(rms.FWD, "sm90")}
    assert built[exact.tag] is exact and built[twin.tag] is twin
    assert {v.config.tag for v in rms.FWD.variants("sm90")} >= {exact.tag, twin.tag}
    # a table without exact configs builds no twins
    tables("sm90", {"rms_norm_fwd": {"n_cols=32768,residual=False": _wide_pass1(False)}})
    assert len(tuning.arch_configs(rms.FWD, "sm90")) == len(rms.FWD.configs) + 1


def test_an_exact_configs_bucket_runs_its_inexact_config_at_other_lengths(tables):
    """An entry's "inexact" record (tune.measure_inexact) names what the bucket's other
    lengths run instead of the exact config's twin; the build compiles it and not the twin."""
    path = tables("sm90", {"rms_norm_fwd": {"n_cols=32768,residual=False": _wide_pass1(True)}})
    table = json.loads(path.read_bytes())
    table["specs"]["rms_norm_fwd"]["n_cols=32768,residual=False"]["inexact"] = {
        "config": tuning.config_record(NEW_RMS), "shape": [4, 24576], "ms": 1.0,
        "twin_ms": 1.2}
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    assert tuning.select(rms.FWD, "sm90", (32768, False)).constexprs[EXACT_KEY] == 1
    other = tuning.select(rms.FWD, "sm90", (20480, False))
    assert other.tag == NEW_RMS.tag and other is tuning.select(rms.FWD, "sm90", (32752,))
    built = {c.tag for c in tuning.arch_configs(rms.FWD, "sm90")}
    assert NEW_RMS.tag in built and _wide_pass1(False).tag not in built
    # an inexact config with a row length compiled in would serve none of those lengths
    table["specs"]["rms_norm_fwd"]["n_cols=32768,residual=False"]["inexact"]["config"] = \
        tuning.config_record(_wide_pass1(True))
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    with pytest.raises(ValueError, match="bad entry for rms_norm_fwd.*inexact config"):
        tuning.select(rms.FWD, "sm90", (20480, False))


def test_a_length_of_the_inexact_record_runs_its_own_config(tables):
    """An "inexact" record's "lengths" (tune._own_lengths): that very row length runs its own
    config, the bucket's other lengths the record's, and the build compiles all of them. A
    length outside the bucket's other lengths, or an own config with a row length compiled
    in, is refused naming the spec."""
    path = tables("sm90", {"rms_norm_fwd": {"n_cols=16384,residual=False": NEW_RMS}})
    table = json.loads(path.read_bytes())
    entry = table["specs"]["rms_norm_fwd"]["n_cols=16384,residual=False"]
    looped, own = _wide_pass1(False), Config({"BLOCK_M": 1, "BLOCK_N": 2048, "LOOP": True,
                                              "STAGES": 1, "PROGRAMS_PER_SM": 0}, num_warps=8)
    entry["shape"] = [4096, 16384]
    entry["inexact"] = {"config": tuning.config_record(looped), "shape": [4, 12288],
                        "lengths": {"10240": {"config": tuning.config_record(own), "ms": 0.9,
                                              "inexact_ms": 1.0}}}
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    assert [tuning.select(rms.FWD, "sm90", (n, False)).tag
            for n in (16384, 10240, 10239, 10256, 12288)] == [
        NEW_RMS.tag, own.tag, looped.tag, looped.tag, looped.tag]
    assert tuning.length_configs(rms.FWD, "sm90") == {
        "n_cols=16384,residual=False": {10240: tuning.select(rms.FWD, "sm90", (10240,))}}
    assert {NEW_RMS.tag, looped.tag, own.tag} <= {
        c.tag for c in tuning.arch_configs(rms.FWD, "sm90")}
    for length in ("8192", "16384"):
        entry["inexact"]["lengths"] = {length: {"config": tuning.config_record(own)}}
        path.write_bytes(tuning.format_table(table))
        tuning.reset()
        with pytest.raises(ValueError, match=f"bad entry for rms_norm_fwd.*inexact length "
                                             f"{length}"):
            tuning.select(rms.FWD, "sm90", (12288, False))
    entry["inexact"]["lengths"] = {"10240": {"config": tuning.config_record(_wide_pass1(True))}}
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    with pytest.raises(ValueError, match="bad entry for rms_norm_fwd.*inexact config"):
        tuning.select(rms.FWD, "sm90", (12288, False))


def test_a_buckets_other_lengths_run_its_inexact_config(tables):
    """Any entry's "inexact" record, not only an exact config's: the length the entry was
    measured at (its shape's) runs its config, the bucket's other lengths the inexact one;
    the build compiles both. Without the shape the entry is refused."""
    path = tables("sm90", {"rms_norm_fwd": {"n_cols=16384,residual=False": NEW_RMS}})
    table = json.loads(path.read_bytes())
    entry = table["specs"]["rms_norm_fwd"]["n_cols=16384,residual=False"]
    looped = _wide_pass1(False)
    entry["inexact"] = {"config": tuning.config_record(looped), "shape": [4, 12288]}
    entry["shape"] = [4096, 16384]
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    assert tuning.select(rms.FWD, "sm90", (16384, False)).tag == NEW_RMS.tag
    for n in (8193, 12288, 16383):
        assert tuning.select(rms.FWD, "sm90", (n, False)).tag == looped.tag
    assert tuning.inexact_configs(rms.FWD, "sm90") == {
        "n_cols=16384,residual=False": tuning.select(rms.FWD, "sm90", (12288, False))}
    built = {c.tag for c in tuning.arch_configs(rms.FWD, "sm90")}
    assert {NEW_RMS.tag, looped.tag} <= built
    del entry["shape"]
    path.write_bytes(tuning.format_table(table))
    tuning.reset()
    with pytest.raises(ValueError, match="bad entry for rms_norm_fwd.*'shape'"):
        tuning.select(rms.FWD, "sm90", (12288, False))


def test_layer_norm_offers_each_exact_pass1_once_with_the_row_held():
    """One HOLD_KEY candidate for each (rows, warps) of the exact whole-row pass 1s (BLOCK_N
    is unused there), and on one warp up to 64 columns a thread, each up to two registers a
    held column (none on 32 warps at 64 columns a thread: 64K has none); its inexact twin
    is an inexact candidate; RMSNorm offers none."""
    for bucket in (1024, 2048, 8192, 16384, 32768, 65536):
        wide = [c for c in tune.CASES["layer_norm_fwd"].candidates(bucket)
                if c.constexprs.get(EXACT_KEY)]
        held = [c for c in wide if c.constexprs.get(HOLD_KEY)]
        shapes = {(c.constexprs["BLOCK_M"], c.num_warps) for c in wide
                  if 2 * c.constexprs["BLOCK_M"] * bucket // (32 * c.num_warps)
                  <= min(255, 2048 // c.num_warps)}
        shapes |= {(rows, 1) for rows in (1, 2) if rows * bucket <= 2048}
        assert sorted((c.constexprs["BLOCK_M"], c.num_warps) for c in held) == sorted(shapes)
        assert bool(held) == (bucket < 65536)
        # the twin (the bucket's other lengths) is a candidate too, but on one warp, which
        # only the held rows take: there the looped kernel's inexact rows, compiled beside it
        inexact = {c.tag for c in tune.CASES["layer_norm_fwd"].candidates(bucket)}
        for c in held:
            twin = inexact_twin(c)
            assert twin.tag in inexact or (
                c.num_warps == 1 and twin.constexprs["LOOP"]
                and not {EXACT_KEY, HOLD_KEY} & set(twin.constexprs)), c.tag
    assert not [c for c in tune.CASES["rms_norm_fwd"].candidates(16384)
                if HOLD_KEY in c.constexprs]


def test_layer_norms_held_rows_compile_for_sm90_without_spills():
    """The held rows the tuner offers with 64 columns a thread (32K on 16 warps, 1K two rows
    on one warp) compile for sm90 with no stack (where ptxas's spills go): a candidate that
    spills only costs the tune."""
    from _sm90 import compile_sm90

    held = [c for b in (1024, 32768) for c in tune.CASES["layer_norm_fwd"].candidates(b)
            if c.constexprs.get(HOLD_KEY)
            and c.constexprs["BLOCK_M"] * b // (32 * c.num_warps) == 64]
    assert len(held) == 2
    for c in held:
        kernel = compile_sm90(ln.FWD, (), c)
        assert kernel["stack"] == 0 and kernel["local"] == 0, (c.tag, kernel["stack"])


def test_a_held_row_config_needs_its_length_compiled_in(tables):
    held = Config({"BLOCK_M": 1, "BLOCK_N": 4096, "LOOP": True, "STAGES": 1,
                   "PROGRAMS_PER_SM": 0, "PASS1_BLOCK": 16384, HOLD_KEY: 1}, num_warps=16)
    tables("sm90", {"layer_norm_fwd": {"n_cols=16384": held}})
    with pytest.raises(ValueError, match="HOLD_ROW needs EXACT_N"):
        tuning.select(ln.FWD, "sm90", (16384,))


def test_an_exact_length_config_needs_a_whole_row_pass1(tables):
    whole_row = Config({**NEW_RMS.constexprs, EXACT_KEY: 1}, num_warps=16)
    tables("sm90", {"rms_norm_fwd": {"n_cols=4096,residual=False": whole_row}})
    with pytest.raises(ValueError, match="EXACT_N needs looped rows"):
        tuning.select(rms.FWD, "sm90", (4096, False))


def test_kernel_select_config(tables, monkeypatch):
    tables("sm90", {"rms_norm_fwd": {"n_cols=4096,residual=False": NEW_RMS}})
    kernel = Kernel(rms.FWD)
    # CPU tensors (device -1): always the rule, so the interpreter path is unchanged
    assert kernel.select_config(-1, 3000, False) is rms.select_config(3000, False)
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm90", "fake H200"))
    monkeypatch.setattr(registry, "tuned_table_usable", lambda arch: True)
    got = kernel.select_config(0, 3000, False)
    assert got.tag == NEW_RMS.tag and got is kernel.select_config(0, 3000, False)
    assert kernel.select_config(0, 3000, True) is rms.select_config(3000, True)
    # an entry applies to data of the element size it was measured with (bf16 here): fp16
    # shares it, fp32 takes the rule (a tuned config's shared memory may not fit at 4 bytes)
    assert kernel.select_config(0, 3000, False, dtype=torch.bfloat16) is got
    assert kernel.select_config(0, 3000, False, dtype=torch.float16) is got
    assert kernel.select_config(0, 3000, False, dtype=torch.float32) is \
        rms.select_config(3000, False)
    assert kernel.select_config(0, 3000, False) is got  # no dtype: the entry
    # an artifact set built with another table: the rule
    monkeypatch.setattr(registry, "tuned_table_usable", lambda arch: False)
    assert Kernel(rms.FWD).select_config(0, 3000, False) is rms.select_config(3000, False)
    # another arch: the rule
    monkeypatch.setattr(registry, "tuned_table_usable", lambda arch: True)
    monkeypatch.setattr(device, "device_arch", lambda index: ("sm80", "fake A100"))
    assert Kernel(rms.FWD).select_config(0, 3000, False) is rms.select_config(3000, False)


def test_tuned_table_usable_follows_the_manifest(tables, monkeypatch):
    assert not registry.tuned_table_usable("sm90")  # no table
    path = tables("sm90", {"rms_norm_fwd": {"n_cols=4096,residual=False": NEW_RMS}})
    digest = tuning.table_sha256("sm90")
    sets = []
    monkeypatch.setattr(registry, "artifact_sets", lambda arch: sets)
    assert registry.tuned_table_usable("sm90")  # no artifact set: the JIT compiles anything
    sets[:] = [registry.ArtifactSet("sm90", "/x", "env", error="bad"),
               registry.ArtifactSet("sm90", "/y", "env", manifest={"tuned_sha256": digest})]
    assert registry.tuned_table_usable("sm90")
    sets[1] = registry.ArtifactSet("sm90", "/z", "env", manifest={"tuned_sha256": None})
    registry.reset()
    with pytest.warns(RuntimeWarning, match="another tuned table"):
        assert not registry.tuned_table_usable("sm90")
    assert path.is_file()


@pytest.mark.parametrize("text,match", [
    (b"{", "not JSON"),
    (b'{"format": 1, "arch": "sm80", "specs": {}}', "for arch 'sm80'"),
    (b'{"format": 9, "arch": "sm90", "specs": {}}', "format"),
    (b'{"format": 1, "arch": "sm90", "specs": {"rms_norm_fwd": {"n_cols=4096,residual=False":'
     b' {"config": {"constexprs": {"BLOCK": 4}, "num_warps": 4, "num_stages": 1}}}}}',
     "bad entry for rms_norm_fwd"),
])
def test_malformed_table_raises(tables, text, match):
    path = tables("sm90", {})
    path.write_bytes(text)
    tuning.reset()
    with pytest.raises(ValueError, match=match) as info:
        tuning.select(rms.FWD, "sm90", (3000, False))
    assert "sm90.json" in str(info.value)


# -- build: the arch's variant set and content keys ----------------------------------------

def _names(variants_of_config):
    return {f"swiglu_fwd.{d}.{a}.{variants_of_config}" for d in DTYPES for a in ALIGN_CLASSES}


def test_build_plan_holds_tuned_configs_for_that_arch_only(tables):
    before = {arch: aot.plan_arch(arch, TOOLCHAIN) for arch in ("sm90", "sm80")}
    tuned = Config({"BLOCK_M": 2, "BLOCK_N": 2048}, num_warps=8)
    heuristic = swiglu.select_config(4096)
    tables("sm90", {"swiglu_fwd": {"n_cols=16384": tuned,
                                   "n_cols=4096": Config(dict(heuristic.constexprs), 4)}})
    after = {arch: aot.plan_arch(arch, TOOLCHAIN) for arch in ("sm90", "sm80")}
    assert set(after["sm90"]) - set(before["sm90"]) == _names(tuned.tag)  # deduplicated by tag
    assert {n: k for n, (_, k) in before["sm90"].items()} == {
        n: k for n, (_, k) in after["sm90"].items() if n in before["sm90"]}
    assert {n: k for n, (_, k) in after["sm80"].items()} == {
        n: k for n, (_, k) in before["sm80"].items()}
    assert [v.name for v in swiglu.FWD.variants()] == [v.name for v in swiglu.FWD.variants("sm80")]


def test_changing_the_table_changes_content_keys(tables):
    keys = {}
    for tag, config in (("a", Config({"BLOCK_M": 2, "BLOCK_N": 2048}, num_warps=8)),
                        ("b", Config({"BLOCK_M": 4, "BLOCK_N": 1024}, num_warps=8))):
        tables("sm90", {"swiglu_fwd": {"n_cols=16384": config}})
        keys[tag] = ({k for _, k in aot.plan_arch("sm90", TOOLCHAIN).values()},
                     tuning.table_sha256("sm90"))
    (keys_a, sha_a), (keys_b, sha_b) = keys["a"], keys["b"]
    assert sha_a != sha_b
    assert len(keys_a - keys_b) == len(keys_b - keys_a) == len(DTYPES) * len(ALIGN_CLASSES)


@pytest.mark.slow
def test_build_compiles_the_tuned_configs(tables, tmp_path, tmp_path_factory, monkeypatch,
                                          capsys):
    """A real build of one small spec for sm90 (tuned) and sm80 (not), a rebuild after the
    table changed, then verify and inspect."""
    monkeypatch.setattr(aot, "all_specs", lambda: [relu_squared.FWD])
    out = tmp_path / "out"
    first, second = Config({"BLOCK": 1024}, num_warps=4), Config({"BLOCK": 4096}, num_warps=8)
    tables("sm90", {"relu_squared_fwd": {"n=1048576": first}})

    def build(archs):
        messages = []
        with environ(TRITON_CACHE_DIR=session_triton_cache(tmp_path_factory)):
            results = aot.build(archs, str(out), jobs=2, log=messages.append)
        return {r.arch: r for r in results}

    def manifest(arch):
        return json.loads((out / arch / "manifest.json").read_bytes())

    six = len(DTYPES) * len(ALIGN_CLASSES)
    r = build(["sm90", "sm80"])
    assert (r["sm90"].variants, r["sm90"].compiled) == (2 * six, 2 * six)
    assert (r["sm80"].variants, r["sm80"].compiled) == (six, six)
    names = {f"relu_squared_fwd.{d}.{a}.{first.tag}" for d in DTYPES for a in ALIGN_CLASSES}
    assert names <= set(manifest("sm90")["variants"])
    assert not names & set(manifest("sm80")["variants"])
    assert manifest("sm90")["tuned_sha256"] == tuning.table_sha256("sm90")
    assert manifest("sm80")["tuned_sha256"] is None

    tables("sm90", {"relu_squared_fwd": {"n=1048576": second}})
    capsys.readouterr()
    assert cli_main(["verify", "--dir", str(out)]) == 0  # built with the other table: a note
    text = capsys.readouterr().out
    assert "NOTE sm90: built with another tuned table" in text
    assert f"{six} ok, 0 bad" in text and f"{six} of the other table" in text

    r = build(["sm90"])
    assert (r["sm90"].compiled, r["sm90"].reused, r["sm90"].removed) == (six, six, 2 * six)
    assert manifest("sm90")["tuned_sha256"] == tuning.table_sha256("sm90")
    assert cli_main(["verify", "--dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "NOTE" not in text and f"sm90 [dir] {out / 'sm90'}: {2 * six} ok, 0 bad" in text

    registry.reset()
    try:
        with environ(LIGER_AOT_ARTIFACT_DIR=out, LIGER_AOT_IGNORE_CACHE=1):
            assert cli_main(["inspect"]) == 0
    finally:
        registry.reset()
    text = capsys.readouterr().out
    assert f"{'relu_squared_fwd':<28} {2 * six:>5} variants" in text
    assert f"tuned table {tuning.table_sha256('sm90')[:12]}" in text


# -- candidates -----------------------------------------------------------------------------

FLAG_WHOLE_ROW_MAX = {"rms_norm_fwd": rms.RESIDUAL_MAX_BLOCK_N,
                      "rms_norm_bwd": rms.DRES_MAX_BLOCK_N}
LOOP_ROWS = {"rms_norm_bwd", "layer_norm_bwd"}  # looped kernels that take BLOCK_M rows a step
SMALL_WARPS = {"rms_norm_fwd", "layer_norm_fwd"}  # rows also on 1-2 warps


@pytest.mark.parametrize("name", list(tune.CASES))
def test_candidates_are_configs_the_kernel_supports(name):
    case = tune.CASES[name]
    keys = set(case.spec.configs[0].constexprs)
    flags = (False, True) if len(case.shapes[0]) > 2 else (False,)
    assert name in FLAG_WHOLE_ROW_MAX or flags == (False,)
    for bucket in (2 ** k for k in range(4, 19)):
        for flag in flags:
            configs = list(case.candidates(bucket, flag))
            assert len({c.tag for c in configs}) == len(configs)
            for c in configs:
                if is_staged(c):
                    _check_staged_candidate(name, c, bucket, flag)
                    continue
                assert set(c.constexprs) - {"PASS1_BLOCK", EXACT_KEY, HOLD_KEY} == keys, c.tag
                if "PASS1_BLOCK" in c.constexprs:
                    _check_wide_pass1_candidate(case, c, bucket, flag)
                else:
                    assert EXACT_KEY not in c.constexprs, c.tag
                m, n = c.constexprs["BLOCK_M"], c.constexprs["BLOCK_N"]
                if c.num_warps < 4:  # the forwards' rows on 1-2 warps, one program a block
                    assert name in SMALL_WARPS and c.num_warps in (1, 2), c.tag
                    assert c.constexprs["PROGRAMS_PER_SM"] == 0, c.tag
                    # elements a thread: whole rows up to 64, looped rows (from 1K) 8-32
                    top = 32 if c.constexprs["LOOP"] else 64
                    assert 8 <= m * n // (32 * c.num_warps) <= top, c.tag
                else:
                    assert c.num_warps in (4, 8, 16, 32), c.tag
                    assert 8 <= m * n // (32 * c.num_warps) <= 32, c.tag
                assert c.num_stages == 1, c.tag
                if "STAGES" in keys:  # launch shapes of the persistent norm kernels
                    assert c.constexprs["STAGES"] in (1, 2, 3, 4), c.tag
                    per_sm = c.constexprs["PROGRAMS_PER_SM"]
                    if c.constexprs.get("CHUNK_ROWS"):  # interleaved looped backwards
                        assert c.constexprs["LOOP"] and per_sm == 0, c.tag
                        assert c.constexprs["CHUNK_ROWS"] % c.constexprs["BLOCK_M"] == 0
                    else:
                        assert per_sm in ((1, 2, 4) if name.endswith("_bwd")
                                          else (0, 1, 2, 4)), c.tag
                assert m & (m - 1) == 0 and n & (n - 1) == 0, c.tag  # powers of two
                if "LOOP" not in keys:  # gated activations: a 2-D grid covers any row
                    assert m * n <= 4096, c.tag
                elif c.constexprs["LOOP"]:
                    assert n < bucket, c.tag  # looping over the row's column blocks
                    # one row a step, or 2-4 in tiles of at most 8K elements, or two rows of
                    # the forwards' whole-row pass 1 (checked below)
                    assert m == 1 or (name in LOOP_ROWS and m in (2, 4) and m * n <= 8192) \
                        or (m == 2 and "PASS1_BLOCK" in c.constexprs), c.tag
                else:
                    assert n >= bucket and m * n <= 32768, c.tag  # the whole row in the tile
                    if flag:  # wider tiles compile the residual path out
                        assert n <= FLAG_WHOLE_ROW_MAX[name], c.tag


def _check_wide_pass1_candidate(case, c, bucket, flag):
    """A looped norm forward whose pass 1 takes the bucket's row in one chunk: one row a
    step, plain forwards only (the fused residual keeps its chunks), at most 64 elements a
    thread, and a constexpr the kernel defaults (the AOT compile names it for the others)."""
    assert "PASS1_BLOCK" in case.spec.constexpr_defaults, c.tag
    assert case.spec.name in ("rms_norm_fwd", "layer_norm_fwd") and not flag, c.tag
    k = c.constexprs
    assert k["LOOP"] and k["BLOCK_M"] in (1, 2) and k["PASS1_BLOCK"] == bucket > k["BLOCK_N"], \
        c.tag
    assert k["BLOCK_M"] * bucket // (32 * c.num_warps) <= 64, c.tag
    # the bucket's length compiled in, or not (the tuned shapes' rows are the bucket's)
    assert k.get(EXACT_KEY, 1) == 1 and EXACT_KEY in case.spec.constexpr_defaults, c.tag
    assert exact_length(c) == bucket, c.tag
    # pass 2 from the held row: LayerNorm's, with the length compiled in, no loop to stage
    if HOLD_KEY in k:
        assert case.spec.name == "layer_norm_fwd" and k[HOLD_KEY] == 1 and k.get(EXACT_KEY), \
            c.tag
        assert HOLD_KEY in case.spec.constexpr_defaults and k["STAGES"] == 1, c.tag


def test_norm_forwards_offer_each_whole_row_pass1_with_its_length_compiled_in():
    for name in ("rms_norm_fwd", "layer_norm_fwd"):
        wide = [c for c in tune.CASES[name].candidates(32768) if "PASS1_BLOCK" in c.constexprs]
        exact = {inexact_twin(c).tag for c in wide if c.constexprs.get(EXACT_KEY)}
        assert exact and exact == {c.tag for c in wide if EXACT_KEY not in c.constexprs}
    for name in ("softmax_fwd", "rms_norm_bwd"):  # kernels without the constexpr
        assert not [c for b in (16384, 32768) for c in tune.CASES[name].candidates(b)
                    if EXACT_KEY in c.constexprs]


@pytest.mark.parametrize("name", ["rms_norm_fwd", "layer_norm_fwd"])
def test_norm_forwards_offer_a_whole_row_pass1_from_1k(name):
    case = tune.CASES[name]
    for bucket in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        wide = [c for c in case.candidates(bucket) if "PASS1_BLOCK" in c.constexprs]
        assert bool(wide) == (bucket >= 1024), bucket
        if bucket == 65536:  # 32 warps only: 16 would be 128 elements a thread
            assert {c.num_warps for c in wide} == {32}
        if bucket < 1024:
            continue
        # one row, pass 2 by half the row at 8 elements a thread (16 at 32K, on 32 warps),
        # as the 4K forwards' best (session 26: 2048 columns on 8 warps): 512 columns on 2
        # warps at 1K, 1024 on 4 at 2K
        half = bucket // 2
        assert any(c.constexprs["BLOCK_M"] == 1 and c.constexprs["BLOCK_N"] == half
                   and c.num_warps == min(half // 256, 32) for c in wide) == \
            (bucket <= 32768), bucket
        # pass 2 by 2048 columns on 8 warps too (session 19: LayerNorm 8K's best tile)
        assert any(c.constexprs["BLOCK_N"] == 2048 and c.num_warps == 8 for c in wide) == \
            (4096 <= bucket <= 16384), bucket
    if name == "rms_norm_fwd":
        assert not [c for c in case.candidates(32768, True) if "PASS1_BLOCK" in c.constexprs]
        # the fused residual keeps BLOCK_N chunks in pass 1: at 4K, looped rows by 512-2048
        looped = {(c.constexprs["BLOCK_M"], c.constexprs["BLOCK_N"], c.num_warps)
                  for c in case.candidates(4096, True) if c.constexprs["LOOP"]}
        assert looped == {(1, 512, 2), (1, 1024, 2), (1, 1024, 4), (1, 2048, 2),
                          (1, 2048, 4), (1, 2048, 8)}
    # two rows a program (w and b read once for both), where the pair is 64 a thread at most
    pairs = {b: {(c.constexprs["BLOCK_N"], c.num_warps) for c in case.candidates(b)
                 if "PASS1_BLOCK" in c.constexprs and c.constexprs["BLOCK_M"] == 2
                 and HOLD_KEY not in c.constexprs}
             for b in (1024, 2048, 8192, 32768, 65536)}
    assert pairs == {1024: {(512, 2), (512, 4)},
                     2048: {(512, 2), (512, 4), (1024, 2), (1024, 4), (1024, 8)},
                     8192: {(1024, 8), (2048, 8), (2048, 16), (4096, 8), (4096, 16),
                            (4096, 32)},
                     32768: {(4096, 32), (8192, 32), (16384, 32)}, 65536: set()}


@pytest.mark.parametrize("name", ["rms_norm_fwd", "layer_norm_fwd"])
def test_norm_forwards_offer_a_row_on_one_warp(name):
    """torch.compile's 1K LayerNorm forward tile (one row on one warp, its sums in shuffles)
    and a 2K row on one warp; the backwards keep 4 warps and more."""
    case = tune.CASES[name]
    def small(bucket):
        return {(c.constexprs["BLOCK_M"], c.num_warps) for c in case.candidates(bucket)
                if c.num_warps < 4 and not c.constexprs["LOOP"]}
    assert small(1024) == {(1, 1), (1, 2), (2, 1), (2, 2), (4, 2)}
    assert small(2048) == {(1, 1), (1, 2), (2, 2)}
    assert small(4096) == {(1, 2)}
    assert small(8192) == set()
    backward = tune.CASES[name.replace("_fwd", "_bwd")]
    assert min(c.num_warps for b in (1024, 2048) for c in backward.candidates(b)) == 4


def _check_staged_candidate(name, c, bucket, flag):
    """A staged forward config (kernel_src/staged_rows.py): plain forwards from 16K columns,
    one program an SM, the bucket's row in STAGED chunks, a ring holding at least a row, and
    ring plus staged weights within the shared memory budget."""
    keys = set(tune.CASES[name].spec.configs[0].constexprs) | set(STAGED_KEYS)
    assert name in ("rms_norm_fwd", "layer_norm_fwd") and not flag, c.tag
    assert set(c.constexprs) == keys and bucket >= tune.STAGED_FROM, c.tag
    k = c.constexprs
    assert k["LOOP"] and k["BLOCK_M"] == 1 and k["PROGRAMS_PER_SM"] == 1, c.tag
    assert k["STAGED"] * k["BLOCK_N"] == bucket and k["STAGED"] >= 2, c.tag
    assert k["STAGED"] <= k["STAGES"] <= 3 * k["STAGED"], c.tag
    assert 8 <= k["BLOCK_N"] // (32 * c.num_warps) <= 16 and c.num_warps <= 32, c.tag
    weight_rows = 2 if name == "layer_norm_fwd" else 1
    shared = (k["STAGES"] * k["BLOCK_N"] + k["W_SHARED"] * weight_rows * bucket) * 2
    assert shared <= tune.STAGED_SHARED_BYTES, c.tag


def test_staged_candidates_where_they_fit():
    tags = {b: [c.tag for c in tune.CASES["layer_norm_fwd"].candidates(b) if is_staged(c)]
            for b in (8192, 16384, 65536)}
    assert tags[8192] == []
    assert any("W_SHARED=1" in t for t in tags[16384])
    # w and b of a 64K row (256 KB) do not fit beside it: loaded a chunk ahead only
    assert tags[65536] and all("W_SHARED=0" in t for t in tags[65536])
    assert not [c for c in tune.CASES["rms_norm_fwd"].candidates(32768, True) if is_staged(c)]


def test_measure_refuses_staged_configs_for_4_byte_data():
    case = tune.CASES["layer_norm_fwd"]
    config = next(c for c in case.candidates(16384) if is_staged(c))
    (got, ms, why), = tune.measure(case, (4, 16384), [config], "cpu", lambda run, c: 0.0,
                                   torch.float32)
    assert got is config and ms is None and "2-byte" in why


@pytest.mark.parametrize("name", list(tune.CASES))
def test_plan_measures_the_heuristic_first(name):
    case = tune.CASES[name]
    for shape in case.shapes:
        configs = tune.candidates_of(case, shape)
        assert configs[0] is case.spec.rule(*shape[1:])
        assert shape[1] % 16 == 0  # what the aligned (a16) variants serve
        assert len(configs) >= 2


def _parse_bucket(key: str) -> tuple:
    values = [v.split("=", 1)[1] for v in key.split(",")]
    return (int(values[0]), *(v == "True" for v in values[1:]))


@pytest.mark.parametrize("path", sorted((REPO / "kernel_src" / "tuned").glob("*.json")),
                         ids=lambda p: p.name)
def test_committed_tables_are_valid(path):
    """A committed table is formatted as the tuner writes it and only holds configs the
    tuner may choose for the bucket (the heuristic's or a candidate)."""
    data = path.read_bytes()
    table = json.loads(data)
    assert data == tuning.format_table(table)
    assert table["arch"] == path.stem and table["format"] == tuning.TABLE_FORMAT
    for name, buckets in table["specs"].items():
        case = tune.CASES[name]
        for key, entry in buckets.items():
            args = _parse_bucket(key)
            assert tuning.bucket_key(case.spec, args) == key
            allowed = {c.tag for c in tune.candidates_of(case, (1, *args))}
            assert tune._tag(entry["config"]) in allowed, (name, key)


# -- `liger-aot tune` -----------------------------------------------------------------------

def test_tune_without_a_gpu_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["tune", "--arch", "sm90"]) == 2
    err = capsys.readouterr().err
    assert "liger-aot tune: error:" in err and "torch sees no GPU" in err


def test_tune_on_another_arch_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(device, "device_arch", lambda i: ("sm80", "NVIDIA A100 (sm_80)"))
    assert cli_main(["tune", "--arch", "sm90"]) == 2
    err = capsys.readouterr().err
    assert "this GPU is NVIDIA A100 (sm_80)" in err and "on an sm90 GPU" in err


@pytest.mark.parametrize("argv,match", [
    (["tune", "--arch", "sm90,sm80"], "one arch at a time"),
    (["tune", "--arch", "sm75"], "unknown arch"),
    (["tune", "--arch", "sm90", "--specs", "rms_norm_fwd,nope"], "tunable specs are rms_norm"),
])
def test_tune_bad_arguments(argv, match, capsys):
    assert cli_main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "four"])
def test_tune_graphs_top_takes_a_count(value, capsys):
    with pytest.raises(SystemExit) as info:
        cli_main(["tune", "--arch", "sm90", "--graphs-top", value, "--dry-run"])
    assert info.value.code == 2
    assert f"--graphs-top: takes a count >= 0, got '{value}'" in capsys.readouterr().err


def test_tune_dry_run_and_help(capsys):
    assert cli_main(["tune", "--arch", "sm90", "--dry-run", "--specs", "softmax_fwd"]) == 0
    out = capsys.readouterr().out
    assert "softmax_fwd" in out and "n_cols=131072" in out and "nothing measured" in out
    assert "rms_norm" not in out
    with pytest.raises(SystemExit) as info:
        cli_main(["tune", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for words in ("--dry-run", "--specs", "--out", "torch reference", "2% faster", "H200",
                  "--graphs-top", "CUDA-graph replays", "--inexact-only", "3/4, 5/8 and 7/8 of its length"):
        assert words in out, words


def test_tune_inexact_only_needs_a_table(tables, capsys):
    assert cli_main(["tune", "--arch", "sm80", "--dry-run", "--inexact-only"]) == 2
    assert "adds to a tuned table of sm80, and there is none" in capsys.readouterr().err


def test_tune_inexact_only_dry_run_names_the_tables_configs(tables, capsys):
    tables("sm90", {"rms_norm_fwd": {"n_cols=32768,residual=False": _wide_pass1(True),
                                     "n_cols=16384,residual=False": NEW_RMS}})
    assert cli_main(["tune", "--arch", "sm90", "--dry-run", "--inexact-only", "--specs",
                     "rms_norm_fwd", "--cols", "16384,32768"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def line_of(key):
        return next(line for line in lines if key in line)

    exact = line_of("n_cols=32768,residual=False")
    assert "2730x24576" in exact and f"the twin of {_wide_pass1(True).tag}" in exact
    whole = line_of("n_cols=16384,residual=False")
    assert "5461x12288" in whole and f"the table's {NEW_RMS.tag}" in whole
    assert "no record in the table" in line_of("n_cols=16384,residual=True")


def test_tune_cols_selects_buckets(capsys):
    cases = tune.only_cols(tune.CASES, "32768, 65536")
    assert set(cases) == {"rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd",
                          "softmax_fwd", "softmax_bwd"}  # SwiGLU tunes other lengths
    assert {s[1] for case in cases.values() for s in case.shapes} == {32768, 65536}
    assert len(cases["rms_norm_bwd"].shapes) == 4  # with and without the residual gradient
    assert tune.only_cols(tune.CASES, None) is tune.CASES
    for text, match in (("100", "no tuned shape has such a row length"),
                        ("32k", "comma-separated row lengths"), (",", "comma-separated")):
        with pytest.raises(ValueError, match=match):
            tune.only_cols(tune.CASES, text)
    assert cli_main(["tune", "--arch", "sm90", "--dry-run", "--specs", "rms_norm_bwd",
                     "--cols", "65536"]) == 0
    out = capsys.readouterr().out
    assert "n_cols=65536,dres=False" in out and "n_cols=32768" not in out
    assert "2 buckets" in out


def test_partial_tune_keeps_the_other_buckets(tables):
    path = Path(tuning.TUNED_DIR) / "sm90.json"
    old = {"rms_norm_bwd": {"n_cols=1024,dres=False": {"config": {"a": 1}},
                            "n_cols=65536,dres=False": {"config": {"a": 2}}},
           "swiglu_bwd": {"n_cols=8192": {"config": {"a": 3}}}}
    tune.write_table(str(path), "sm90", old, {})
    new = {"rms_norm_bwd": {"n_cols=65536,dres=False": {"config": {"a": 4}}}}
    tune.write_table(str(path), "sm90", new, {}, whole_specs=False)
    specs = json.loads(path.read_bytes())["specs"]
    assert specs["rms_norm_bwd"] == {"n_cols=1024,dres=False": {"config": {"a": 1}},
                                     "n_cols=65536,dres=False": {"config": {"a": 4}}}
    assert specs["swiglu_bwd"] == old["swiglu_bwd"]
    tune.write_table(str(path), "sm90", new, {})  # a whole spec's tune replaces its entries
    assert json.loads(path.read_bytes())["specs"]["rms_norm_bwd"] == new["rms_norm_bwd"]


def test_partial_tune_to_a_new_file_is_a_whole_table(tables, tmp_path, monkeypatch):
    """`liger-aot tune --cols ... --out NEW` (the README's GPU-machine recipe, then a copy
    over the committed table): the new file holds the committed table's other buckets and
    specs too, not only what the run measured (a session-23 run lost every 8K-64K norm
    entry that way)."""
    committed = Path(tuning.table_path("sm90"))
    old = {"rms_norm_fwd": {"n_cols=1024,residual=False": {"config": {"a": 1}},
                            "n_cols=65536,residual=False": {"config": {"a": 2}}},
           "swiglu_bwd": {"n_cols=8192": {"config": {"a": 3}}}}
    tune.write_table(str(committed), "sm90", old, {})
    measured = {"rms_norm_fwd": {"n_cols=1024,residual=False": {"config": {"a": 4}}}}
    # run() drops TRITON_INTERPRET when triton is not yet imported, which would leave the
    # interpreter tests that follow (this file run alone) with compiled kernels and no GPU
    import triton  # noqa: F401
    monkeypatch.setattr(tune, "gpu_for", lambda arch: (0, "fake GPU"))
    monkeypatch.setattr(tune, "tune", lambda *a, **k: (measured, []))
    monkeypatch.setattr(tune, "format_results", lambda results: "")
    out = tmp_path / "elsewhere" / "sm90.json"
    assert tune.run("sm90", specs="rms_norm_fwd", out=str(out), cols="1024",
                    log=lambda s: None) == 0
    specs = json.loads(out.read_bytes())["specs"]
    assert specs["rms_norm_fwd"] == {"n_cols=1024,residual=False": {"config": {"a": 4}},
                                     "n_cols=65536,residual=False": {"config": {"a": 2}}}
    assert specs["swiglu_bwd"] == old["swiglu_bwd"]
    assert json.loads(committed.read_bytes())["specs"] == old  # the committed one untouched


def test_inexact_only_tune_keeps_the_tables_choices_and_device(tables, tmp_path, monkeypatch):
    """`liger-aot tune --inexact-only`: tune() gets the table's records, and the table
    written keeps its device and versions (its choices were not re-measured) and its other
    buckets; each bucket is written as it is measured, so a run cut short keeps those."""
    committed = Path(tuning.table_path("sm90"))
    old = {"layer_norm_fwd": {"n_cols=1024": {"config": {"a": 1}},
                              "n_cols=2048": {"config": {"a": 2}}}}
    tune.write_table(str(committed), "sm90", old, {"device": "the tuning GPU"})
    import triton  # noqa: F401  (see test_partial_tune_to_a_new_file_is_a_whole_table)
    got = {}

    def fake_tune(*args, **kwargs):
        got.update(kwargs)
        return {"layer_norm_fwd": {"n_cols=1024": {"config": {"a": 1}, "inexact": {"b": 3}}}}, []

    def cut_short(*args, on_record, **kwargs):  # one bucket measured, then the run dies
        on_record("layer_norm_fwd", "n_cols=2048", {"config": {"a": 2}, "inexact": {"b": 4}})
        raise KeyboardInterrupt

    monkeypatch.setattr(tune, "gpu_for", lambda arch: (0, "another GPU"))
    monkeypatch.setattr(tune, "tune", fake_tune)
    assert tune.run("sm90", specs="layer_norm_fwd", inexact_only=True, log=lambda s: None) == 0
    assert got["inexact_of"] == old and got["description"] == "another GPU"
    table = json.loads(committed.read_bytes())
    assert table["device"] == "the tuning GPU"
    assert table["specs"]["layer_norm_fwd"] == {
        "n_cols=1024": {"config": {"a": 1}, "inexact": {"b": 3}},
        "n_cols=2048": {"config": {"a": 2}}}
    # a run cut short keeps the buckets it measured
    monkeypatch.setattr(tune, "tune", cut_short)
    with pytest.raises(KeyboardInterrupt):
        tune.run("sm90", specs="layer_norm_fwd", inexact_only=True, log=lambda s: None)
    table = json.loads(committed.read_bytes())
    assert table["device"] == "the tuning GPU" and table["specs"]["layer_norm_fwd"] == {
        "n_cols=1024": {"config": {"a": 1}, "inexact": {"b": 3}},
        "n_cols=2048": {"config": {"a": 2}, "inexact": {"b": 4}}}


TINY = {  # shapes the interpreter computes in seconds, covering flags and looped configs
    "rms_norm_fwd": ((8, 64, False), (8, 48, True)),
    "rms_norm_bwd": ((8, 64, False), (8, 64, True)),
    "layer_norm_fwd": ((8, 64),), "layer_norm_bwd": ((8, 64),),
    "swiglu_fwd": ((4, 1504),), "swiglu_bwd": ((4, 1504),),
    "softmax_fwd": ((8, 64), (2, 20000)), "softmax_bwd": ((8, 64), (2, 20000)),
}


def test_tune_end_to_end_in_the_interpreter(tables, tmp_path):
    """Every case at a tiny shape on CPU tensors (Triton's interpreter) with a fake timer: a
    wrong candidate is dropped however fast, a >2% faster one is chosen, one within 2% is
    not; the table written is what tuning reads and what the sm90 build compiles."""
    launch = {"STAGES": 1, "PROGRAMS_PER_SM": 0}
    # a part of every row timed (30-64 columns, other lengths included)
    wrong = Config({"BLOCK_M": 1, "BLOCK_N": 16, "LOOP": False, **launch}, num_warps=4)
    favored = Config({"BLOCK_M": 16, "BLOCK_N": 64, "LOOP": False, **launch}, num_warps=4)
    # the norm backwards' second row count, kept tiny (the real one is the suite's 64M)
    cases = {name: dataclasses.replace(case, shapes=TINY[name], also_rows=case.also_rows
                                       and (lambda n: (3,)))
             for name, case in tune.CASES.items()}
    assert cases["rms_norm_bwd"].also_rows and cases["rms_norm_fwd"].also_rows
    assert not cases["softmax_fwd"].also_rows
    rms_case = cases["rms_norm_fwd"]

    def candidates(bucket, flag=False):  # `favored` first wins the tie on its tag
        return [wrong, *([] if flag else [favored]), *rms_case.candidates(bucket, flag)]

    cases["rms_norm_fwd"] = dataclasses.replace(rms_case, candidates=candidates)
    timed = []

    def timer(run, config):
        run()  # the closure the real timer would repeat
        timed.append(config)
        if config is favored:
            return 0.9
        return 0.5 if config is wrong else 1.0 - 0.001 * len(timed)  # within 2% of 1.0

    specs, problems = tune.tune("sm90", cases, device="cpu", timer=timer, log=lambda *a: None)
    assert problems == []
    assert not [c for c in timed if c is wrong] and [c for c in timed if c is favored]
    plan = tune.plan(cases)
    # wrong: two buckets, two row counts, at the bucket's length and at 3 other lengths
    assert len(timed) == tune.config_runs(cases) - 16
    assert tune.config_runs(cases) > sum(len(configs) for *_, configs in plan)
    for name, key, shape, configs in plan:
        record = specs[name][key]
        assert record["rejected"] == (name == "rms_norm_fwd")
        assert record["heuristic"]["tag"] == configs[0].tag
        if name == "rms_norm_fwd" and key == "n_cols=64,residual=False":
            assert tune._tag(record["config"]) == favored.tag == record["best"]["tag"]
        else:
            assert tune._tag(record["config"]) == configs[0].tag  # kept: within 2%
        assert ("also" in record) == name.startswith(("rms_norm", "layer_norm"))
    assert "heuristic" in tune.format_results(specs)

    path = Path(tuning.TUNED_DIR) / "sm90.json"
    tune.write_table(str(path), "sm90", {"swiglu_bwd": {"n_cols=8192": {"config": {}}}}, {})
    tune.write_table(str(path), "sm90", specs, {"device": "cpu"})
    table = json.loads(path.read_bytes())
    assert path.read_bytes() == tuning.format_table(table)
    assert table["device"] == "cpu" and table["specs"]["rms_norm_fwd"] == specs["rms_norm_fwd"]
    assert table["specs"]["swiglu_bwd"] == specs["swiglu_bwd"]  # re-tuned: replaced
    tuning.reset()
    got = tuning.select(rms.FWD, "sm90", (50, False))
    assert got.tag == favored.tag
    assert f"rms_norm_fwd.bf16.a16.CASTING=0.{favored.tag}" in {
        v.name for v in rms.FWD.variants("sm90")}
    # and the op on that config computes the same as with the rule's (interpreter)
    x = torch.randn(5, 50, dtype=torch.bfloat16)
    w = torch.randn(50, dtype=torch.bfloat16)
    from liger_aot.ops.rms_norm import _fwd
    y = torch.empty_like(x)
    rstd = torch.empty(5, dtype=torch.float32)
    _fwd.launch((1,), y, x, w, rstd, 5, 50, 50, 50, 1e-6, 0.0, y, x, 50, 50, 0, 1,
                dtype=x.dtype, config=got, options=(("CASTING", 0),))
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(
        x.dtype) * w
    torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)


def test_tune_scores_every_timed_shape():
    """A case with also_rows is timed at each row count and keeps the config with the best
    mean time relative to each shape's fastest, not the fastest at the first shape alone;
    the record carries the other shape's times."""
    case = tune.CASES["rms_norm_bwd"]
    heuristic, *others = tune.candidates_of(case, (8, 64, False))
    a, b = others[:2]
    rows_seen = []

    def launch(fn, t, config):
        rows_seen.append(t["x"].shape[0])
        case.launch(fn, t, config)

    times = {(heuristic.tag, 8): 1.0, (heuristic.tag, 24): 1.0,
             (a.tag, 8): 0.5, (a.tag, 24): 1.0,  # fastest at 8 rows only
             (b.tag, 8): 0.6, (b.tag, 24): 0.6}  # a little slower there, fastest at 24

    def timer(run, config):
        run()
        return times[(config.tag, rows_seen[-1])]

    cases = {"rms_norm_bwd": dataclasses.replace(  # the bucket's own length only
        case, shapes=((8, 64, False),), also_rows=lambda n: (24,), launch=launch,
        candidates=lambda bucket, flag=False: [a, b], other_lengths=False)}
    specs, problems = tune.tune("sm90", cases, device="cpu", timer=timer, log=lambda *x: None)
    assert problems == [] and sorted(set(rows_seen)) == [8, 24]
    record = specs["rms_norm_bwd"]["n_cols=64,dres=False"]
    # scores: a (1 + 1/0.6) / 2 = 1.33, b (0.6/0.5 + 1) / 2 = 1.1, heuristic 1.83
    assert tune._tag(record["config"]) == b.tag == record["best"]["tag"]
    assert record["ms"] == 0.6 and record["best"]["score"] == 1.1
    assert record["also"] == [{"shape": [24, 64], "ms": 0.6, "heuristic_ms": 1.0,
                               "best_ms": 0.6}]
    assert "8x64, 24x64" in tune.format_results(specs)


def _tiny_looped(exact: bool) -> Config:
    """A looped LayerNorm forward for 64-column rows, pass 1 whole (the interpreter's
    size of the tuned buckets' exact-length configs)."""
    return Config({"BLOCK_M": 1, "BLOCK_N": 32, "LOOP": True, "PASS1_BLOCK": 64,
                   "PROGRAMS_PER_SM": 0, "STAGES": 1, **({EXACT_KEY: 1} if exact else {})},
                  num_warps=1)


def test_an_exact_choice_is_measured_again_at_other_lengths(tables):
    """A bucket choosing an exact-length config is timed again at 3/4 of its length with as
    many elements (interpreter, fake timer): the twin is kept unless another candidate is
    more than 2% faster there, and the record's "inexact" is what tuning serves the bucket's
    other lengths; --inexact-only does the same for a table's exact configs, its choices
    kept."""
    case = tune.CASES["layer_norm_fwd"]
    exact, twin = _tiny_looped(True), _tiny_looped(False)
    whole = Config({"BLOCK_M": 2, "BLOCK_N": 64, "LOOP": False, "PROGRAMS_PER_SM": 0,
                    "STAGES": 1}, num_warps=2)
    fast = {exact.tag: 0.5, twin.tag: 1.0, whole.tag: 0.9}
    shapes = []

    def launch(fn, t, config):
        shapes.append(tuple(t["x"].shape))
        case.launch(fn, t, config)

    cases = {"layer_norm_fwd": dataclasses.replace(
        case, shapes=((12, 64),), also_rows=lambda n: (24,), launch=launch,
        candidates=lambda bucket, flag=False: [exact, twin, whole])}
    assert tune.inexact_shapes(cases["layer_norm_fwd"], (12, 64)) == [
        (16, 48), (32, 48), (19, 40), (38, 40), (13, 56), (27, 56)]
    specs, problems = tune.tune("sm90", cases, device="cpu", log=lambda *x: None,
                                timer=lambda run, config: (run(), fast.get(config.tag, 2.0))[1],
                                description="fake GPU")
    record = specs["layer_norm_fwd"]["n_cols=64"]
    assert problems == [] and tune._tag(record["config"]) == exact.tag
    assert {(16, 48), (32, 48)} <= set(shapes)
    inexact = record["inexact"]
    assert tune._tag(inexact["config"]) == whole.tag  # 0.9 against the twin's 1.0
    assert inexact["shape"] == [16, 48] and inexact["ms"] == 0.9 and inexact["twin_ms"] == 1.0
    assert inexact["device"] == "fake GPU" and inexact["candidates"] == 3
    path = Path(tuning.TUNED_DIR) / "sm90.json"
    tune.write_table(str(path), "sm90", specs, {})
    tuning.reset()
    assert tuning.select(ln.FWD, "sm90", (64,)).tag == exact.tag
    assert tuning.select(ln.FWD, "sm90", (40,)).tag == whole.tag
    # --inexact-only keeps the table's choice and measures against the table's inexact
    # config, not the twin: the twin, within 2% of it, does not replace it
    fast[twin.tag] = 0.89
    table = json.loads(path.read_bytes())["specs"]
    only, problems = tune.tune("sm90", cases, device="cpu", log=lambda *x: None,
                               timer=lambda run, config: (run(), fast.get(config.tag, 2.0))[1],
                               inexact_of=table)
    kept = only["layer_norm_fwd"]["n_cols=64"]
    assert problems == [] and tune._tag(kept["inexact"]["config"]) == whole.tag
    assert kept["inexact"]["twin_ms"] == 0.9 and kept["inexact"]["candidates"] == 3
    assert {k: v for k, v in kept.items() if k != "inexact"} == {
        k: v for k, v in record.items() if k != "inexact"}
    fast[whole.tag] = 0.99
    # a table without an exact config there: its other lengths measured all the same (the
    # norm cases' other_lengths), the twin being the config itself ...
    table["layer_norm_fwd"]["n_cols=64"]["config"] = tuning.config_record(whole)
    fast[twin.tag] = 0.5
    only, problems = tune.tune("sm90", cases, device="cpu", log=lambda *x: None,
                               timer=lambda run, config: (run(), fast.get(config.tag, 2.0))[1],
                               inexact_of=table)
    other = only["layer_norm_fwd"]["n_cols=64"]["inexact"]
    assert problems == [] and tune._tag(other["config"]) == twin.tag
    assert other["twin_ms"] == 0.99 and other["ms"] == 0.5  # the whole row's, then the twin's
    # ... but not for a case without other_lengths: nothing measured, nothing returned
    plain = {name: dataclasses.replace(case, other_lengths=False) for name, case in cases.items()}
    assert tune.tune("sm90", plain, device="cpu", log=lambda *x: None, inexact_of=table,
                     timer=lambda run, config: 1 / 0) == ({}, [])


def _probe_cases(ms: dict) -> tuple:
    """(cases, timer, the row lengths launched, (exact, twin, whole)): LayerNorm's forward
    on one 64-column bucket whose candidates are an exact-length looped config (0.5 ms
    everywhere), its twin and a whole row, timed by a fake timer from ms {(tag, row length):
    ms} (2.0 where it has none), in the interpreter; the probes are 40, 48 and 56 columns."""
    case = tune.CASES["layer_norm_fwd"]
    exact, twin = _tiny_looped(True), _tiny_looped(False)
    whole = Config({"BLOCK_M": 2, "BLOCK_N": 64, "LOOP": False, "PROGRAMS_PER_SM": 0,
                    "STAGES": 1}, num_warps=2)
    lengths = []

    def launch(fn, t, config):
        lengths.append(t["x"].shape[1])
        case.launch(fn, t, config)

    def timer(run, config):
        run()
        return ms.get((config.tag, lengths[-1]), 0.5 if config is exact else 2.0)

    cases = {"layer_norm_fwd": dataclasses.replace(
        case, shapes=((12, 64),), also_rows=None, launch=launch,
        candidates=lambda bucket, flag=False: [exact, twin, whole])}
    return cases, timer, lengths, (exact, twin, whole)


def test_other_lengths_are_chosen_over_three_probes(tables):
    """A config fastest at 3/4 of the bucket alone loses to one a little slower there and
    fastest at 5/8 and 7/8: the other lengths' choice is made on the mean relative time over
    the three probes, as a bucket's own shapes are scored; the record keeps each probe."""
    ms = {}
    cases, timer, lengths, (exact, twin, whole) = _probe_cases(ms)
    ms.update({(twin.tag, 48): 0.8, (twin.tag, 40): 1.0, (twin.tag, 56): 1.0,
               (whole.tag, 48): 0.85, (whole.tag, 40): 0.85, (whole.tag, 56): 0.85})
    specs, problems = tune.tune("sm90", cases, device="cpu", timer=timer, log=lambda *x: None)
    record = specs["layer_norm_fwd"]["n_cols=64"]
    assert problems == [] and tune._tag(record["config"]) == exact.tag
    inexact = record["inexact"]
    # twin (0.8/0.8 + 1/0.85 + 1/0.85) / 3 = 1.118, whole (0.85/0.8 + 1 + 1) / 3 = 1.021
    assert tune._tag(inexact["config"]) == whole.tag
    assert inexact["shape"] == [16, 48] and (inexact["ms"], inexact["twin_ms"]) == (0.85, 0.8)
    assert inexact["also"] == [{"shape": [19, 40], "ms": 0.85, "twin_ms": 1.0},
                               {"shape": [13, 56], "ms": 0.85, "twin_ms": 1.0}]
    assert inexact["score"] < 1.03 < 1.1 < inexact["twin_score"]
    assert {40, 48, 56, 64} <= set(lengths)
    # ... but at 48 the twin is 5.9% faster (more than LENGTH_MARGIN): 48 runs the twin
    assert inexact["lengths"] == {"48": {"config": tuning.config_record(twin), "ms": 0.8,
                                         "inexact_ms": 0.85}}
    path = Path(tuning.TUNED_DIR) / "sm90.json"
    tune.write_table(str(path), "sm90", specs, {})
    tuning.reset()
    assert [tuning.select(ln.FWD, "sm90", (n,)).tag for n in (64, 48, 40, 56, 47)] == [
        exact.tag, twin.tag, whole.tag, whole.tag, whole.tag]
    assert {twin.tag, whole.tag, exact.tag} <= {c.tag for c in tuning.arch_configs(ln.FWD, "sm90")}


def test_a_choice_slower_at_a_probe_without_its_own_config_is_kept_out(tables):
    """The bucket's other lengths keep the reference where the choice on the mean reads a
    probe more than PROBE_SLACK slower that gets no config of its own (it is within
    LENGTH_MARGIN of the best there); a probe more than LENGTH_MARGIN ahead on another config
    gets that config, whether or not the choice stands."""
    ms = {}
    cases, timer, _, (exact, twin, whole) = _probe_cases(ms)
    # whole: 20% ahead at 40, 2% behind the twin at 56 (no own config there: within 3%)
    ms.update({(twin.tag, 48): 1.0, (twin.tag, 40): 1.0, (twin.tag, 56): 1.0,
               (whole.tag, 48): 1.0, (whole.tag, 40): 0.8, (whole.tag, 56): 1.02})
    logged = []
    specs, problems = tune.tune("sm90", cases, device="cpu", timer=timer, log=logged.append)
    inexact = specs["layer_norm_fwd"]["n_cols=64"]["inexact"]
    assert problems == [] and tune._tag(inexact["config"]) == twin.tag
    assert inexact["lengths"] == {"40": {"config": tuning.config_record(whole), "ms": 0.8,
                                         "inexact_ms": 1.0}}
    assert any("kept out, +2.0% at 13x56" in line for line in logged), logged
    # 1% behind at 56 is within PROBE_SLACK: the choice on the mean stands, no own lengths
    ms[(whole.tag, 56)] = 1.01
    specs, problems = tune.tune("sm90", cases, device="cpu", timer=timer, log=lambda *x: None)
    inexact = specs["layer_norm_fwd"]["n_cols=64"]["inexact"]
    assert tune._tag(inexact["config"]) == whole.tag and "lengths" not in inexact


WIDER = {  # every candidate of the buckets the GPU run measures, whole-row and looped
    "rms_norm_fwd": ((16, 1024, False), (4, 16384, False), (4, 8192, True), (2, 16384, True),
                     (2, 32768, False)),
    # the backwards' long buckets at rows just over half their length (a bucket's candidates
    # serve every row in it): partial column blocks, and half the interpreter's time for the
    # interleaved candidates, whose chunks of 64-128 rows are mostly masked here
    "rms_norm_bwd": ((16, 1024, False), (4, 4100, True), (4, 8200, False)),
    "layer_norm_fwd": ((16, 1024), (2, 8192), (4, 16384), (2, 32768)),
    "layer_norm_bwd": ((16, 1024), (4, 8200)),
    "swiglu_fwd": ((4, 5008),), "swiglu_bwd": ((4, 5008),),
    "softmax_fwd": ((16, 1024), (2, 32768)), "softmax_bwd": ((16, 1024), (2, 32768)),
}


def _interpreted_once(candidates):
    """A case's candidates as the interpreter runs them: one config per set of constexprs.
    The interpreter is handed the constexprs alone (Kernel._interpret), so configs that
    differ only in launch options (warps, stages, register cap, fma contraction) compute the
    same thing there; running each would triple the test's time for nothing. It runs no
    Gluon: a staged config runs its Triton twin (spec.staged_twin, as tune.measure does on a
    CPU), and the Triton kernels only pass STAGES to tl.range's num_stages, which the
    interpreter ignores, so STAGES counts as a launch option too. Also without those with
    the row length compiled in (EXACT_KEY): their code is their twins' with n_cols a
    constant, which tests/test_norm_looped_forward.py runs (both families, one and two rows
    a program), and here they would double the interpreter's time of the looped forwards."""
    def distinct(bucket, flag=False):
        seen = set()
        for c in candidates(bucket, flag):
            run = staged_twin(c, "", "any")  # what the interpreter runs
            key = tuple(sorted((k, v) for k, v in run.constexprs.items() if k != "STAGES"))
            if not c.constexprs.get(EXACT_KEY) and key not in seen:
                seen.add(key)
                yield c
    return distinct


@pytest.mark.slow
def test_every_candidate_computes_the_reference():
    """The candidate generators yield only configs the kernels compute correctly (checked
    in the interpreter against the torch references, as the GPU run checks them): each set
    of constexprs once, the exact-length twins left out (see _interpreted_once)."""
    # other_lengths off: WIDER holds the lengths (the backwards' partial blocks), and the
    # tuner's three probes of each bucket would run every candidate three times more
    cases = {name: dataclasses.replace(case, shapes=WIDER[name], also_rows=None,
                                       candidates=_interpreted_once(case.candidates),
                                       other_lengths=False)
             for name, case in tune.CASES.items()}
    specs, problems = tune.tune("sm90", cases, device="cpu", timer=lambda run, config: 1.0,
                                log=lambda *a: None)
    assert problems == []
    rejected = {(name, key): r["rejected"] for name, buckets in specs.items()
                for key, r in buckets.items() if r["rejected"]}
    assert not rejected
    assert sum(len(b) for b in specs.values()) == sum(map(len, WIDER.values()))


def test_tune_refines_the_best_on_a_second_timer():
    """refine_top: the heuristic and the best candidates by the first timer are timed again
    with the refine timer, and the choice (2% rule included) is made on those times; the
    record keeps both timers' figures."""
    case = tune.CASES["rms_norm_bwd"]
    heuristic, *others = tune.candidates_of(case, (8, 64, False))
    a, b, c = others[:3]
    first = {heuristic.tag: 1.0, a.tag: 0.5, b.tag: 0.6, c.tag: 0.9}
    second = {heuristic.tag: 1.0, a.tag: 0.8, b.tag: 0.7, c.tag: 0.1}  # c is not in the top 2
    refined_tags = []

    def refine_timer(run, config):
        run()
        refined_tags.append(config.tag)
        return second[config.tag]

    cases = {"rms_norm_bwd": dataclasses.replace(  # the bucket's own length only
        case, shapes=((8, 64, False),), also_rows=None,
        candidates=lambda bucket, flag=False: [a, b, c], other_lengths=False)}
    specs, problems = tune.tune("sm90", cases, device="cpu", log=lambda *x: None,
                                timer=lambda run, config: (run(), first[config.tag])[1],
                                refine_top=2, refine_timer=refine_timer)
    assert problems == [] and refined_tags == [heuristic.tag, a.tag, b.tag]
    record = specs["rms_norm_bwd"]["n_cols=64,dres=False"]
    # first timer's best a (0.5); on the refine timer b (0.7) beats a (0.8) by more than 2%
    assert record["best"]["tag"] == a.tag and tune._tag(record["config"]) == b.tag
    assert record["ms"] == 0.6  # the first timer's figure of the chosen config
    assert record["refined"] == {"timer": "refine_timer", "ms": 0.7, "configs": [
        {"tag": b.tag, "ms": 0.7}, {"tag": a.tag, "ms": 0.8}, {"tag": heuristic.tag, "ms": 1.0}]}
    # within 2% on the refine timer, the heuristic stays
    second.update({b.tag: 0.99, a.tag: 0.995})
    specs, _ = tune.tune("sm90", cases, device="cpu", log=lambda *x: None,
                         timer=lambda run, config: (run(), first[config.tag])[1],
                         refine_top=2, refine_timer=refine_timer)
    assert tune._tag(specs["rms_norm_bwd"]["n_cols=64,dres=False"]["config"]) == heuristic.tag
