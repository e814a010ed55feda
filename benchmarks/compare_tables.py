"""Two tuned tables side by side: the norms timed on the build of each. Or, with
--base-patch, two versions of the code: this checkout against itself with a patch taken back.

`liger-aot tune` measures each bucket at its power of two; the bucket's entry also serves
every row length down to the next power of two (an exact-length entry through its inexact
twin), which is where models' hidden sizes fall (Qwen2.5-0.5B's 896, Gemma-2-2B's 2304).
Before a new table is committed this says what it changes there. Each table is staged in
its own copy of the sources (liger_aot, kernel_src, build_tools, benchmarks) under --work,
built into its own artifact set, checked to be the set the runtime will use with that
table, and then timed by benchmarks/suite.py (`--norm-ns`: the norm sweeps at these
lengths, 2^26 elements each; liger-aot only, checked against fp32 first; forward, backward
with the weight gradient, and both, from CUDA-graph replays; LIGER_AOT_STRICT=1 so that
nothing JIT-compiles) in fresh processes alternating A B B A ..., so that a drift of the
GPU's clocks falls on both tables alike.

  python benchmarks/compare_tables.py --base OLD.json [--new NEW.json] [--arch sm90]
      [--ops rms_norm,layer_norm] [--ns 896,1024,...] [--rounds 2] [--jobs 16]
      [--work DIR] [--out DIR] [--dry-run]

  python benchmarks/compare_tables.py --base-patch CHANGE.patch [--base OLD.json] ...

--base-patch: the base stage is the sources with CHANGE.patch reversed (`git apply -R`, its
files under liger_aot, kernel_src, build_tools and benchmarks; made by `git diff` or `git
format-patch` from the checkout's root), its table --base or the new one: a kernel or op
change A/B'd on the same table, e.g. `git diff HEAD~1 > change.patch`.

An old table: `git show <rev>:kernel_src/tuned/sm90.json > old.json`. Prints a table of
medians by op, row length and pass, with whether the two tables give the op another
config there, and writes compare_tables.csv (each table's config tags too) under --out,
with each round's suite output in --out/rounds as it finishes.
On sm90 the ops send some rows of 16K columns and more to the grouped kernels, which no
table configures: there the two tables time alike.
"""
import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kernel_src import tuning  # noqa: E402

STAGED = ("liger_aot", "kernel_src", "build_tools", "benchmarks")  # what a build and a run need
STAGE_MARK = ".compare_tables_stage"  # names the table; stage() replaces only marked directories
# Hidden sizes of common models: Qwen2.5 0.5B / 1.5B / 7B / 14B, Llama-3.2 1B / 3B, Gemma-2
# 2B, Llama-3 8B / 70B; with the powers of two the tuner measured.
MODEL_NS = "896,1024,1536,2048,2304,3072,3584,4096,5120,8192"
LABELS = ("base", "new")
NORM_OPS = ("rms_norm", "layer_norm", "fused_add_rms_norm")  # the suite's norm cases
PASSES = ("fwd", "bwd", "fwdbwd")  # the suite's graph columns <pass>_graph_ms
FIELDS = ("op", "n", "pass", "base_ms", "new_ms", "change_pct", "base_pct_of_copy",
          "new_pct_of_copy", "base_runs", "new_runs", "base_config", "new_config")
# the checks a child runs in each stage after its build (see commands)
VERIFY = """\
import os, sys
import liger_aot
from liger_aot.kernel_src import tuning
from liger_aot.runtime import registry
stage, arch = sys.argv[1], sys.argv[2]
if not os.path.realpath(liger_aot.__file__).startswith(os.path.realpath(stage) + os.sep):
    sys.exit(f"liger_aot imported from {liger_aot.__file__}, not from the stage {stage}")
sets = registry.artifact_sets(arch)
if not sets or sets[0].source != "env" or sets[0].manifest is None:
    sys.exit(f"the build under LIGER_AOT_ARTIFACT_DIR is not the first usable {arch} set")
if sets[0].manifest.get("tuned_sha256") != tuning.table_sha256(arch):
    sys.exit(f"{sets[0].manifest_path} was not built with {tuning.table_path(arch)}")
print(f"{stage}: {arch} set {sets[0].directory}, table {tuning.table_sha256(arch)[:12]}")
"""
# the forward's and the backward's config each op takes from the stage's table for bf16 rows
# of each length, as JSON: {op: {n: {"fwd": tag, "bwd": tag}}}
CONFIGS = """\
import json, sys
from liger_aot.kernel_src import tuning
from liger_aot.kernel_src.layer_norm import spec as ln
from liger_aot.kernel_src.rms_norm import spec as rms
arch, ops, ns = sys.argv[1], sys.argv[2].split(","), [int(n) for n in sys.argv[3].split(",")]
rules = {"rms_norm": ((rms.FWD, (False,)), (rms.BWD, (False,))),
         "layer_norm": ((ln.FWD, ()), (ln.BWD, ())),
         "fused_add_rms_norm": ((rms.FWD, (True,)), (rms.BWD, (True,)))}
print(json.dumps({op: {n: {p: tuning.select(spec, arch, (n, *flags), 2).tag
                           for p, (spec, flags) in zip(("fwd", "bwd"), rules[op])}
                       for n in ns} for op in ops}))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="An old table: git show <rev>:kernel_src/tuned/sm90.json "
                                       "> old.json",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="the table to compare against (a file; with --base-patch "
                                  "default: the new table)")
    p.add_argument("--base-patch", help="a patch the base stage's sources take back (git "
                                        "apply -R): the code before a change")
    p.add_argument("--new", help="the candidate table (default: this checkout's "
                                 "kernel_src/tuned/<arch>.json)")
    p.add_argument("--arch", default="sm90", help="the arch both tables are for (default sm90)")
    p.add_argument("--ops", default=",".join(NORM_OPS),
                   help="norm cases of benchmarks/suite.py (default: all three)")
    p.add_argument("--ns", default=MODEL_NS,
                   help=f"row lengths (default: common models' hidden sizes, {MODEL_NS})")
    p.add_argument("--rounds", type=int, default=2,
                   help="timed processes per table, alternating A B B A ... (default 2)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2,
                   help="compile processes per build (default: the CPU count)")
    p.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                  "liger_aot_compare_tables"),
                   help="where the staged sources and builds go (kept: a second run "
                        "reuses the builds)")
    p.add_argument("--out", default=os.environ.get("OUT", "."),
                   help="where the CSV and each round's suite output (rounds/) go")
    p.add_argument("--dry-run", action="store_true",
                   help="check the tables and print the commands without running them")
    args = p.parse_args(argv)
    for op in args.ops.split(","):
        if op not in NORM_OPS:  # suite.py would refuse it after the builds
            p.error(f"--ops: {op!r} is not one of {', '.join(NORM_OPS)}")
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    if args.jobs < 1:
        p.error("--jobs: at least 1")
    try:
        ns = [int(n) for n in args.ns.split(",")]
    except ValueError:
        p.error(f"--ns: {args.ns!r} is not a comma-separated list of row lengths")
    if any(n < 1 for n in ns):
        p.error("--ns: row lengths must be positive")
    if any(n > 2**26 for n in ns):
        p.error("--ns: a row of more than 2^26 elements, the suite's norm size")
    args.new = args.new or tuning.table_path(args.arch)
    if args.base_patch:
        if not os.path.isfile(args.base_patch):
            p.error(f"--base-patch: {args.base_patch}: no such file")
        args.base_patch = os.path.abspath(args.base_patch)
        args.base = args.base or args.new
    elif not args.base:
        p.error("--base (a table) or --base-patch (a change) is needed: nothing to compare")
    # absolute: the children run in the stages
    args.work, args.out = os.path.abspath(args.work), os.path.abspath(args.out)
    args.sha256 = {}  # label -> the table's sha256, each file read once
    for label in LABELS:
        try:
            args.sha256[label] = tuning.read_table(getattr(args, label), args.arch)[0]
        except FileNotFoundError:
            p.error(f"--{label}: {getattr(args, label)}: no such file")
        except ValueError as e:
            p.error(f"--{label}: {e}")
    if args.sha256["base"] == args.sha256["new"] and not args.base_patch:
        p.error("--base and --new are the same table: nothing to compare")
    return args


def stage(table: str, directory: str, arch: str, reverse_patch: str | None = None):
    """A copy of the sources under `directory` with `table` as the arch's tuned table (and
    `reverse_patch` taken back). liger_aot's links to kernel_src and build_tools stay links,
    into the copy. A directory left by an earlier run is replaced; any other is refused, never
    deleted."""
    if os.path.lexists(directory):
        if not os.path.isfile(os.path.join(directory, STAGE_MARK)):
            raise SystemExit(f"{directory} exists and is not a stage of this script: "
                             "choose another --work")
        shutil.rmtree(directory)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in STAGED:
        shutil.copytree(os.path.join(ROOT, name), os.path.join(directory, name),
                        symlinks=True, ignore=ignore)
    shutil.copyfile(table, os.path.join(directory, "kernel_src", "tuned", f"{arch}.json"))
    with open(os.path.join(directory, STAGE_MARK), "w") as f:
        f.write(f"{os.path.abspath(table)}\n")
    if reverse_patch:
        take_back(reverse_patch, directory)


def take_back(patch: str, directory: str):
    """`git apply -R` of patch's files under STAGED in `directory`, as a plain patch tool
    (no repository above the stage is looked for); SystemExit with git's reason where it
    does not apply."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(os.path.abspath(directory)))
    argv = ["git", "apply", "-R", *(f"--include={name}/*" for name in STAGED), patch]
    done = subprocess.run(argv, cwd=directory, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--base-patch: {patch} does not come off the sources: "
                         f"{done.stderr.strip()}")


def child_env(stage_dir: str, artifacts: str) -> dict:
    env = dict(os.environ, LIGER_AOT_ARTIFACT_DIR=artifacts, LIGER_AOT_STRICT="1",
               LIGER_AOT_IGNORE_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [stage_dir] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def stage_dir(args, label: str) -> str:
    return os.path.join(args.work, f"stage-{label}")


def artifact_dir(args, label: str) -> str:
    return os.path.join(args.work, f"artifacts-{label}")


def commands(args, label: str, round_index: int) -> dict:
    """The build, verify and timing commands of one table (argv lists, run in its stage)."""
    stage, artifacts = stage_dir(args, label), artifact_dir(args, label)
    return {
        "build": [sys.executable, "-m", "liger_aot", "build", "--arch", args.arch,
                  "--out", artifacts, "--jobs", str(args.jobs)],
        "verify": [sys.executable, "-c", VERIFY, stage, args.arch],
        "configs": [sys.executable, "-c", CONFIGS, args.arch, args.ops, args.ns],
        "time": [sys.executable, os.path.join(stage, "benchmarks", "suite.py"),
                 "--ops", args.ops, "--norm-ns", args.ns, "--paths", "liger-aot", "--graphs",
                 "--out", round_dir(args, label, round_index)],
    }


def round_dir(args, label: str, round_index: int) -> str:
    """Where a round's suite output goes: under --out, so a run cut short (a device call's
    time limit) still brings back every round it finished."""
    return os.path.join(args.out, "rounds", f"{label}-round{round_index}")


def run_order(rounds: int) -> list:
    """(label, round) in timing order: A B, B A, A B, ..."""
    order = []
    for r in range(rounds):
        pair = LABELS if r % 2 == 0 else LABELS[::-1]
        order += [(label, r) for label in pair]
    return order


def read_rounds(path: str) -> list:
    """The liger-aot rows of one round's kernels.csv (the suite's)."""
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row["path"] == "liger-aot"]


def graph_ms(row: dict, pass_: str) -> float | None:
    """A suite row's CUDA-graph time of a pass, or None where it has none to trust (a result
    not `ok`: a failed check, an error, no graph)."""
    value = row.get(f"{pass_}_graph_ms") or ""
    return float(value) if row["status"] == "ok" and value else None


def round_lines(label: str, round_index: int, rows: list) -> list:
    """One line per op and length of a round just timed: its CUDA-graph ms a pass, printed
    as it comes so that a log cut short still holds every round it finished."""
    def shown_ms(row, pass_):
        ms = graph_ms(row, pass_)
        return row["status"] if ms is None else f"{ms:.4f}"

    return [f"[{label}] round {round_index}: {row['op']} N={row['sweep_value']}: "
            + ", ".join(f"{p} {shown_ms(row, p)}" for p in PASSES) + " ms (graphs)"
            for row in rows]


def merge(rounds: dict, configs: dict) -> list:
    """{label: [rows of each round]} -> one record per (op, n, pass): median ms and % of
    copy of each table over its rounds (CUDA graphs), the new table's change in time, and
    the config each table gives the pass there (configs: {label: {op: {str(n): {"fwd": tag,
    "bwd": tag}}}}, the CONFIGS child's JSON; fwdbwd: both tags). A result that is not `ok`
    in any round (a failed check, an error, no graph) leaves that table's figures empty."""
    figures = {}
    for label, tables in rounds.items():
        for rows in tables:
            for row in rows:
                for pass_ in PASSES:
                    key = (row["op"], int(row["sweep_value"]), pass_)
                    entry = figures.setdefault(key, {}).setdefault(
                        label, {"ms": [], "pct": [], "bad": False})
                    ms = graph_ms(row, pass_)
                    if ms is None:
                        entry["bad"] = True
                    else:
                        entry["ms"].append(ms)
                        entry["pct"].append(float(row[f"{pass_}_graph_pct_copy"]))
    records = []
    for (op, n, pass_), by_label in figures.items():
        record = {"op": op, "n": n, "pass": pass_}
        for label in LABELS:
            entry = by_label.get(label, {"ms": [], "pct": [], "bad": True})
            ok = not entry["bad"] and entry["ms"]
            record[f"{label}_ms"] = statistics.median(entry["ms"]) if ok else None
            record[f"{label}_pct_of_copy"] = statistics.median(entry["pct"]) if ok else None
            record[f"{label}_runs"] = len(entry["ms"])
            tags = configs.get(label, {}).get(op, {}).get(str(n), {})
            record[f"{label}_config"] = (" + ".join(tags[p] for p in ("fwd", "bwd") if p in tags)
                                         if pass_ == "fwdbwd" else tags.get(pass_))
        base, new = record["base_ms"], record["new_ms"]
        record["change_pct"] = 100 * (new / base - 1) if base and new else None
        records.append(record)
    return records


def table_lines(records: list) -> list:
    def fmt(value, spec):  # spec ending in % appends the sign, not format's percent
        if value is None:
            return "-"
        return format(value, spec[:-1]) + "%" if spec.endswith("%") else format(value, spec)

    lines = ["| op | N | pass | base ms | new ms | change | base % of copy | new % of copy | "
             "config |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        config = "same" if r["base_config"] == r["new_config"] else "changed"
        lines.append(f"| {r['op']} | {r['n']} | {r['pass']} | {fmt(r['base_ms'], '.4f')} | "
                     f"{fmt(r['new_ms'], '.4f')} | {fmt(r['change_pct'], '+.1f%')} | "
                     f"{fmt(r['base_pct_of_copy'], '.1f')} | {fmt(r['new_pct_of_copy'], '.1f')} | "
                     f"{config} |")
    return lines


def write_csv(records: list, path: str):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(records)


def shown(argv: list) -> str:
    return " ".join("<script>" if "\n" in a else a for a in argv)


def run_in_stage(args, label: str, argv: list, capture: bool = False) -> str | None:
    """Run argv in the label's stage; with `capture`, return its stdout instead of showing
    it."""
    stage = stage_dir(args, label)
    print(f"+ [{label}] {shown(argv)}", flush=True)
    try:
        done = subprocess.run(argv, cwd=stage, env=child_env(stage, artifact_dir(args, label)),
                              check=True, stdout=subprocess.PIPE if capture else None,
                              text=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"[{label}] exit status {e.returncode}: {shown(argv)}") from None
    return done.stdout


def main(argv=None):
    args = parse_args(argv)
    tables = {"base": args.base, "new": args.new}
    patches = {"base": args.base_patch, "new": None}
    for label in LABELS:
        print(f"{label}: {tables[label]} (sha256 {args.sha256[label][:12]})"
              + (f", the sources without {patches[label]}" if patches[label] else ""))
    if args.dry_run:
        for label in LABELS:
            cmds = commands(args, label, 0)
            print(f"[{label}] stage {stage_dir(args, label)}")
            for step in ("build", "verify", "configs"):
                print(f"[{label}] {shown(cmds[step])}")
        for label, r in run_order(args.rounds):
            print(f"[{label}] round {r}: {shown(commands(args, label, r)['time'])}")
        return
    os.makedirs(args.out, exist_ok=True)
    configs = {}
    for label in LABELS:
        stage(tables[label], stage_dir(args, label), args.arch, patches[label])
        cmds = commands(args, label, 0)
        run_in_stage(args, label, cmds["build"])
        run_in_stage(args, label, cmds["verify"])
        configs[label] = json.loads(run_in_stage(args, label, cmds["configs"], capture=True))
    rounds = {label: [] for label in LABELS}
    for label, r in run_order(args.rounds):
        cmd = commands(args, label, r)["time"]
        run_in_stage(args, label, cmd)
        rows = read_rounds(os.path.join(cmd[-1], "kernels.csv"))
        print("\n".join(round_lines(label, r, rows)), flush=True)
        rounds[label].append(rows)
    records = merge(rounds, configs)
    base = args.base + (f" without {args.base_patch}" if args.base_patch else "")
    print(f"\nbase {base} against new {args.new}, {args.arch}, 2^26 elements, medians "
          f"of {args.rounds} round(s), from CUDA graphs (bwd: with the weight gradient):")
    print("\n".join(table_lines(records)))
    path = os.path.join(args.out, "compare_tables.csv")
    write_csv(records, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
