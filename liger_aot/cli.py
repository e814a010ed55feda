"""liger-aot command line: build | wheel | inspect | verify."""
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
    from liger_aot.kernel_src import all_specs
    from liger_aot.runtime import registry

    variants = {v.name: v for spec in all_specs() for v in spec.variants()}
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
        bad = 0
        for name, entry in s.manifest["variants"].items():
            variant = variants.get(name)
            if variant is None:
                reason = f"{name}: not a variant of the installed specs"
            else:
                _, reason = registry.check_entry(entry, variant,
                                                 os.path.join(s.directory, entry.get("file", "")))
            if reason:
                print(f"BAD {s.arch}: {reason}")
                bad += 1
        missing = len(variants) - len(set(variants) & set(s.manifest["variants"]))
        print(f"{s.arch} [{s.source}] {s.directory}: {len(s.manifest['variants']) - bad} ok, "
              f"{bad} bad, {missing} of the specs' variants absent")
        problems += bad
    if not sets:
        print("no artifact sets found")
        return 1
    return 1 if problems else 0


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

    p = sub.add_parser("inspect", help="show the device, artifact sets and variants per op")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="check every binary against its manifest (exit 1 if bad)")
    p.add_argument("--dir", help="verify this artifact root instead of the sets found")
    p.set_defaults(func=cmd_verify)

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
