"""Tuned config tables: ``kernel_src/tuned/<arch>.json``, written by ``liger-aot tune --arch
<arch>`` on a GPU of that arch (build_tools/tune.py). Pure Python and pure data, like spec.py:
the runtime reads it on the AOT path, the build compiles what it chose.

A table maps spec name -> size bucket -> the chosen config, plus what was measured:

    {"arch": "sm90", "format": 1, "device": ..., "triton_version": ..., "specs": {
      "rms_norm_fwd": {"n_cols=4096,residual=False": {
          "config": {"constexprs": {"BLOCK_M": 2, ...}, "num_stages": 1, "num_warps": 8},
          "ms": 0.069, "gbps": 3890.1, "shape": [16384, 4096], "dtype": "bf16",
          "heuristic": {"tag": ..., "ms": 0.071}, "best": {"tag": ..., "ms": 0.069},
          "candidates": 6}}}}

An entry's config was chosen at its shape's row length. The entry may also hold "inexact":
{"config": ..., "shape": [rows, length], "ms": ..., "twin_ms": ..., "device": ...}, the
config measured best at other lengths of the bucket (3/4 of its own, the shape; 5/8 and 7/8
too in "also", where tuned after session 32), which the bucket's other lengths run.
Without one they run the entry's config too, except that a config with the row length
compiled in (spec.EXACT_KEY) serves that length only: there they run its inexact twin
(twin_ms: the time of the reference the record was chosen against: what they ran before,
the table's earlier inexact config or the twin). The record may also hold "lengths":
{"5120": {"config": ..., "ms": ..., "inexact_ms": ...}}, a probe length whose fastest config
beat the record's own by more than tune.LENGTH_MARGIN: that length runs its own config (the
probes are 5/8, 3/4 and 7/8 of the bucket, where models' hidden sizes sit: 5120, 6144, 7168).

A bucket is the spec rule's arguments by name with the first (the row length) rounded up to
a power of two (`bucket_key`). A spec, bucket or arch without an entry uses the spec's
heuristic rule. Tuned configs equal to a heuristic config (same tag) are that config object;
others are created once per process, so the runtime can key launchers by config identity.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import threading

from .spec import (EXACT_KEY, HOLD_KEY, STAGED_KEYS, Config, KernelSpec, exact_length,
                   inexact_twin, next_power_of_2)

TABLE_FORMAT = 1
TUNED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned")

_lock = threading.Lock()
_tables: dict = {}  # arch -> (sha256 or None, table dict or None)
_configs: dict = {}  # (spec name, tag) -> Config: one object per tuned config and process
_by_spec: dict = {}  # (spec name, arch) -> _tuned's ({bucket: Config}, sizes, inexact)


def table_path(arch: str) -> str:
    return os.path.join(TUNED_DIR, f"{arch}.json")


def load_table(arch: str) -> tuple:
    """(sha256 of the file, parsed table), or (None, None) when the arch has no table. Read
    and checked once per process; a malformed table raises ValueError naming the file."""
    with _lock:
        found = _tables.get(arch)
        if found is None:
            try:
                found = read_table(table_path(arch), arch)
            except FileNotFoundError:
                found = (None, None)
            _tables[arch] = found
        return found


def read_table(path: str, arch: str) -> tuple:
    """(sha256, parsed table) of the table file at `path`, checked to be `arch`'s. A missing
    file raises FileNotFoundError, a malformed one ValueError naming the file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        table = json.loads(data)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    return hashlib.sha256(data).hexdigest(), _checked(table, arch, path)


def table_sha256(arch: str) -> str | None:
    return load_table(arch)[0]


def _checked(table, arch: str, path: str) -> dict:
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise ValueError(f"{path}: not a tuned table of format {TABLE_FORMAT}")
    if table.get("arch") != arch:
        raise ValueError(f"{path}: table is for arch {table.get('arch')!r}, not {arch!r}")
    if not isinstance(table.get("specs"), dict):
        raise ValueError(f"{path}: no specs")
    return table


def config_record(config: Config) -> dict:
    record = {"constexprs": dict(config.constexprs), "num_warps": config.num_warps,
              "num_stages": config.num_stages}
    if config.maxnreg:
        record["maxnreg"] = config.maxnreg
    if not config.fp_fusion:
        record["fp_fusion"] = False
    return record


def record_config(record: dict) -> Config:
    """config_record's inverse (a new object: config_from_record finds the shared one)."""
    return Config(dict(record["constexprs"]), num_warps=int(record["num_warps"]),
                  num_stages=int(record["num_stages"]), maxnreg=int(record.get("maxnreg", 0)),
                  fp_fusion=bool(record.get("fp_fusion", True)))


def config_from_record(spec: KernelSpec, record: dict) -> Config:
    """The process-wide Config for a table record: the spec's own config with that tag, else
    one object per (spec, tag). Records with other constexpr names than the spec's raise
    (a Triton config may add the spec's defaulted ones, a staged one the STAGED_KEYS)."""
    config = record_config(record)
    keys = set(spec.configs[0].constexprs)
    names = set(config.constexprs)
    if not (keys <= names <= keys | set(spec.constexpr_defaults)) and not (
            spec.staged and names == keys | set(STAGED_KEYS)):
        raise ValueError(f"tuned config {config.tag} of {spec.name}: constexprs "
                         f"{sorted(config.constexprs)}, the spec has {sorted(keys)}"
                         + (f" (staged configs: also {', '.join(STAGED_KEYS)})"
                            if spec.staged else ""))
    if config.constexprs.get(EXACT_KEY) and not exact_length(config):
        raise ValueError(f"tuned config {config.tag} of {spec.name}: {EXACT_KEY} needs looped "
                         f"rows whose pass 1 is wider than BLOCK_N (PASS1_BLOCK)")
    if config.constexprs.get(HOLD_KEY) and not config.constexprs.get(EXACT_KEY):
        raise ValueError(f"tuned config {config.tag} of {spec.name}: {HOLD_KEY} needs "
                         f"{EXACT_KEY}")
    return _shared(spec, config)


def _shared(spec: KernelSpec, config: Config) -> Config:
    """The process-wide object of a config: the spec's own with that tag, else one per (spec,
    tag)."""
    for own in spec.configs:
        if own.tag == config.tag:
            return own
    return _configs.setdefault((spec.name, config.tag), config)


def _serving(spec: KernelSpec, config: Config, n_cols: int, other: tuple | None) -> Config:
    """config for rows of the length it serves (other: (that length, the inexact config,
    {length: its own config}), from the entry's "inexact" record; without one, the length an
    exact config compiles in, else every length of the bucket), else a length's own config
    where the record names one, else _other_lengths_config."""
    if other:
        length = other[0]
        if n_cols in other[2]:
            return other[2][n_cols]
    elif config.constexprs.get(EXACT_KEY):
        length = exact_length(config)
    else:
        return config
    return config if n_cols == length else _other_lengths_config(spec, config, other)


def _other_lengths_config(spec: KernelSpec, config: Config, other: tuple | None) -> Config:
    """What a bucket's other lengths run: its inexact config, else its config, or an exact
    config's inexact twin (EXACT_KEY: it serves its own length only)."""
    if other:
        return other[1]
    return _twin(spec, config) if config.constexprs.get(EXACT_KEY) else config


def _twin(spec: KernelSpec, config: Config) -> Config:
    return _shared(spec, inexact_twin(config))


def _inexact_config(spec: KernelSpec, entry: dict, chosen: Config) -> tuple | None:
    """(the bucket's row length, the config its other lengths run, {length: that length's own
    config}) of an entry's "inexact" record (None without one); chosen is the entry's config.
    The length is the one chosen compiles in, else the entry's shape's. No config of the
    record may have a row length compiled in, and its own lengths lie in the bucket below
    the entry's."""
    record = entry.get("inexact")
    if record is None:
        return None
    length = (exact_length(chosen) if chosen.constexprs.get(EXACT_KEY)
              else int(entry["shape"][1]))
    configs = {}
    for key, own in [(None, record)] + sorted(record.get("lengths", {}).items()):
        config = config_from_record(spec, own["config"])
        if config.constexprs.get(EXACT_KEY):
            raise ValueError(f"inexact config {config.tag} of {spec.name} has {EXACT_KEY}: it "
                             f"serves the rows of other lengths than the exact one")
        if key is not None and not (length // 2 < int(key) < length):
            raise ValueError(f"inexact length {key} of {spec.name}: not a length that the "
                             f"{length} bucket's other lengths hold")
        configs[None if key is None else int(key)] = config
    return length, configs.pop(None), configs


# Bytes per element of the dtypes a table entry may be measured in.
DTYPE_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}


def _tuned(spec: KernelSpec, arch: str) -> tuple:
    """({bucket key: Config}, {bucket key: element size it was measured with}, {bucket key:
    _inexact_config's (the bucket's length, the Config its other lengths run, {length: own
    Config}), for entries that name one})."""
    key = (spec.name, arch)
    found = _by_spec.get(key)
    if found is None:
        _, table = load_table(arch)
        entries = (table or {}).get("specs", {}).get(spec.name, {})
        with _lock:
            try:
                tuned = {bucket: config_from_record(spec, entry["config"])
                         for bucket, entry in sorted(entries.items())}
                found = (tuned,
                         {bucket: DTYPE_ITEMSIZE[entry.get("dtype", "bf16")]
                          for bucket, entry in entries.items()},
                         {bucket: _inexact_config(spec, entry, tuned[bucket])
                          for bucket, entry in entries.items() if "inexact" in entry})
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{table_path(arch)}: bad entry for {spec.name}: {e!r}") from None
            _by_spec[key] = found
    return found


def tuned_configs(spec: KernelSpec, arch: str) -> dict:
    """{bucket key: Config} of the spec in the arch's table ({} without one)."""
    return _tuned(spec, arch)[0]


def inexact_configs(spec: KernelSpec, arch: str) -> dict:
    """{bucket key: Config} the bucket's other lengths run, where the table names one (else
    they run the bucket's config, or an exact one's twin)."""
    return {bucket: config for bucket, (_, config, _) in _tuned(spec, arch)[2].items()}


def length_configs(spec: KernelSpec, arch: str) -> dict:
    """{bucket key: {row length: Config}}: the lengths of a bucket that run their own config
    (the inexact record's "lengths"), where the table names any."""
    return {bucket: lengths for bucket, (_, _, lengths) in _tuned(spec, arch)[2].items()
            if lengths}


def arch_configs(spec: KernelSpec, arch: str) -> tuple:
    """What the build compiles for the arch: the heuristic configs, then the tuned ones that
    differ from them (by tag) and what their buckets' other lengths run (inexact configs,
    else exact ones' twins, and single lengths' own configs), in a stable order."""
    configs = list(spec.configs)
    tags = {c.tag for c in configs}
    tuned_by_bucket, _, inexact = _tuned(spec, arch)
    for bucket, tuned in tuned_by_bucket.items():
        other = inexact.get(bucket)
        own = [c for _, c in sorted(other[2].items())] if other else []
        for config in (tuned, _other_lengths_config(spec, tuned, other), *own):
            if config.tag not in tags:
                tags.add(config.tag)
                configs.append(config)
    return tuple(configs)


@functools.lru_cache(maxsize=None)
def _rule_params(rule) -> tuple:
    """(names, defaults) of a rule's parameters; defaults[i] is None where there is none."""
    params = list(inspect.signature(rule).parameters.values())
    return (tuple(p.name for p in params),
            tuple(None if p.default is inspect.Parameter.empty else p.default for p in params))


def bucket_key(spec: KernelSpec, args: tuple) -> str:
    """The table key of rule arguments, e.g. "n_cols=4096,residual=False" for
    rms_norm_fwd's rule called as (3000, False) or (3000,)."""
    names, defaults = _rule_params(spec.rule)
    values = list(args) + list(defaults[len(args):])
    values[0] = next_power_of_2(values[0])
    return ",".join(f"{n}={v}" for n, v in zip(names, values))


def select(spec: KernelSpec, arch: str | None, args: tuple, itemsize: int = 0) -> Config:
    """The config for rule arguments `args` on `arch`: the tuned table's choice for their
    bucket, else the spec's rule. With `itemsize` (bytes per element of the call's data),
    only an entry measured with that element size: a config's shared memory and registers
    grow with it (a 3-stage whole row of 16K bf16 columns fits an H200's shared memory, of
    fp32 it does not), so other sizes take the rule. The entry's config serves the row
    length it was chosen at; the bucket's other lengths take its entry's inexact config
    where it names one (or the record's config of that very length), else the same config,
    or an exact one's twin (a config with the row length compiled in serves that length
    only: exact_length). The runtime calls it once per (device, args, dtype), see
    Kernel.select_config."""
    if arch is not None:
        tuned, sizes, inexact = _tuned(spec, arch)
        if tuned:
            key = bucket_key(spec, args)
            config = tuned.get(key)
            if config is not None and (not itemsize or sizes[key] == itemsize):
                return _serving(spec, config, args[0], inexact.get(key))
    return spec.rule(*args)


def format_table(table: dict) -> bytes:
    """The one serialization of a table: sorted keys, one line per bucket (a re-tune's diff
    shows what changed), final newline."""
    return (_dump(table, 3) + "\n").encode()


def _dump(value, depth: int, indent: str = "") -> str:
    if depth == 0 or not isinstance(value, dict) or not value:
        return json.dumps(value, sort_keys=True)
    inner = indent + " "
    items = [f"{inner}{json.dumps(k)}: {_dump(v, depth - 1, inner)}"
             for k, v in sorted(value.items())]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def reset():
    """Forget loaded tables and configs (tests)."""
    with _lock:
        _tables.clear()
        _configs.clear()
        _by_spec.clear()
