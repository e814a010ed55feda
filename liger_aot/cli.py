"""liger-aot command line: build | wheel | inspect | verify | tune."""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

from liger_aot.artifact_format import TARGETS

DEFAULT_WHEEL_DIR = "wheels"


def _default_build_dir() -> str:
    from liger_aot.runtime import _env

    return _env.cache_dir()


def cmd_build(args) -> int:
    from liger_aot.build_tools import aot

    archs = aot.parse_archs(args.arch)
    started = time.perf_counter()
    print(f"building {', '.join(archs)} into {os.path.abspath(args.out)} with {args.jobs} "
          f"job(s)", flush=True)
    results = aot.build(archs, args.out, args.jobs)
    print(aot.format_summary(results, time.perf_counter() - started), flush=True)
    return 0


def cmd_wheel(args) -> int:
    from liger_aot.build_tools import aot, wheel

    archs = aot.parse_archs(args.arch)
    if not args.no_build:
        started = time.perf_counter()
        results = aot.build(archs, args.build_dir, args.jobs)
        print(aot.format_summary(results, time.perf_counter() - started), flush=True)
    paths = [wheel.pack_package(args.out)]
    paths += [wheel.pack_arch(arch, args.build_dir, args.out) for arch in archs]
    for path in paths:
        print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
    print(f"install: pip install {paths[1] if len(paths) > 1 else paths[0]} "
          f"--find-links {os.path.abspath(args.out)}")
    return 0


def _sets_by_arch():
    from liger_aot.runtime import registry

    return {arch: [registry.load_set(d, source, arch)
                   for d, source in registry.candidate_dirs(arch)] for arch in TARGETS}


def _describe_device() -> tuple:
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "no GPU visible to torch (CPU tensors run through Triton's interpreter)"
    from liger_aot.runtime.device import device_arch

    arch, description = device_arch(torch.cuda.current_device())
    return arch, f"{description}: {'artifact arch ' + arch if arch else 'no AOT arch (JIT only)'}"


def cmd_inspect(args) -> int:
    from liger_aot.kernel_src import tuning

    device_arch_name, description = _describe_device()
    print(f"device: {description}")
    any_set = False
    for arch, sets in _sets_by_arch().items():
        for s in sets:
            any_set = True
            runnable = "runs on this device" if arch == device_arch_name else "not for this device"
            print(f"\n{arch} [{s.source}] {s.directory} ({runnable})")
            if s.error:
                print(f"  REFUSED: {s.error}")
                continue
            m = s.manifest
            print(f"  Triton {m['triton_version']}, ptxas {m.get('ptxas_version')}, "
                  f"{len(m['variants'])} variants, "
                  f"{sum(e['size'] for e in m['variants'].values()):,} bytes")
            built, installed = m.get("tuned_sha256"), tuning.table_sha256(arch)
            if built or installed:
                print(f"  tuned table {built[:12] if built else 'none'}" + (
                    "" if built == installed else f", not the installed "
                    f"{installed[:12] if installed else 'none'}: heuristic configs are used"))
            per_op = Counter(name.split(".")[0] for name in m["variants"])
            for op, count in sorted(per_op.items()):
                print(f"  {op:<28} {count:>5} variants")
    if not any_set:
        print("\nno artifact sets found: install a liger-aot-<arch> wheel, set "
              "LIGER_AOT_ARTIFACT_DIR, or run `liger-aot build --arch <arch>`")
    return 0


def cmd_verify(args) -> int:
    """Check every variant of every artifact set found (or of --dir) against its manifest and
    the installed kernel sources; exit 1 on any problem."""
    from liger_aot.kernel_src import all_specs, tuning
    from liger_aot.runtime import registry

    if args.dir:
        sets = [registry.load_set(os.path.join(args.dir, a), "dir", a) for a in TARGETS
                if os.path.isfile(os.path.join(args.dir, a, "manifest.json"))]
    else:
        sets = [s for group in _sets_by_arch().values() for s in group]
    problems = 0
    for s in sets:
        if s.error:
            print(f"REFUSED {s.error}")
            problems += 1
            continue
        variants = {v.name: v for spec in all_specs() for v in spec.variants(s.arch)}
        other_table = s.manifest.get("tuned_sha256") != tuning.table_sha256(s.arch)
        if other_table:
            print(f"NOTE {s.arch}: built with another tuned table than the installed "
                  f"{tuning.table_path(s.arch)}; the runtime uses the heuristic configs")
        bad = unknown = 0
        for name, entry in s.manifest["variants"].items():
            variant = variants.get(name)
            if variant is None and other_table:
                unknown += 1  # a config of the other table: not checkable, never used
                continue
            if variant is None:
                reason = f"{name}: not a variant of the installed specs"
            else:
                _, reason = registry.check_entry(entry, variant,
                                                 os.path.join(s.directory, entry.get("file", "")))
            if reason:
                print(f"BAD {s.arch}: {reason}")
                bad += 1
        missing = len(variants) - len(set(variants) & set(s.manifest["variants"]))
        print(f"{s.arch} [{s.source}] {s.directory}: "
              f"{len(s.manifest['variants']) - bad - unknown} ok, {bad} bad, {missing} of the "
              f"specs' variants absent" + (f", {unknown} of the other table" if unknown else ""))
        problems += bad
    if not sets:
        print("no artifact sets found")
        return 1
    return 1 if problems else 0


def _count(text: str) -> int:
    """argparse type of a count >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"takes a count >= 0, got {text!r}")
    return value


def cmd_tune(args) -> int:
    from liger_aot.build_tools import aot, tune

    archs = aot.parse_archs(args.arch)
    if len(archs) != 1:
        raise ValueError("tune one arch at a time, on a GPU of that arch")
    return tune.run(archs[0], specs=args.specs, out=args.out, dry_run=args.dry_run,
                    cols=args.cols, graphs_top=args.graphs_top, inexact_only=args.inexact_only)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="liger-aot",
        description="Build, pack and inspect liger-aot's ahead-of-time Triton kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    archs = ", ".join(TARGETS)
    jobs = max(1, os.cpu_count() or 1)

    p = sub.add_parser("build", help="compile every kernel variant for one or more archs",
                       description="Cross-compile every kernel variant (no GPU needed). "
                                   "Incremental: unchanged variants are reused.")
    p.add_argument("--arch", required=True, help=f"comma-separated archs: {archs}")
    p.add_argument("--out", default=_default_build_dir(),
                   help="artifact root, <out>/<arch>/manifest.json (default: LIGER_AOT_CACHE_DIR "
                        "or ~/.cache/liger_aot, which the runtime also searches)")
    p.add_argument("--jobs", type=int, default=jobs, help=f"compile processes (default {jobs})")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("wheel", help="build (incrementally) and pack installable wheels",
                       description="Write liger_aot-<ver>-py3-none-any.whl and one "
                                   "liger_aot_<arch>-<ver>-py3-none-any.whl per arch.")
    p.add_argument("--arch", required=True, help=f"comma-separated archs: {archs}")
    p.add_argument("--out", default=DEFAULT_WHEEL_DIR, help="wheel directory (default wheels/)")
    p.add_argument("--build-dir", default=_default_build_dir(),
                   help="artifact root to build into and pack from (default: as for build)")
    p.add_argument("--jobs", type=int, default=jobs, help=f"compile processes (default {jobs})")
    p.add_argument("--no-build", action="store_true", help="pack what is built; compile nothing")
    p.set_defaults(func=cmd_wheel)

    p = sub.add_parser(
        "inspect", help="show the device, artifact sets and variants per op",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Print this machine's GPU and the arch whose artifacts it runs, then every artifact set the
runtime finds, in the order it searches them:
  1. LIGER_AOT_ARTIFACT_DIR (roots holding <arch>/manifest.json)
  2. installed arch wheels (liger_aot_<arch>)
  3. the local build cache (LIGER_AOT_CACHE_DIR, default ~/.cache/liger_aot)
For each: its Triton and ptxas versions, variant count and size, whether it was built with
the installed tuned table, and variants per kernel; a set refused by a check says why.
Needs no GPU (without one, every set reads "not for this device"). Exit status 0.""")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "verify", help="check every binary against its manifest (exit 1 if bad)",
        description="Check every artifact set found (as `inspect` lists them), or those "
                    "under --dir: its manifest (format, arch, launch ABI), then each "
                    "variant's binary (present, size, sha256) and its kernel source hash and "
                    "parameter types against the installed specs. Prints one line per set "
                    "and one per bad variant. Exit status 1 if any set is refused or any "
                    "variant is bad, or if no set is found; 0 otherwise. Needs no GPU.")
    p.add_argument("--dir", help="verify this artifact root (holding <arch>/manifest.json) "
                                 "instead of the sets found")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "tune", help="measure candidate configs on this GPU and write the arch's tuned table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Measure candidate configs of the size-dependent kernels (norms, SwiGLU, softmax) on this GPU,
which must be of --arch, and write the arch's tuned table. `liger-aot build --arch ARCH`
compiles what it chose and the runtime picks from it on that arch; archs without a table use
the specs' heuristic rules.""",
        epilog="""\
Per spec and representative shape (one per size bucket: the row length rounded up to a power
of two, plus flags such as the fused residual), every candidate runs once through Triton JIT
and is checked against a torch reference (wrong or failing ones are dropped), then timed
(triton.testing.do_bench median, bf16). The heuristic config stays unless the best is more
than 2% faster. The norms are also timed at the benchmark suite's row counts where those are
larger (65536 x 1024, 32768 x 2048) and scored by their mean time relative to each shape's
fastest. With --graphs-top K the heuristic and the K best are timed again from CUDA-graph
replays (the benchmark suite's --graphs measure) and chosen among on those times, by the
same 2% rule. Every norm bucket is also timed at 3/4, 5/8 and 7/8 of its length, where what
its other lengths would run (the chosen config, or the twin without the length of a looped
forward with its row length compiled in, EXACT_N, which serves that length only) and the
bucket's other candidates compete by the same 2% rule and score for the bucket's other
lengths; a probe length whose fastest config is more than 3% faster than the winner gets
that config for itself alone (the record's "lengths"), and a winner more than 1% slower
than what those lengths ran before at a probe without its own config is kept out. Entries
of other specs in an existing table are kept. On an H200 a spec took 5 s (softmax) to 150 s
(rms_norm_bwd), every spec about 6 minutes, before the norms' other lengths were timed too
(about four times the runs). Commit the table, then rebuild the
arch.

  liger-aot tune --arch sm90                       # every spec
  liger-aot tune --arch sm90 --specs rms_norm_fwd  # one spec, merged into the table
  liger-aot tune --arch sm90 --specs rms_norm_bwd --cols 32768,65536
                                                   # two buckets, merged into the spec's
  liger-aot tune --arch sm90 --specs layer_norm_fwd --cols 1024,2048 --graphs-top 4
                                                   # chosen on graph replays
  liger-aot tune --arch sm90 --specs layer_norm_fwd --inexact-only --graphs-top 4
                                                   # the other lengths only, the table's
                                                   # choices kept
  liger-aot tune --arch sm90 --dry-run             # the plan (needs no GPU)""")
    p.add_argument("--arch", required=True, help=f"the arch of this GPU: one of {archs}")
    p.add_argument("--specs", help="comma-separated spec names (default: every tunable spec; "
                                   "--dry-run lists them)")
    p.add_argument("--out", help="table to write, atomically (default: "
                                 "kernel_src/tuned/<arch>.json of this liger_aot); what this "
                                 "run does not tune is kept from the table there, or, for a "
                                 "new file, from the default table")
    p.add_argument("--cols", help="comma-separated row lengths: tune only the buckets of these "
                                  "(e.g. 32768,65536); the specs' other entries are kept")
    p.add_argument("--graphs-top", type=_count, default=0, metavar="K",
                   help="time the heuristic and the K best configs of each bucket again from "
                        "CUDA-graph replays and choose among them on those times (default 0: "
                        "do_bench alone)")
    p.add_argument("--inexact-only", action="store_true",
                   help="keep the table's choices; for its norm buckets only measure what "
                        "the bucket's other lengths run, and record it")
    p.add_argument("--dry-run", action="store_true",
                   help="print the specs, shapes and candidate counts; measure and write nothing")
    p.set_defaults(func=cmd_tune)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"liger-aot {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"liger-aot {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
