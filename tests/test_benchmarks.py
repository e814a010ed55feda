"""benchmarks/suite.py without a GPU: the case registry, byte and flop counts, rates,
argument parsing, CSV, table, plots and targets on fabricated rows, and one end-to-end run
of --smoke (CPU, tiny shapes, liger-aot through Triton's interpreter). Nothing here times
anything that matters."""
import csv
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from _scripts import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "suite.py")
K = load_benchmark("suite")
BF16 = 2


def test_registry_covers_the_issue():
    assert list(K.CASES) == ["rms_norm", "layer_norm", "fused_add_rms_norm", "swiglu", "geglu",
                             "rope", "cross_entropy", "fused_linear_cross_entropy"]
    assert K.PATHS == ("liger-aot", "eager", "torch.compile", "liger-kernel")
    for case in K.CASES.values():
        assert case.shapes and case.smoke_shapes
        for shape in case.shapes + case.smoke_shapes:
            assert isinstance(case.label(shape), str) and case.label(shape)
            counts = case.flops(shape) if case.flops else case.traffic(shape, BF16)
            assert set(counts) == set(K.PASSES)


def test_norm_sweep_shapes():
    for op in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        case = K.CASES[op]
        assert case.sweep == "N"
        assert case.shapes[0] == {"M": 16384, "N": 4096}  # the standard shape first
        assert sorted(s["N"] for s in case.shapes) == list(K.NORM_NS)
        assert all(s["M"] * s["N"] == 64 * 2**20 for s in case.shapes)
        assert [s["N"] for s in K.select_shapes(case, quick=True, smoke=False)] == [4096]
        assert len(K.select_shapes(case, quick=False, smoke=False)) == 7
        assert K.select_shapes(case, quick=False, smoke=True) == case.smoke_shapes


def test_standard_shapes():
    assert K.CASES["swiglu"].shapes == ({"M": 8192, "N": 14336},)
    assert K.CASES["geglu"].shapes == ({"M": 8192, "N": 14336},)
    assert K.CASES["rope"].shapes == ({"B": 4, "H": 32, "KH": 8, "S": 4096, "D": 128},)
    ce = K.CASES["cross_entropy"]
    assert [s["V"] for s in ce.shapes] == [128256, 256000]
    assert K.select_shapes(ce, quick=True, smoke=False) == ({"M": 8192, "V": 128256},)
    assert K.CASES["fused_linear_cross_entropy"].shapes == ({"T": 8192, "H": 4096,
                                                             "V": 128256},)


def test_byte_counts():
    M, N = 16384, 4096
    mn = M * N * BF16
    rms = K.CASES["rms_norm"].traffic({"M": M, "N": N}, BF16)
    assert rms == {"fwd": 2 * mn, "bwd": 3 * mn, "fwdbwd": 5 * mn}
    assert K.CASES["layer_norm"].traffic({"M": M, "N": N}, BF16) == rms
    assert K.CASES["fused_add_rms_norm"].traffic({"M": M, "N": N}, BF16) == {
        "fwd": 4 * mn, "bwd": 4 * mn, "fwdbwd": 8 * mn}
    glu = 8192 * 14336 * BF16
    for op in ("swiglu", "geglu"):
        assert K.CASES[op].traffic({"M": 8192, "N": 14336}, BF16) == {
            "fwd": 3 * glu, "bwd": 5 * glu, "fwdbwd": 8 * glu}
    qk = 4 * (32 + 8) * 4096 * 128 * BF16
    assert K.CASES["rope"].traffic(K.CASES["rope"].shapes[0], BF16) == {
        "fwd": 2 * qk, "bwd": 2 * qk, "fwdbwd": 4 * qk}
    ce = K.CASES["cross_entropy"]
    for V in (128256, 256000):
        assert ce.traffic({"M": 8192, "V": V}, BF16) == {
            "fwd": 8192 * V * BF16, "bwd": None, "fwdbwd": 2 * 8192 * V * BF16}
    assert ce.traffic({"M": 8192, "V": 128256}, 4)["fwd"] == 8192 * 128256 * 4  # fp32


def test_flops():
    flce = K.CASES["fused_linear_cross_entropy"]
    mm = 2 * 8192 * 4096 * 128256
    assert flce.flops(flce.shapes[0]) == {"fwd": mm, "bwd": None, "fwdbwd": 3 * mm}
    assert all(v is None for v in flce.traffic(flce.shapes[0], BF16).values())
    assert all(c.flops is None for op, c in K.CASES.items() if op != "fused_linear_cross_entropy")


def test_byte_table_in_help_epilog():
    text = K.byte_table()
    for op in K.CASES:
        assert op in text
    assert "rms_norm [16384x4096]: fwd 0.268 GB, bwd 0.403 GB, fwd+bwd 0.671 GB" in text
    assert "fwd 8.61 TFLOP, fwd+bwd 25.8 TFLOP" in text


def test_add_rates():
    copy_bw, mm_rate = 4.0e12, 800e12
    row = {"fwd_ms": 0.1, "bwd_ms": 0.2, "fwdbwd_ms": float("nan")}
    K.add_rates(row, {"fwd": 4e8, "bwd": 8e8, "fwdbwd": 1.2e9}, None, copy_bw, mm_rate)
    assert row["fwd_pct_copy"] == pytest.approx(100.0)   # 4e8 B in 0.1 ms = 4 TB/s
    assert row["bwd_pct_copy"] == pytest.approx(100.0)
    assert row["fwdbwd_pct_copy"] is None                # no time, no rate
    row = {"fwd_ms": 10.0, "fwdbwd_ms": 40.0}
    K.add_rates(row, {"fwd": None, "bwd": None, "fwdbwd": None},
                {"fwd": 8e12, "bwd": None, "fwdbwd": 24e12}, copy_bw, mm_rate)
    assert row["fwd_tflops"] == pytest.approx(800.0)
    assert row["fwd_pct_matmul"] == pytest.approx(100.0)
    assert row["fwdbwd_tflops"] == pytest.approx(600.0)
    assert row["fwdbwd_pct_matmul"] == pytest.approx(75.0)
    assert row["fwd_pct_copy"] is None


def test_graph_rates_and_targets():
    """CUDA-graph timings get their own rates and target lines; without them, no such line."""
    copy_bw = 4.0e12
    row = {"fwd_ms": 0.2, "fwd_graph_ms": 0.1, "bwd_graph_ms": 0.4, "fwdbwd_graph_ms": None}
    K.add_rates(row, {"fwd": 4e8, "bwd": 8e8, "fwdbwd": 1.2e9}, None, copy_bw, 800e12)
    assert row["fwd_pct_copy"] == pytest.approx(50.0)
    assert row["fwd_graph_pct_copy"] == pytest.approx(100.0)
    assert row["bwd_graph_pct_copy"] == pytest.approx(50.0)
    assert row["fwdbwd_graph_pct_copy"] is None
    rows = _fake_rows()
    assert not any("CUDA-graph" in line for line in K.evaluate_targets(rows))
    for r in rows:
        if r["op"] == "swiglu" and r["status"] == "ok":
            r.update(fwd_graph_ms=0.1, fwd_grad_graph_ms=0.1, bwd_graph_ms=0.1,
                     fwdbwd_graph_ms=r["fwdbwd_ms"] / 2)
            K.add_rates(r, K.CASES["swiglu"].traffic(K.CASES["swiglu"].shapes[0], BF16), None,
                        4.3e12, 790e12)
    lines = K.evaluate_targets(rows)
    graph_lines = [line for line in lines if "[CUDA-graph replays]" in line]
    assert len(graph_lines) == len(K.TARGETS)
    swiglu = next(line for line in graph_lines if line.startswith("swiglu"))
    plain = next(line for line in lines if line.startswith("swiglu") and line not in graph_lines)
    assert "min" in swiglu and swiglu != plain
    assert "not measured" in next(line for line in graph_lines if line.startswith("rms_norm"))


def test_parser_defaults_and_options(monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    args = K.build_parser().parse_args([])
    assert args.ops == list(K.CASES) and args.paths == list(K.PATHS)
    assert not args.quick and not args.smoke and args.out == "." and args.dtype == "bf16"
    monkeypatch.setenv("OUT", "/tmp/somewhere")
    args = K.build_parser().parse_args(["--quick", "--ops", "rms_norm, rope",
                                        "--paths", "liger-aot,eager", "--dtype", "fp16"])
    assert args.quick and args.ops == ["rms_norm", "rope"] and args.out == "/tmp/somewhere"
    assert args.paths == ["liger-aot", "eager"] and args.dtype == "fp16"
    for bad in (["--ops", "rms_norm,nope"], ["--paths", "triton"], ["--ops", ","],
                ["--dtype", "fp8"], ["--norm-ns", "0"], ["--norm-ns", "896,x"],
                ["--norm-ns", str(2 * K.NORM_ELEMENTS)]):
        with pytest.raises(SystemExit):
            K.build_parser().parse_args(bad)
    assert K.build_parser().parse_args(["--norm-ns", "896, 2304"]).norm_ns == [896, 2304]


def test_norm_ns_replace_the_norm_sweeps_only():
    """--norm-ns: the norm cases at those lengths (2^26 elements each, with --quick too);
    the other ops and the smoke shapes keep theirs."""
    for quick in (False, True):
        shapes = K.select_shapes(K.CASES["rms_norm"], quick, False, [896, 4096])
        assert shapes == ({"M": 2**26 // 896, "N": 896}, {"M": 16384, "N": 4096})
    swiglu = K.CASES["swiglu"]
    assert K.select_shapes(swiglu, False, False, [896]) == swiglu.shapes
    ln = K.CASES["layer_norm"]
    assert K.select_shapes(ln, False, True, [896]) == ln.smoke_shapes


def test_help_runs_without_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    for word in ("--ops", "--quick", "--out", "--paths", "--smoke", "do_bench",
                 "Minimal traffic per op", "fused_linear_cross_entropy"):
        assert word in out.stdout


def test_main_without_gpu_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="no CUDA device"):
        K.main(["--out", str(tmp_path)])


def test_rel_error_and_helpers():
    ref = torch.ones(10)
    assert K.rel_error(ref.clone(), ref) == 0.0
    assert K.rel_error(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    assert K.rel_error(torch.full((10,), float("nan")), ref) == math.inf
    assert K.rel_error(torch.ones(9), ref) == math.inf
    assert K.rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    t = torch.randn(2, 3, 4).transpose(1, 2).requires_grad_()
    c = K.fresh(t)
    assert c.stride() == t.stride() and c.is_leaf and c.requires_grad
    assert c.data_ptr() != t.data_ptr()
    idx = torch.arange(3)
    assert K.fresh(idx) is idx
    x = torch.zeros(4)
    g_new, g_alias = torch.zeros(8), x[:2]
    assert K.extra_grad_bytes([g_new, g_alias, g_new, None], [x]) == 8 * 4


def test_cotangents():
    gen = torch.Generator()
    gen.manual_seed(0)
    outs = (torch.tensor(2.0), torch.randn(2, 3, 4).transpose(1, 2))
    cots = K.make_cotangents(outs, torch.bfloat16, gen)
    assert cots[0].dim() == 0 and cots[0].item() == 1.0 and cots[0].dtype == torch.float32
    assert cots[1].dtype == torch.bfloat16 and cots[1].shape == outs[1].shape
    assert cots[1].stride() == outs[1].stride()


def test_check_path_reports_mismatch():
    x = torch.randn(4, 8).requires_grad_()
    setup = K.Setup((x,), lambda x: x * 2, {})
    gen = torch.Generator()
    gen.manual_seed(0)
    ref = K.reference(setup, torch.float32, gen)
    xs = [K.fresh(x)]
    assert K.check_path(lambda x: x * 2, xs, ref.cotangents, ref, 1e-6) == 0.0
    with pytest.raises(AssertionError, match="out0 rel err"):
        K.check_path(lambda x: x * 2.5, [K.fresh(x)], ref.cotangents, ref, 1e-3)
    with pytest.raises(AssertionError, match="2 outputs"):
        K.check_path(lambda x: (x * 2, x), [K.fresh(x)], ref.cotangents, ref, 1e-3)


def _fake_rows():
    rows = []
    copy_bw, mm = 4.3e12, 790e12
    for op in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        case = K.CASES[op]
        for shape in case.shapes:
            for i, path in enumerate(K.PATHS):
                row = {"op": op, "shape": case.label(shape), "sweep_value": shape["N"],
                       "standard": shape == case.shapes[0], "path": path, "dtype": "bfloat16",
                       "status": "ok", "fwd_ms": 0.07 * (1 + i), "fwd_grad_ms": 0.08,
                       "bwd_ms": 0.1 * (1 + i), "fwdbwd_ms": 0.2 * (1 + i),
                       "peak_extra_gib": 0.1, "note": ""}
                rows.append(K.add_rates(row, case.traffic(shape, BF16), None, copy_bw, mm))
    for op in ("swiglu", "geglu", "rope"):
        case = K.CASES[op]
        for path in K.PATHS:
            row = {"op": op, "shape": case.label(case.shapes[0]), "sweep_value": None,
                   "standard": True, "path": path, "status": "ok", "fwd_ms": 0.2,
                   "bwd_ms": 0.3, "fwdbwd_ms": 0.5, "fwd_kernels": 1, "fwdbwd_kernels": 2}
            rows.append(K.add_rates(row, case.traffic(case.shapes[0], BF16), None, copy_bw, mm))
    ce = K.CASES["cross_entropy"]
    for shape, ms in zip(ce.shapes, (1.0, 2.1)):
        row = {"op": "cross_entropy", "shape": ce.label(shape), "sweep_value": shape["V"],
               "standard": shape == ce.shapes[0], "path": "liger-aot", "status": "ok",
               "fwd_ms": ms / 2, "fwdbwd_ms": ms}
        rows.append(K.add_rates(row, ce.traffic(shape, BF16), None, copy_bw, mm))
    rows.append({"op": "cross_entropy", "shape": ce.label(ce.shapes[0]), "sweep_value": 128256,
                 "standard": True, "path": "liger-kernel", "status": "check failed",
                 "note": "AssertionError: mismatch"})
    flce = K.CASES["fused_linear_cross_entropy"]
    row = {"op": "fused_linear_cross_entropy", "shape": flce.label(flce.shapes[0]),
           "sweep_value": None, "standard": True, "path": "liger-aot", "status": "ok",
           "fwd_ms": 13.0, "fwdbwd_ms": 43.5, "peak_extra_gib": 0.25}
    rows.append(K.add_rates(row, flce.traffic(flce.shapes[0], BF16),
                            flce.flops(flce.shapes[0]), copy_bw, mm))
    return rows


def test_csv_round_trip(tmp_path):
    rows = _fake_rows()
    path = tmp_path / "kernels.csv"
    K.write_csv(rows, str(path))
    with open(path, newline="") as f:
        back = list(csv.DictReader(f))
    assert tuple(back[0]) == K.COLUMNS
    assert len(back) == len(rows)
    first = back[0]
    assert first["op"] == "rms_norm" and first["path"] == "liger-aot"
    assert float(first["fwd_bytes"]) == 2 * 16384 * 4096 * 2
    assert float(first["fwd_pct_copy"]) == pytest.approx(
        100 * 2 * 16384 * 4096 * 2 / 0.07e-3 / 4.3e12, rel=1e-5)
    failed = next(r for r in back if r["status"] == "check failed")
    assert failed["fwd_ms"] == "" and "mismatch" in failed["note"]
    flce = next(r for r in back if r["op"] == "fused_linear_cross_entropy")
    assert float(flce["fwdbwd_tflops"]) == pytest.approx(3 * 2 * 8192 * 4096 * 128256 / 43.5e-3
                                                         / 1e12, rel=1e-5)


def test_table_rows():
    header = K.table_header()
    for word in ("fwd ms", "bwd ms", "f+b ms", "fwd%cp", "TFLOP/s", "peakGiB", "status"):
        assert word in header
    rows = _fake_rows()
    lines = [K.format_row(r) for r in rows]
    assert all(line.split()[0] == r["op"][:26] for line, r in zip(lines, rows))
    failed = next(line for line, r in zip(lines, rows) if r["status"] == "check failed")
    assert "check failed: AssertionError: mismatch" in failed and " - " in failed


def test_targets():
    lines = K.evaluate_targets(_fake_rows())
    text = "\n".join(lines)
    assert "rms_norm forward >= 90% of copy" in text
    # fabricated: liger-aot fwd at 0.07 ms is 178% of copy (pass); eager at half that rate
    # with bwd 2x slower fails the 80% backward target at every N
    bwd = next(line for line in lines if line.startswith("rms_norm backward"))
    assert "liger-aot min" in bwd and "PASS" in bwd and "FAIL" in bwd
    assert "cross_entropy fwd+bwd V 128256 -> 256000 (linear: x2.00): liger-aot 1.000 -> " \
           "2.100 ms (x2.10)" in text
    assert "fused_linear_cross_entropy 8192x4096->128256 liger-aot: fwd+bwd 43.50 ms" in text
    assert "rope GPU kernels per call (fwd / fwd+bwd, torch.profiler): liger-aot 1 / 2" in text
    assert K.evaluate_targets([]) == []


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    files = K.write_plots(_fake_rows(), str(tmp_path))
    names = sorted(os.path.basename(f) for f in files)
    assert names == ["kernels.png", "kernels_fused_add_rms_norm_sweep.png",
                     "kernels_layer_norm_sweep.png", "kernels_rms_norm_sweep.png"]
    for f in files:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_smoke_end_to_end(tmp_path):
    """The whole script on the CPU: tiny shapes, liger-aot through Triton's interpreter and
    eager, each checked against the fp32 reference, then 'timed'."""
    rows = K.main(["--smoke", "--quick", "--ops", "rms_norm,rope,cross_entropy",
                   "--paths", "liger-aot,eager,liger-kernel", "--out", str(tmp_path)])
    by_path = {(r["op"], r["path"]): r for r in rows}
    for op in ("rms_norm", "rope", "cross_entropy"):
        for path in ("liger-aot", "eager"):
            r = by_path[(op, path)]
            assert r["status"] == "ok", r
            assert r["max_rel_err"] < 2e-2
            assert all(r[k] > 0 for k in ("fwd_ms", "fwd_grad_ms", "bwd_ms", "fwdbwd_ms"))
        assert by_path[(op, "liger-kernel")]["status"] in ("ok", "n/a", "check failed")
    assert (tmp_path / "kernels.csv").exists()
    assert (tmp_path / "kernels_targets.txt").read_text().startswith("rms_norm")


def _smoke_lines(name: str) -> tuple:
    """(script path, env, stdout lines) of `benchmarks/<name> --smoke`, which must succeed
    (the script sets TRITON_INTERPRET itself: the env leaves it unset)."""
    script = os.path.join(ROOT, "benchmarks", name)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, script, "--smoke"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return script, env, done.stdout.strip().splitlines()


def test_norm_forward_pass1_experiment_smoke():
    """benchmarks/experiment_norm_fwd_pass1.py --smoke: its minimal looped forwards (pass 1 by
    chunks, by the whole row, by the whole row in a loop, with w and b under the default L2
    policy, and with pass 2 in static trips) through Triton's interpreter match torch (the
    script asserts it) for LayerNorm and RMSNorm; a malformed --tiles is refused with a
    usage error."""
    script, env, lines = _smoke_lines("experiment_norm_fwd_pass1.py")
    assert len(lines) == 2 * 5 and all("rel. error" in line for line in lines), lines
    assert sum("static trips" in line for line in lines) == 2, lines
    bad = subprocess.run([sys.executable, script, "--sass", "--tiles", "4096x3"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert bad.returncode == 2 and "warps 1-32" in bad.stderr, bad.stderr[-2000:]


def test_experiment_ce_staged_arguments():
    """benchmarks/experiment_ce_staged.py refuses a negative --buffers with a usage error,
    and --compile-only reports the library's config within what its grid assumes (sm90
    ptxas here: registers, stack, shared memory, and that its programs an SM fit)."""
    script = os.path.join(ROOT, "benchmarks", "experiment_ce_staged.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bad = subprocess.run([sys.executable, script, "--buffers", "-1"], capture_output=True,
                         text=True, timeout=600, env=env)
    assert bad.returncode == 2 and "--buffers must be >= 0" in bad.stderr, bad.stderr[-2000:]
    done = subprocess.run([sys.executable, script, "--compile-only", "--configs",
                           "1024,8,8,4,10,48"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stack 0 B" in done.stdout and "10 an SM fit" in done.stdout, done.stdout


def test_experiment_norm_grouped_config_fields():
    """The grouped experiments' configs take trailing NAME=INT fields (more constexprs of the
    kernel) and refuse any other trailing field by name; --compile-only reports a plain config
    (sm90 ptxas here)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for name, config in (("experiment_norm_fwd_grouped.py", "2048,3,2,10,96"),
                         ("experiment_norm_bwd_staged.py", "2048,3,4,6,80,1")):
        script = os.path.join(ROOT, "benchmarks", name)
        bad = subprocess.run([sys.executable, script, "--op", "layer_norm", "--compile-only",
                              "--configs", config + ",EARLY"], capture_output=True, text=True,
                             timeout=600, env=env)
        assert bad.returncode == 1 and "'EARLY' is not NAME=INT" in bad.stderr, bad.stderr[-2000:]
        done = subprocess.run([sys.executable, script, "--op", "layer_norm", "--compile-only",
                               "--configs", config], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"{config}: regs" in done.stdout and "fits" in done.stdout, done.stdout


def test_experiment_norm_fwd_held_row_arguments():
    """benchmarks/experiment_norm_fwd_held_row.py refuses bad --cases by name and says when
    there is no GPU to time on; --compile-only reports sm90 registers, no stack and programs
    an SM for the table's config and each held row (the kernel's math: the HOLD_ROW cases of
    test_norm_looped_forward.py)."""
    script = os.path.join(ROOT, "benchmarks", "experiment_norm_fwd_held_row.py")
    _assert_refuses(script, ((["--cases", "1000:2"], "N must be a power of two from 1024"),
                             (["--cases", "1024"], "'1024' is not N:warps"),
                             (["--cases", "1024:32"], "8-64 columns a thread"),
                             (["--rounds", "0"], "--rounds must be at least 1"),
                             (["--cases", "1024:2"], "no CUDA device")))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, script, "--compile-only", "--cases", "1024:2,4"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and "table" in lines[0] and "PASS1_BLOCK=1024" in lines[0], lines
    for line, warps in zip(lines[1:], (2, 4)):
        assert re.search(rf"held +{warps} warps: regs +\d+, stack 0 B, [1-9]\d* programs an SM",
                         line), line


def test_experiment_norm_fwd_held_row_candidate_table(tmp_path):
    """--candidate-table's choice (benchmarks/held_row_run.sh A/Bs it): a row length takes its
    fastest held config only where that config's median is at least 1% under the table
    config's, a failed round (NaN) never wins, and the table written loads, with only the
    chosen buckets' configs changed and their other lengths' records kept; where nothing
    wins, nothing is written."""
    import json

    from liger_aot.kernel_src import tuning

    held = load_benchmark("experiment_norm_fwd_held_row")
    configs = held.configs_of(held.parse_cases("1024:1,2;8192:16;16384:32"))
    table_1k, w1, w2 = (c for _, c in configs[1024])
    table_8k, w16 = (c for _, c in configs[8192])
    table_16k, w32 = (c for _, c in configs[16384])
    times = {(1024, table_1k.tag): [1.0, 1.0, 1.2], (1024, w1.tag): [0.985, 0.99, 0.5],
             (1024, w2.tag): [0.95, float("nan"), 0.9],  # failed once: never chosen
             (8192, table_8k.tag): [2.0, 2.0], (8192, w16.tag): [1.99, 1.985],  # 0.6% less
             (16384, table_16k.tag): [4.0, 4.1], (16384, w32.tag): [3.8, 3.9]}
    chosen = held.candidate_configs(configs, times)
    assert {n: c.tag for n, (c, _, _) in chosen.items()} == {1024: w1.tag, 16384: w32.tag}
    assert chosen[1024][1:] == pytest.approx((1.0, 0.985))
    assert chosen[16384][1:] == pytest.approx((4.05, 3.85))

    path = tmp_path / "sm90-held.json"
    held.write_candidate(str(path), configs, times)
    _, before = tuning.read_table(tuning.table_path("sm90"), "sm90")
    _, after = tuning.read_table(str(path), "sm90")
    spec = held.ln_spec.FWD.name
    for name in before["specs"]:
        for bucket, entry in before["specs"][name].items():
            new = after["specs"][name][bucket]
            if name == spec and bucket in ("n_cols=1024", "n_cols=16384"):
                assert new["config"] != entry["config"]
                assert new["inexact"] == entry["inexact"]
                config = tuning.config_from_record(held.ln_spec.FWD, new["config"])
                assert config.tag == (w1 if bucket == "n_cols=1024" else w32).tag
            else:
                assert new == entry, (name, bucket)
    assert json.loads(path.read_bytes()) == after

    nothing = tmp_path / "none.json"
    held.write_candidate(str(nothing), {8192: configs[8192]}, times)
    assert not nothing.exists()


def test_experiment_norm_fwd_body_arguments_and_kernels():
    """benchmarks/experiment_norm_fwd_body.py refuses bad --cases by name and says when there
    is no GPU; each of its kernel's variants computes LayerNorm (the interpreter, against fp32
    torch, the statistics where it stores them); --compile-only reports each variant's sm90
    registers and SASS instructions."""
    script = os.path.join(ROOT, "benchmarks", "experiment_norm_fwd_body.py")
    _assert_refuses(script, ((["--cases", "1000:1"], "N must be a power of two from 256"),
                             (["--cases", "1024"], "'1024' is not N:warps"),
                             (["--cases", "1024:32"], "8-64 columns a thread"),
                             (["--rounds", "0"], "--rounds must be at least 1"),
                             (["--cases", "1024:1"], "no CUDA device")))
    body = load_benchmark("experiment_norm_fwd_body")
    m, n = 5, 256
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(m, n, generator=gen) + 3.0).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)
    b = (0.1 * torch.randn(n, generator=gen)).to(torch.bfloat16)
    ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), body.EPS)
    for name, two_pass, stats, static in body.VARIANTS:
        y = torch.zeros_like(x)
        mean, rstd = torch.full((m,), -1.0), torch.full((m,), -1.0)
        body.layer_norm_row[(m,)](y, x, w, b, mean, rstd, x.stride(0), body.EPS,
                                  **body.kernel_args(n, two_pass, stats, static), num_warps=1)
        assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2, name
        if stats:
            var = x.float().var(1, unbiased=False)
            assert torch.allclose(mean, x.float().mean(1), atol=1e-5), name
            assert torch.allclose(rstd, (var + body.EPS).rsqrt(), rtol=1e-4), name
        else:
            assert (mean == -1).all() and (rstd == -1).all(), name
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, script, "--compile-only", "--cases", "1024:2"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(body.VARIANTS), lines
    for line, (name, *_) in zip(lines, body.VARIANTS):
        assert re.search(rf"N  1024  2 warps {name} *: regs +\d+, stack \d+ B, [1-9]\d+ SASS "
                         "instructions", line), line


def test_experiment_norm_size_arguments():
    """benchmarks/experiment_norm_size.py names a bad op, timer or path before looking for
    a GPU, and says so when there is none."""
    script = os.path.join(ROOT, "benchmarks", "experiment_norm_size.py")
    _assert_refuses(script, ((["--ops", "swiglu"], "'swiglu' is not a norm case"),
                             (["--timers", "suite,warm"], "'warm' is not one of suite, clean"),
                             (["--paths", "eager"], "'eager' is not one of liger-aot"),
                             ([], "no CUDA device")))


def _assert_refuses(script: str, cases):
    """Each (args, words) of `cases`: the script exits non-zero, saying `words`."""
    for args, words in cases:
        done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode != 0 and words in done.stderr, (args, done.stderr[-2000:])


def test_experiment_norm_size_fit_recovers_a_line():
    """The fixed-cost split: timings made from a known line (fixed 7 us, 4.3 TB/s) at three
    sizes give that line back; one size, a failed timing and copy_ give no fit."""
    size = load_benchmark("experiment_norm_size")
    ceiling, fixed, rate = 4.27e12, 7e-6, 4.3e12

    def row(k, op, n, ms, status="ok", path="liger-aot"):
        return {"log2_elements": k, "timer": "suite", "op": op, "n": n, "path": path,
                "status": status, "ms": ms}

    records = [row(k, "rms_norm", 4096, (fixed + 4 * 2**k / rate) * 1e3) for k in (24, 26, 28)]
    records += [row(k, "fused_add_rms_norm", 4096, (fixed + 8 * 2**k / rate) * 1e3)
                for k in (26, 28)]
    records += [row(26, "layer_norm", 4096, 0.07),  # one size only
                row(26, "copy_", "", 0.068, path=""), row(28, "copy_", "", 0.4, path=""),
                row(26, "rms_norm", 4096, math.nan, "wrong: rel. error 1e-1", "torch.compile"),
                row(28, "rms_norm", 4096, 0.3, path="torch.compile")]
    fits = {f["op"]: f for f in size.fit_fixed_and_rate(records, ceiling)}
    assert set(fits) == {"rms_norm", "fused_add_rms_norm"}
    for op, per_element in (("rms_norm", 4), ("fused_add_rms_norm", 8)):
        f = fits[op]
        assert f["fixed_us"] == pytest.approx(7.0) and f["rate_tbps"] == pytest.approx(4.3)
        suite_bytes = per_element * 2**26
        assert f["suite_size_pct_of_copy"] == pytest.approx(
            100 * suite_bytes / (fixed + suite_bytes / rate) / ceiling)
        # at the fixed cost it names, 2^26 elements read exactly 90% of the ceiling
        t = f["fixed_us_for_target"] * 1e-6 + suite_bytes / rate
        assert suite_bytes / t / ceiling == pytest.approx(0.90)
    assert fits["rms_norm"]["sizes"] == 3
    assert any("7.00us" in line for line in size.fit_lines(list(fits.values())))


def test_experiment_norm_size_refits_a_committed_run(tmp_path):
    """--fit needs no GPU: session 23's H200 run, split again (numbers in perf-notes)."""
    script = os.path.join(ROOT, "benchmarks", "experiment_norm_size.py")
    run = os.path.join(ROOT, "docs", "results", "2026-12-04-norm-size-timers-session23-h200.csv")
    done = subprocess.run([sys.executable, script, "--fit", run, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ceiling (2 GiB copy) 4.27 TB/s" in done.stdout
    line = next(l for l in done.stdout.splitlines()
                if l.split()[:4] == ["suite", "rms_norm", "8192", "liger-aot"])
    assert "7.34us" in line and "4.37TB/s" in line and "91.3%" in line
    with open(tmp_path / "norm_size_fit.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 128  # 2 timers x (neg + 3 ops x 7 N x 3 paths)
    bad = tmp_path / "bad.csv"
    bad.write_text("log2_elements,timer,op,n,path,status,ms,pct_of_2gib_copy\n")
    _assert_refuses(script, ((["--fit", str(bad)], "no neg rows"),))


def test_experiment_norm_timeline_analysis():
    """The timeline of one launch from fabricated stamps (ns): two SMs, two programs each."""
    timeline = load_benchmark("experiment_norm_timeline")
    start, end, sm = [0, 10, 1, 11], [10, 20, 11, 15], [0, 0, 1, 1]
    a = timeline.analyze(start, end, sm)
    assert (a["programs"], a["peak_in_flight"]) == (4, 2)
    assert a["span_us"] == pytest.approx(0.020)
    assert a["ramp_us"] == pytest.approx(0.001)  # both in flight from t = 1
    assert a["tail_us"] == pytest.approx(0.005)  # one left from t = 15 (the dips at 10 and
    # 11, an end and a start at the same time, do not end the plateau)
    assert a["idle_end_us"] == pytest.approx(0.0025)  # SM 1 idle 5 ns at the end, SM 0 none
    assert a["idle_start_us"] == pytest.approx(0.0005)
    assert a["program_us"] == pytest.approx(0.010)  # median of 10, 10, 10, 4
    assert a["resolution_ns"] == 1
    med = timeline.median_of([a, {**a, "span_us": 1.0}, {**a, "span_us": 2.0}])
    assert med["span_us"] == 1.0 and med["ramp_us"] == a["ramp_us"]


def test_experiment_norm_timeline_reads_config_tags():
    """--alternatives reads the tuned table's refined tags back into configs: every tag of
    the norm forwards' entries round-trips; a chosen config is not its own alternative."""
    timeline = load_benchmark("experiment_norm_timeline")
    _, table = timeline.tuning.load_table("sm90")
    tags = {c["tag"] for spec in ("rms_norm_fwd", "layer_norm_fwd")
            for entry in table["specs"][spec].values()
            for c in entry.get("refined", {}).get("configs", [])}
    assert len(tags) > 20
    for tag in tags:
        assert timeline.config_from_tag(tag).tag == tag
    config = timeline.config_from_tag("BLOCK_M=2.BLOCK_N=512.LOOP=True.w2.s1")
    assert (config.constexprs, config.num_warps) == ({"BLOCK_M": 2, "BLOCK_N": 512,
                                                      "LOOP": True}, 2)
    for bad in ("BLOCK_M=2.w2", "BLOCK_M=x.w2.s1", "BLOCK_M=2.q.w2.s1", "B=1.A=2.w1.s1"):
        with pytest.raises(ValueError, match="config tag"):
            timeline.config_from_tag(bad)
    for op in ("rms_norm", "layer_norm"):
        others = timeline.alternatives(op, 1024)
        assert others and timeline.op_config(op, 1024).tag not in {c.tag for c in others}


def test_experiment_norm_timeline_names_the_ops_kernel(monkeypatch):
    """op_kernel asks each op's own routing which forward it runs on the case's inputs (on a
    CPU, never the grouped one); where the op would take the grouped kernel it says so."""
    import torch
    from liger_aot.ops import layer_norm, rms_norm

    timeline = load_benchmark("experiment_norm_timeline")
    t = {"x": torch.ones(4, 65536, dtype=torch.bfloat16), "w": torch.ones(65536),
         "b": torch.zeros(65536)}
    assert timeline.op_kernel("rms_norm", t) == timeline.op_kernel("layer_norm", t) == "looped"
    seen = []
    monkeypatch.setattr(rms_norm, "grouped_forward_applies", lambda x, w: seen.append(2) or True)
    monkeypatch.setattr(layer_norm, "grouped_forward_applies",
                        lambda x, w, b: seen.append(3) or b is t["b"])
    assert [timeline.op_kernel(op, t) for op in ("rms_norm", "layer_norm")] == ["grouped"] * 2
    assert seen == [2, 3]


def test_experiment_norm_timeline_compiles_for_sm90():
    """--compile-only: each stamped wrapper of the table's configs compiles for sm90 next to
    its plain kernel, at the plain kernel's registers, with no local memory and no stack
    (where spills go) of its own; bad arguments are refused first."""
    script = os.path.join(ROOT, "benchmarks", "experiment_norm_timeline.py")
    done = subprocess.run([sys.executable, script, "--compile-only", "--ns", "1024,32768"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [l for l in done.stdout.splitlines() if l.startswith(("rms_norm", "layer_norm"))]
    assert len(lines) == 4
    for line in lines:
        plain, stamped = line.split("plain ")[1].split("; stamped at maxnreg ")
        regs = int(stamped.split(":")[0])
        assert plain.startswith(f"{regs} registers, 0 B local, 0 B stack"), line
        stamped = stamped.split(": ")[1]
        assert int(stamped.split()[0]) <= regs and " 0 B local, 0 B stack" in stamped, line
    _assert_refuses(script, ((["--ops", "swiglu"], "'swiglu' is not one of"),
                             (["--ns", "1000"], "must divide 2^26"),
                             (["--repeats", "0"], "at least 1"),
                             ([], "no CUDA device")))


def _device_script_refuses(script: str, out, budget: str, cases) -> dict:
    """A device-call shell script: each (args, words) of `cases` with OUT set to `out`, and
    `budget` alone without OUT, exits 2 saying `words` ("OUT is not set" for the last).
    Returns the environment without OUT."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    for args, extra, words in [(args, {"OUT": str(out)}, words) for args, words in cases] + [
            ([budget], {}, "OUT is not set")]:
        done = subprocess.run(["bash", script, *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    return env


def test_norm_fixed_cost_run_without_a_gpu(tmp_path):
    """benchmarks/norm_fixed_cost_run.sh (one device call of the fixed-cost experiments):
    refuses a bad budget and a missing OUT; without a GPU each step says so in its log, a
    missing base table skips the A/B, and the logs come back in one archive."""
    import tarfile
    script = os.path.join(ROOT, "benchmarks", "norm_fixed_cost_run.sh")
    env = _device_script_refuses(script, tmp_path, "30", ((["abc"], "must be a whole number"),))
    done = subprocess.run(["bash", script, "60", str(tmp_path / "none.json")],
                          env={**env, "OUT": str(tmp_path)}, capture_output=True, text=True,
                          timeout=300)
    assert "compare_tables: skipped, no base table" in done.stdout, done.stdout
    with tarfile.open(tmp_path / "norm_fixed_cost.tgz") as archive:
        logs = {os.path.basename(m.name): archive.extractfile(m).read().decode()
                for m in archive.getmembers() if m.name.endswith(".log")}
    assert sorted(logs) == ["size.log", "timeline.log"]
    assert all("no CUDA device" in text for text in logs.values()), logs


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script tunes the "
                    "checkout's table in place")
def test_norm_retune_run_without_a_gpu(tmp_path):
    """benchmarks/norm_retune_run.sh (the norm re-tune, compare_tables and the GPU tests as
    one device call): refuses bad arguments and a missing OUT; without a GPU the tune says
    so in its log, a short budget gives the tune its floor of 30 s and skips compare_tables,
    the GPU tests skip, and the table before and after (unchanged) come back in one
    archive."""
    import tarfile
    script = os.path.join(ROOT, "benchmarks", "norm_retune_run.sh")
    env = _device_script_refuses(script, tmp_path, "60", (
        (["abc"], "must be a whole number"), (["60", "4096,x"], "row lengths"),
        (["60", "4096", "5120", "rms norm"], "spec names")))
    done = subprocess.run(["bash", script, "60"], env={**env, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert "compare_tables: skipped, the budget is spent" in done.stdout, done.stdout
    # a budget that leaves compare_tables less than its share gives the tune its 30 s floor
    assert re.search(r"== tune \(\S+, 30 s at most\)", done.stdout), done.stdout
    with tarfile.open(tmp_path / "norm_retune.tgz") as archive:
        files = {os.path.basename(m.name): archive.extractfile(m).read()
                 for m in archive.getmembers() if m.isfile()}
    assert "torch sees no GPU" in files["tune.log"].decode()
    assert " skipped" in files["gpu_tests.log"].decode() and "failed" not in files[
        "gpu_tests.log"].decode()
    with open(os.path.join(ROOT, "kernel_src", "tuned", "sm90.json"), "rb") as f:
        assert files["sm90-before.json"] == files["sm90.json"] == f.read()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the script times and builds")
def test_held_row_run_without_a_gpu(tmp_path):
    """benchmarks/held_row_run.sh (the held-row experiment, its A/B and tests, and two
    grouped-forward trials as one device call): refuses a bad budget and a missing OUT;
    without a GPU the experiment says so and writes no candidate, so the A/B and the GPU
    tests skip, saying why; both trials' patches still apply to this checkout (their steps
    run two rounds), and the logs come back in one archive."""
    import tarfile
    script = os.path.join(ROOT, "benchmarks", "held_row_run.sh")
    env = _device_script_refuses(script, tmp_path, "60", ((["abc"], "must be a whole number"),))
    done = subprocess.run(["bash", script, "120"], env={**env, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=300)
    assert "== compare_tables: skipped, no candidate table" in done.stdout, done.stdout
    assert "== gpu_tests: skipped, no build of a candidate table" in done.stdout, done.stdout
    with tarfile.open(tmp_path / "held_row.tgz") as archive:
        logs = {os.path.basename(m.name): archive.extractfile(m).read().decode()
                for m in archive.getmembers() if m.name.endswith(".log")}
    assert sorted(logs) == ["held_row.log", "no_exchange.log", "w_fp32.log"], done.stdout
    assert "no CUDA device" in logs["held_row.log"]
    for trial in ("no_exchange", "w_fp32"):
        assert logs[f"{trial}.log"].count("== round") == 2, logs[f"{trial}.log"]


def test_norm_sweep_run_refusals_and_archive(tmp_path):
    """benchmarks/norm_sweep_run.sh (build, the norm sweep and the GPU tests as one device
    call): refuses bad arguments and a missing OUT; a budget too short for any step skips
    each, saying so, and the archive still comes back."""
    import tarfile
    script = os.path.join(ROOT, "benchmarks", "norm_sweep_run.sh")
    env = _device_script_refuses(script, tmp_path, "60", (
        (["abc"], "must be a whole number"), (["60", "liger aot"], "suite paths")))
    done = subprocess.run(["bash", script, "5", "liger-aot"], env={**env, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    for name in ("build", "suite", "gpu_tests"):
        assert f"== {name}: skipped, the budget is spent" in done.stdout, done.stdout
    with tarfile.open(tmp_path / "norm_sweep.tgz") as archive:
        assert "norm_sweep/gpu.txt" in archive.getnames()


def test_experiment_rope_smoke_and_arguments():
    """benchmarks/experiment_rope.py --smoke: every candidate kernel (the library's looped and
    whole-position kernels, the probes, one in place) through Triton's interpreter matches
    fp32 RoPE and its adjoint (the script asserts it); bad --configs and --shape are refused
    with their reasons, and a GPU run without one says so."""
    script, env, lines = _smoke_lines("experiment_rope.py")
    assert len(lines) == 2 * 10 and all("rel. error" in line for line in lines), lines
    for args, words in ((["--configs", "lib:8,64"], "lib takes 3 integers"),
                        (["--configs", "whole:12,2,32,1"], "must be powers of 2"),
                        (["--configs", "liger@"], "liger is always in place"),
                        (["--configs", "fast:1"], "kind must be"),
                        (["--shape", "4,32,8,4096"], "five positive integers"),
                        (["--shape", "1,2,1,8,15"], "head_dim must be even"),
                        ([], "needs a CUDA GPU")):
        bad = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                             timeout=600, env=env)
        assert bad.returncode != 0 and words in bad.stderr, (args, bad.stderr[-2000:])


def test_host_microbench_runs_its_cases():
    """benchmarks/host_microbench.py (driver stubbed, CPU) times the launch path, the GLU ops
    and RoPE's op against Hugging Face's formula: every case prints a positive time."""
    script = os.path.join(ROOT, "benchmarks", "host_microbench.py")
    cases = ["launcher", "kernel_rms", "swiglu_fwdbwd", "rope_fwdbwd", "eager_rope_fwdbwd"]
    done = subprocess.run([sys.executable, script, "--cases", ",".join(cases), "--repeat",
                           "2", "--number", "20"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    times = {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines()[2:]}
    assert set(times) == set(cases) and all(t > 0 for t in times.values()), done.stdout


def test_on_card_runs_only_on_the_named_card(tmp_path):
    """benchmarks/on_card.sh: runs its command where nvidia-smi's card name contains NAME
    (case-insensitive), exits 3 naming the card otherwise or where no card answers, and 2
    without a command."""
    script = os.path.join(ROOT, "benchmarks", "on_card.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    (fake / "nvidia-smi").chmod(0o755)
    with_card = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    no_card = {**os.environ, "PATH": str(tmp_path / "empty")}

    def run(args, env):
        return subprocess.run(["/bin/bash", script, *args], env=env, capture_output=True,
                              text=True, timeout=60)
    done = run(["h200", "echo", "ran"], with_card)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "ran", done
    done = run(["H100", "echo", "ran"], with_card)
    assert done.returncode == 3 and "ran" not in done.stdout and "'NVIDIA H200'" in done.stdout
    done = run(["H200", "echo", "ran"], no_card)
    assert done.returncode == 3 and "no NVIDIA GPU" in done.stderr, done
    done = run(["H200"], with_card)
    assert done.returncode == 2 and "usage" in done.stderr, done
