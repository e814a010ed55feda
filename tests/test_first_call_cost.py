"""benchmarks/first_call_cost.py on a CPU over the session's shared sm90 build: the fresh
child finds real variants through the registry (driver stubbed), the parent writes its table,
CSV and JSON; bad arguments are refused by name."""
import csv
import json
import os
import subprocess
import sys

import pytest

from _artifacts import needs_shared_build, shared_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "first_call_cost.py")


def _run(*args):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=900, env=env)


@needs_shared_build("sm80", "sm90")
@pytest.mark.slow
def test_first_call_cost_over_a_build(tmp_path_factory, tmp_path):
    root, _ = shared_build(tmp_path_factory, ("sm80", "sm90"))  # test_integrity's build
    done = _run("--artifacts", str(root), "--model", "gemma2_2b", "--repeats", "2",
                "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "first_call_cost.json").read_text())
    assert result["model"] == "gemma2_2b" and len(result["runs"]) == 2
    medians = result["medians"]
    # rms_norm fwd+bwd, rope fwd+bwd, geglu fwd+bwd, and at least the cross entropy kernel
    assert medians["variants"] >= 7
    for key in ("import", "manifest", "find_variant", "launchers", "rms_norm first",
                "linear_ce first", "linear_ce again"):
        assert medians[key] > 0, key
    # the manifest is read once, by the first op's first call
    assert medians["rms_norm first"] > medians["manifest"] > 0
    rows = list(csv.reader(open(tmp_path / "first_call_cost.csv")))
    assert rows[0][0] == "run" and [r[0] for r in rows[1:]] == ["1", "2", "median"]
    assert "first-call extra" in done.stdout


def test_first_call_cost_refuses_bad_arguments(tmp_path):
    done = _run("--repeats", "1")
    assert done.returncode == 2 and "--artifacts is required" in done.stderr
    done = _run("--artifacts", str(tmp_path))
    assert done.returncode == 2 and "sm90/manifest.json does not exist" in done.stderr
    (tmp_path / "sm90").mkdir()
    (tmp_path / "sm90" / "manifest.json").write_text("{}")
    done = _run("--artifacts", str(tmp_path), "--repeats", "0")
    assert done.returncode == 2 and "--repeats must be at least 1" in done.stderr
