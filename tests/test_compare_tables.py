"""benchmarks/compare_tables.py without a GPU: its arguments, the staged sources, the check
that a build is the one of its table (on the session's shared sm90 build), the A B B A order,
and main's bookkeeping with the build and the timing replaced by stand-ins."""
import csv
import json
import os
import subprocess
import sys

import pytest

from _artifacts import needs_shared_build, shared_build
from _scripts import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "compare_tables.py")
TABLE = os.path.join(ROOT, "kernel_src", "tuned", "sm90.json")


C = load_benchmark("compare_tables")


def _other_table(tmp_path, name="other.json"):
    """The committed sm90 table with another device string: the same configs, other bytes."""
    with open(TABLE) as f:
        table = json.load(f)
    table["device"] = "another GPU"
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


def _error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        C.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_arguments_refused_with_reasons(tmp_path, capsys):
    other = _other_table(tmp_path)
    assert "same table" in _error(capsys, ["--base", TABLE])
    assert "no such file" in _error(capsys, ["--base", str(tmp_path / "missing.json")])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert "not JSON" in _error(capsys, ["--base", str(bad)])
    assert "not 'sm80'" in _error(capsys, ["--base", other, "--arch", "sm80", "--new", TABLE])
    assert "'swiglu' is not one of" in _error(capsys, ["--base", other, "--ops", "swiglu"])
    assert "--rounds: at least 1" in _error(capsys, ["--base", other, "--rounds", "0"])
    assert "--jobs: at least 1" in _error(capsys, ["--base", other, "--jobs", "0"])
    assert "not a comma-separated" in _error(capsys, ["--base", other, "--ns", "1024,x"])
    assert "positive" in _error(capsys, ["--base", other, "--ns", "0"])
    assert "more than 2^26" in _error(capsys, ["--base", other, "--ns", str(2**27)])
    args = C.parse_args(["--base", other, "--work", "rel"])
    assert args.new == TABLE and os.path.isabs(args.work) and args.rounds == 2


def test_ops_are_the_suites_norm_cases():
    suite = load_benchmark("suite")
    assert C.NORM_OPS == tuple(op for op, case in suite.CASES.items() if case.sweep == "N")


def test_help_and_dry_run_need_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "--base" in out and "git show" in out
    out = subprocess.run([sys.executable, SCRIPT, "--base", _other_table(tmp_path), "--dry-run",
                          "--work", str(tmp_path / "w"), "--rounds", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert [line.split(":")[0] for line in out.splitlines() if " round " in line] == [
        "[base] round 0", "[new] round 0", "[new] round 1", "[base] round 1"]
    assert not (tmp_path / "w").exists()  # a dry run stages nothing


def test_run_order_alternates():
    assert C.run_order(1) == [("base", 0), ("new", 0)]
    assert C.run_order(3) == [("base", 0), ("new", 0), ("new", 1), ("base", 1), ("base", 2),
                              ("new", 2)]


def _row(op, n, ms, status="ok", bwd_ms=""):
    """A row of the suite's kernels.csv as csv.DictReader gives it (empty: not timed):
    forward `ms`, backward `bwd_ms`, both their sum."""
    row = {"op": op, "sweep_value": str(n), "path": "liger-aot", "status": status}
    for pass_, value in (("fwd", ms), ("bwd", bwd_ms), ("fwdbwd", bwd_ms and ms + bwd_ms)):
        row[f"{pass_}_graph_ms"] = str(value)
        row[f"{pass_}_graph_pct_copy"] = str(round(6.29 / value, 3)) if value else ""
    return row


def test_merge_takes_medians_and_drops_failed_results():
    rounds = {
        "base": [[_row("rms_norm", 896, 0.070, bwd_ms=0.1), _row("layer_norm", 896, 0.080)],
                 [_row("rms_norm", 896, 0.072, bwd_ms=0.1), _row("layer_norm", 896, 0.082)],
                 [_row("rms_norm", 896, 0.090, bwd_ms=0.1), _row("layer_norm", 896, 0.081)]],
        "new": [[_row("rms_norm", 896, 0.0692, bwd_ms=0.09),
                 _row("layer_norm", 896, "", status="check failed")]],
    }
    configs = {"base": {"rms_norm": {"896": {"fwd": "A", "bwd": "D"}},
                        "layer_norm": {"896": {"fwd": "B", "bwd": "E"}}},
               "new": {"rms_norm": {"896": {"fwd": "C", "bwd": "D"}},
                       "layer_norm": {"896": {"fwd": "B", "bwd": "E"}}}}
    records = {(r["op"], r["pass"]): r for r in C.merge(rounds, configs)}
    assert len(records) == 6
    rms, ln = records["rms_norm", "fwd"], records["layer_norm", "fwd"]
    rms_bwd, rms_both = records["rms_norm", "bwd"], records["rms_norm", "fwdbwd"]
    assert (rms["op"], rms["n"], rms["pass"]) == ("rms_norm", 896, "fwd")
    assert rms["base_ms"] == pytest.approx(0.072) and rms["new_ms"] == pytest.approx(0.0692)
    assert rms["change_pct"] == pytest.approx(100 * (0.0692 / 0.072 - 1))
    assert rms["base_pct_of_copy"] == pytest.approx(6.29 / 0.072, abs=1e-3)
    assert (rms["base_runs"], rms["new_runs"]) == (3, 1)
    assert ln["base_ms"] == pytest.approx(0.081)
    assert ln["new_ms"] is None and ln["change_pct"] is None and ln["new_runs"] == 0
    assert (rms["base_config"], rms["new_config"], ln["new_config"]) == ("A", "C", "B")
    assert rms_bwd["new_ms"] == pytest.approx(0.09) and rms_bwd["new_config"] == "D"
    assert rms_both["base_ms"] == pytest.approx(0.172) and rms_both["new_config"] == "C + D"
    # the layer_norm rows had no backward timed: no figures, not zeros
    assert records["layer_norm", "bwd"]["base_ms"] is None
    lines = C.table_lines([rms, ln, rms_bwd])
    assert lines[2].startswith("| rms_norm | 896 | fwd | 0.0720 | 0.0692 | -3.9% |")
    assert lines[2].endswith("| changed |") and lines[3].endswith("| same |")
    assert "| 0.0810 | - | - |" in lines[3] and lines[4].endswith("| same |")


def test_stage_copies_the_sources_with_the_table(tmp_path):
    other = _other_table(tmp_path)
    stage = tmp_path / "stage-base"
    C.stage(other, str(stage), "sm90")
    staged = stage / "liger_aot" / "kernel_src" / "tuned" / "sm90.json"  # through the link
    assert os.path.realpath(staged) == os.path.realpath(stage / "kernel_src/tuned/sm90.json")
    assert staged.read_text() == open(other).read()
    assert (stage / "benchmarks" / "suite.py").is_file()
    assert not list(stage.rglob("__pycache__"))
    C.stage(TABLE, str(stage), "sm90")  # a stage of this script is replaced
    assert staged.read_text() == open(TABLE).read()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not a stage of this script"):
        C.stage(TABLE, str(foreign), "sm90")
    assert (foreign / "keep.txt").read_text() == "mine"


def _change_patch(tmp_path) -> str:
    """A patch whose new side is this checkout: kernel_src/rms_norm/spec.py gained a first
    line (so taking it back removes that line), and a tests/ file the stage never holds."""
    import difflib

    def diff(path, old):
        new = open(os.path.join(ROOT, path)).read().splitlines(keepends=True)
        return "".join(difflib.unified_diff(old(new), new, f"a/{path}", f"b/{path}"))
    text = (diff("kernel_src/rms_norm/spec.py", lambda lines: lines[1:])
            + diff("tests/test_compare_tables.py", lambda lines: ["# gone\n"] + lines))
    path = tmp_path / "change.patch"
    path.write_text(text)
    return str(path)


def test_base_patch_stages_the_sources_before_the_change(tmp_path, capsys):
    """--base-patch: the base stage takes the patch back (its files outside the staged
    sources skipped), the table defaults to the new one; a patch that does not come off
    the sources stops the run with git's reason, and a missing file is refused."""
    patch = _change_patch(tmp_path)
    args = C.parse_args(["--base-patch", patch, "--work", str(tmp_path / "w")])
    assert args.base == args.new == TABLE and args.base_patch == patch
    assert "no such file" in _error(capsys, ["--base-patch", str(tmp_path / "none.patch")])
    assert "nothing to compare" in _error(capsys, [])
    stage = tmp_path / "w" / "stage-base"
    C.stage(TABLE, str(stage), "sm90", patch)
    spec = os.path.join("kernel_src", "rms_norm", "spec.py")
    with open(os.path.join(ROOT, spec)) as f:
        assert (stage / spec).read_text() == "".join(f.readlines()[1:])
    assert (stage / "benchmarks" / "suite.py").read_text() == open(
        os.path.join(ROOT, "benchmarks", "suite.py")).read()
    with pytest.raises(SystemExit, match="does not come off the sources"):
        C.take_back(patch, str(stage))  # taken back already: the stage lacks the line


def _verify(stage, artifacts):
    env = C.child_env(str(stage), str(artifacts))
    return subprocess.run([sys.executable, "-c", C.VERIFY, str(stage), "sm90"], cwd=str(stage),
                          env=env, capture_output=True, text=True)


@needs_shared_build("sm90")
def test_verify_accepts_only_the_build_of_its_table(tmp_path_factory, tmp_path):
    root, _ = shared_build(tmp_path_factory, ("sm90",))  # built with the committed table
    C.stage(TABLE, str(tmp_path / "same"), "sm90")
    done = _verify(tmp_path / "same", root)
    assert done.returncode == 0, done.stderr
    C.stage(_other_table(tmp_path), str(tmp_path / "other"), "sm90")
    done = _verify(tmp_path / "other", root)
    assert done.returncode == 1 and "was not built with" in done.stderr
    done = _verify(tmp_path / "same", tmp_path / "no-build")
    assert done.returncode == 1 and "not the first usable sm90 set" in done.stderr


def test_configs_child_reads_its_stages_table(tmp_path):
    """The CONFIGS child, in a stage of the committed table, names the configs this process
    selects for sm90; in a stage of a table without the RMSNorm 1K entry, the rule's."""
    from kernel_src.rms_norm import spec as rms

    with open(TABLE) as f:
        table = json.load(f)
    del table["specs"]["rms_norm_fwd"]["n_cols=1024,residual=False"]
    trimmed = tmp_path / "trimmed.json"
    trimmed.write_text(json.dumps(table))
    found = {}
    for name, path in (("same", TABLE), ("trimmed", str(trimmed))):
        C.stage(path, str(tmp_path / name), "sm90")
        done = subprocess.run([sys.executable, "-c", C.CONFIGS, "sm90", "rms_norm,layer_norm",
                               "896,4096"], cwd=str(tmp_path / name),
                              env=C.child_env(str(tmp_path / name), str(tmp_path / "none")),
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        found[name] = json.loads(done.stdout)
    from kernel_src import tuning

    for n in (896, 4096):
        for pass_, spec in (("fwd", rms.FWD), ("bwd", rms.BWD)):
            assert found["same"]["rms_norm"][str(n)][pass_] == tuning.select(
                spec, "sm90", (n, False), 2).tag
    trimmed, same = found["trimmed"]["rms_norm"]["896"], found["same"]["rms_norm"]["896"]
    assert trimmed["fwd"] == rms.select_config(896, False).tag != same["fwd"]
    assert trimmed["bwd"] == same["bwd"]
    assert found["trimmed"]["layer_norm"] == found["same"]["layer_norm"]


FAKE_TIMING = """\
import csv, os, sys
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out)
ms = {"stage-base": 0.0720, "stage-new": 0.0700}[os.path.basename(os.getcwd())]
with open(os.path.join(out, "kernels.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["op", "shape", "sweep_value", "path", "status", "fwd_graph_ms",
                "fwd_graph_pct_copy", "bwd_graph_ms", "bwd_graph_pct_copy", "fwdbwd_graph_ms",
                "fwdbwd_graph_pct_copy"])
    w.writerow(["rms_norm", "74898x896", 896, "liger-aot", "ok", ms, 6.29 / ms, 0.1, 62.9,
                ms + 0.1, 6.29 / (ms + 0.1)])
"""


def test_main_stages_runs_in_order_and_writes_the_comparison(tmp_path, monkeypatch, capsys):
    calls, real_commands = [], C.commands

    def fake_commands(args, label, round_index):
        real = real_commands(args, label, round_index)
        calls.append((label, round_index))
        tag = json.dumps({"rms_norm": {"896": {"fwd": label, "bwd": "same"}}})
        return {"build": [sys.executable, "-c", "pass"], "verify": real["verify"][:2] + ["pass"],
                "configs": [sys.executable, "-c", f"print({tag!r})"],
                "time": [sys.executable, "-c", FAKE_TIMING] + real["time"][2:]}

    monkeypatch.setattr(C, "commands", fake_commands)
    out = tmp_path / "out"
    C.main(["--base", _other_table(tmp_path), "--work", str(tmp_path / "w"), "--out", str(out),
            "--ops", "rms_norm", "--ns", "896"])
    printed = capsys.readouterr().out
    assert "| rms_norm | 896 | fwd | 0.0720 | 0.0700 | -2.8% |" in printed
    assert "| rms_norm | 896 | bwd | 0.1000 | 0.1000 | +0.0% |" in printed
    with open(out / "compare_tables.csv", newline="") as f:
        rows = {r["pass"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"fwd", "bwd", "fwdbwd"}
    row = rows["fwd"]
    assert (row["base_runs"], row["new_runs"]) == ("2", "2")
    assert (rows["bwd"]["base_config"], rows["fwdbwd"]["new_config"]) == ("same", "new + same")
    assert (row["base_config"], row["new_config"]) == ("base", "new")
    assert float(row["change_pct"]) == pytest.approx(100 * (0.07 / 0.072 - 1))
    # staged and built first, then timed A B B A
    assert calls[-4:] == [("base", 0), ("new", 0), ("new", 1), ("base", 1)]
    for label in ("base", "new"):  # each round's output under --out, and its line printed
        assert (out / "rounds" / f"{label}-round1" / "kernels.csv").is_file()
    assert "[base] round 0: rms_norm N=896: fwd 0.0720, bwd 0.1000, fwdbwd 0.1720 ms" in printed
    assert "[new] round 1: rms_norm N=896: fwd 0.0700, bwd 0.1000, fwdbwd 0.1700 ms" in printed
