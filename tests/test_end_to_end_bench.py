"""benchmarks/end_to_end.py without a GPU: config builders, argument parsing, wall-time
estimates, child environments, the tables / CSV / JSON on fabricated child results, and one
tiny CPU run of the whole parent -> child flow (HF mode only: seconds)."""
import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from _scripts import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "end_to_end.py")


@pytest.fixture(scope="module")
def e2e():
    return load_benchmark("end_to_end")


# -- configs ---------------------------------------------------------------------------------

def _theta(config):
    params = getattr(config, "rope_parameters", None)
    return params["rope_theta"] if params else config.rope_theta


def test_llama3_8b_config(e2e):
    c = e2e.build_config("llama3_8b")
    assert c.model_type == "llama"
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.vocab_size, c.num_hidden_layers) == (4096, 14336, 32, 8, 128256, 4)
    assert c.head_dim == 128 and c.rms_norm_eps == 1e-5 and _theta(c) == 500000.0
    assert not c.tie_word_embeddings and c.use_cache is False
    assert c._attn_implementation == "sdpa"
    assert e2e.shape("llama3_8b", tiny=False) == (4, 2048)


def test_qwen2_5_0_5b_config(e2e):
    c = e2e.build_config("qwen2_5_0_5b")
    assert c.model_type == "qwen2"
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.vocab_size, c.num_hidden_layers) == (896, 4864, 14, 2, 151936, 24)
    assert c.tie_word_embeddings and _theta(c) == 1e6 and c.rms_norm_eps == 1e-6
    assert c._attn_implementation == "sdpa"
    assert e2e.shape("qwen2_5_0_5b", tiny=False) == (8, 2048)


def test_gemma2_2b_config(e2e):
    c = e2e.build_config("gemma2_2b")
    assert c.model_type == "gemma2"
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.vocab_size, c.num_hidden_layers) == (2304, 9216, 8, 4, 256, 256000, 26)
    assert (c.final_logit_softcapping, c.attn_logit_softcapping) == (30.0, 50.0)
    assert c.query_pre_attn_scalar == 256 and c.sliding_window == 4096
    assert c.hidden_activation == "gelu_pytorch_tanh" and c.tie_word_embeddings
    assert c._attn_implementation == "eager"
    assert e2e.shape("gemma2_2b", tiny=False) == (4, 2048)


@pytest.mark.parametrize("name,low,high", [("llama3_8b", 1.90e9, 1.95e9),
                                           ("qwen2_5_0_5b", 0.48e9, 0.50e9),
                                           ("gemma2_2b", 2.60e9, 2.63e9)])
def test_parameter_counts_on_meta(e2e, name, low, high):
    """The published sizes (Qwen2.5-0.5B 494M, Gemma-2-2B 2.61B; Llama-3-8B with 4 of its 32
    layers 1.92B), built on the meta device: no memory, no init."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(e2e.build_config(name), dtype=torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert low < count < high, count


def test_overrides_and_tiny(e2e):
    kw = e2e.config_kwargs("llama3_8b", overrides={"num_hidden_layers": 2})
    assert kw["num_hidden_layers"] == 2 and kw["hidden_size"] == 4096
    c = e2e.build_config("gemma2_2b", tiny=True)
    assert (c.hidden_size, c.num_hidden_layers, c.head_dim, c.vocab_size) == (64, 2, 16, 512)
    assert c.final_logit_softcapping == 30.0  # features kept, sizes shrunk
    assert e2e.shape("gemma2_2b", tiny=True) == e2e.TINY_SHAPE
    assert e2e.shape("gemma2_2b", tiny=True, batch=3) == (3, e2e.TINY_SHAPE[1])


@pytest.mark.parametrize("name", ["llama3_8b", "qwen2_5_0_5b", "gemma2_2b"])
def test_tiny_models_train_a_step(e2e, name):
    from transformers import AutoModelForCausalLM

    config = e2e.build_config(name, tiny=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).train()
    ids = e2e.make_batches(1, 2, 16, config.vocab_size, seed=0, kind="counting")[0]
    assert ids.shape == (2, 16) and int(ids.max()) < config.vocab_size
    assert torch.equal((ids[:, 1:] - ids[:, :-1]) % config.vocab_size, torch.ones(2, 15).long())
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_batches_are_seeded(e2e):
    a = e2e.make_batches(3, 2, 8, 100, seed=0, kind="random")
    b = e2e.make_batches(3, 2, 8, 100, seed=0, kind="random")
    assert torch.equal(a, b) and a.shape == (3, 2, 8)


# -- arguments, estimates, environments ------------------------------------------------------

def test_parse_args_defaults(e2e):
    a = e2e.parse_args([])
    assert a.models == ["llama3_8b", "qwen2_5_0_5b", "gemma2_2b"]
    assert a.modes == ["hf", "liger-aot", "liger-kernel"]
    assert (a.steps, a.warmup, a.device, a.tiny) == (10, 2, "cuda", False)
    assert len(e2e.plan(a)) == 9


def test_parse_args_order_tiny_and_overrides(e2e):
    a = e2e.parse_args(["--modes", "liger-kernel-warm,liger-aot,hf,liger-kernel", "--models",
                        "gemma2_2b", "--set", "num_hidden_layers=2", "--set", "x=abc"])
    assert a.modes == ["hf", "liger-aot", "liger-kernel", "liger-kernel-warm"]
    assert a.overrides == {"num_hidden_layers": 2, "x": "abc"}
    t = e2e.parse_args(["--device", "cpu", "--tiny", "--modes", "hf,liger-aot"])
    assert (t.steps, t.warmup) == (e2e.TINY_STEPS, e2e.TINY_WARMUP)
    assert e2e.parse_args(["--steps", "0"]).steps == 0


@pytest.mark.parametrize("argv", [["--models", "gpt2"], ["--modes", "hf,torch"],
                                  ["--device", "cpu", "--modes", "hf,liger-kernel"],
                                  ["--steps", "-1"], ["--set", "novalue"],
                                  ["--cold-repeats", "0"]])
def test_parse_args_rejects(e2e, argv):
    with pytest.raises(SystemExit):
        e2e.parse_args(argv)


def test_help_runs():
    proc = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "liger-kernel-warm" in proc.stdout


def test_default_run_fits_the_budget(e2e):
    a = e2e.parse_args([])
    total = sum(e2e.estimate_s(m, mode, a) for m, mode in e2e.plan(a)) + e2e.PREWARM_ESTIMATE_S
    assert 120 < total < 8 * 60
    fewer = e2e.parse_args(["--steps", "2"])
    assert sum(e2e.estimate_s(m, mode, fewer) for m, mode in e2e.plan(fewer)) < total


def test_child_env(e2e, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("LIGER_AOT_STRICT", "1")
    aot = e2e.child_env("liger-aot", "cuda", "/tmp/c1")
    assert aot["LIGER_AOT_STRICT"] == "1" and aot["TRITON_CACHE_DIR"] == "/tmp/c1"
    assert "TRITON_INTERPRET" not in aot and aot["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    lk = e2e.child_env("liger-kernel", "cuda", "/tmp/c2")
    assert "LIGER_AOT_STRICT" not in lk and lk["TRITON_CACHE_DIR"] == "/tmp/c2"
    assert e2e.child_env("hf", "cpu", "/tmp/c3")["TRITON_INTERPRET"] == "1"
    a = e2e.parse_args(["--block-triton"])
    assert e2e.child_spec("llama3_8b", "liger-aot", a)["block_triton"]
    assert not e2e.child_spec("llama3_8b", "hf", a)["block_triton"]


def test_cold_repeats_plan_and_estimate(e2e):
    a = e2e.parse_args(["--cold-repeats", "3", "--models", "qwen2_5_0_5b"])
    q = "qwen2_5_0_5b"
    assert e2e.repeat_plan(a) == [(q, "hf", 1), (q, "liger-aot", 1), (q, "hf", 2),
                                  (q, "liger-aot", 2)]
    assert e2e.repeat_plan(e2e.parse_args(["--modes", "hf,liger-kernel", "--cold-repeats",
                                           "2"]))[0][1] == "hf"
    assert e2e.repeat_plan(e2e.parse_args([])) == []
    assert e2e.estimate_s(q, "hf", a, cold_only=True) < e2e.estimate_s(q, "hf", a)
    spec = e2e.child_spec(q, "liger-aot", a, cold_only=True)
    assert (spec["steps"], spec["warmup"]) == (0, 0)


def test_byte_compile_libraries(e2e, tmp_path, monkeypatch):
    for d in ("liger_aot", "kernel_src"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "m.py").write_text("X = 1\n")
    monkeypatch.setattr(e2e, "ROOT", str(tmp_path))
    monkeypatch.setattr(e2e, "LIBRARY_PACKAGES", {"liger-aot": "liger_aot",
                                                  "liger-kernel": "no_such_package_xyz"})
    assert e2e.byte_compile_libraries(["hf"]) == {}
    done = e2e.byte_compile_libraries(["hf", "liger-aot", "liger-kernel-warm"])
    assert done == {"liger_aot": "compiled", "no_such_package_xyz": "not found"}
    for d in ("liger_aot", "kernel_src"):
        assert any(f.startswith("m.") for f in os.listdir(tmp_path / d / "__pycache__"))


# -- results: ratios, tables, files ----------------------------------------------------------

def _result(model, mode, first, tok_s, peak, losses, lib=0.0, **kw):
    r = dict(model=model, mode=mode, status="ok", device="cuda", batch=4, seq=2048, steps=10,
             startup_s=0.05, phases=dict(import_torch=2.0, cuda_init=1.0,
                                         import_transformers=2.5, lib_patch=lib,
                                         build_model=3.0, optimizer_data=0.01,
                                         first_step=first),
             first_step_s=first, to_first_step_done_s=8.6 + lib + first, tok_s=tok_s,
             peak_gib=peak, losses=losses, triton_imported=True,
             triton_importer="torch/utils/_triton.py:39 (has_triton_package)",
             liger_aot_jit_modules=[], jit_files=0, wall_s=20.0, est_s=22.0,
             versions=dict(torch="2.11.0+cu130", transformers="5.17.0"), gpu="NVIDIA H200")
    r.update(kw)
    return r


def fabricated():
    return [
        _result("llama3_8b", "hf", 2.70, 49671, 28.9, [11.93, 11.80, 11.62, 11.40, 11.20, 11.0]),
        _result("llama3_8b", "liger-aot", 2.60, 53000, 17.5, [11.931, 11.801, 11.62, 11.41, 11.2],
                lib=0.05, lib_version="0.1.0"),
        _result("llama3_8b", "liger-kernel", 3.98, 52372, 18.0, [11.93, 11.80, 11.62, 11.40, 11.2],
                lib=2.5, jit_files=120, lib_version="0.8.5",
                triton_importer="liger_kernel/ops/rms_norm.py:14 (<module>)"),
        _result("gemma2_2b", "hf", 0.98, 16024, 102.5, [12.5, 12.4, 12.3]),
        _result("gemma2_2b", "liger-aot", 1.20, 18000, 63.0, [12.5, 12.9, 12.3], lib=0.05,
                jit_files=3),
        dict(model="gemma2_2b", mode="liger-kernel", status="oom", phases={}, returncode=1,
             error="OutOfMemoryError: CUDA out of memory", stderr_tail="Traceback ...\nOOM",
             wall_s=30.0, est_s=31.0),
        dict(model="qwen2_5_0_5b", mode="hf", status="skipped", phases={},
             error="--budget-s 540 used up", est_s=19.0),
    ]


def test_summarize_ratios_and_loss_check(e2e):
    rs = e2e.summarize(fabricated(), loss_steps=5, loss_rtol=1e-2)
    by = {(r["model"], r["mode"]): r for r in rs}
    aot = by["llama3_8b", "liger-aot"]
    assert aot["first_x_hf"] == pytest.approx(2.60 / 2.70)
    assert aot["cold_x_hf_first"] == pytest.approx(2.65 / 2.70)
    assert aot["tok_s_x_lk"] == pytest.approx(53000 / 52372)
    assert aot["peak_x_lk"] == pytest.approx(17.5 / 18.0)
    assert aot["loss_check"] == "ok" and aot["loss_max_rel_diff"] < 1e-3
    assert by["llama3_8b", "liger-kernel"]["first_x_hf"] == pytest.approx(3.98 / 2.70)
    assert by["gemma2_2b", "liger-aot"]["loss_check"] == "MISMATCH"  # 12.9 vs 12.4
    assert "tok_s_x_lk" not in by["gemma2_2b", "liger-aot"]  # its liger-kernel run failed
    assert "loss_check" not in by["llama3_8b", "hf"]


def test_goals(e2e):
    rows = e2e.goals(e2e.summarize(fabricated()))
    verdict = {(m, g.split(":")[0].split(" <=")[0].split(" >=")[0]): v for m, g, _, v in rows}
    assert verdict["llama3_8b", "lib+patch+first step"] == "PASS"
    assert verdict["llama3_8b", "tok/s"] == "PASS"
    assert verdict["llama3_8b", "peak"] == "PASS"
    assert verdict["llama3_8b", "losses match HF"] == "PASS"
    assert verdict["llama3_8b", "no JIT"] == "PASS"
    assert verdict["gemma2_2b", "lib+patch+first step"] == "FAIL"  # 1.25 / 0.98
    assert verdict["gemma2_2b", "losses match HF"] == "FAIL"
    assert verdict["gemma2_2b", "no JIT"] == "FAIL"  # 3 cache files
    assert verdict["gemma2_2b", "tok/s"] == "n/a"


def test_cold_repeats_medians_goal_and_table(e2e):
    rs = fabricated()
    by = {(r["model"], r["mode"]): r for r in rs}
    runs = lambda firsts, lib: [dict(status="ok", first_step_s=f, lib_patch_s=lib)  # noqa: E731
                                for f in firsts]
    by["llama3_8b", "hf"]["cold_runs"] = runs([2.70, 2.0, 2.2], 0.0)
    aot = by["llama3_8b", "liger-aot"]
    aot["cold_runs"] = runs([2.60, 2.5, 2.3], 0.05) + [dict(status="timeout",
                                                            error="killed after 240 s")]
    e2e.summarize(rs)
    assert by["llama3_8b", "hf"]["first_median_s"] == pytest.approx(2.2)
    assert aot["cold_median_s"] == pytest.approx(2.55) and aot["cold_runs_ok"] == 3
    assert aot["cold_x_hf_first_median"] == pytest.approx(2.55 / 2.2)
    assert aot["cold_x_hf_first"] == pytest.approx(2.65 / 2.70)  # the main child's, kept
    rows = {(m, g): v for m, g, v, _ in e2e.goals(rs)}
    assert rows["llama3_8b", "lib+patch+first step <= 1.1 x HF first step (medians of 3 runs)"] \
        == "1.16x"
    assert ("gemma2_2b", "lib+patch+first step <= 1.1 x HF first step") in rows  # no repeats
    table = e2e.cold_repeats_table(rs).splitlines()
    assert len(table) == 4 and "3/4" in table[3] and "timeout" in table[3]
    text = e2e.report_text(rs)
    assert "--cold-repeats" in text and "liger-aot cold run 4: timeout: killed after 240 s" in text
    assert e2e.cold_repeats_table(fabricated()) == ""
    assert "--cold-repeats" not in e2e.report_text(e2e.summarize(fabricated()))


def test_report_text(e2e):
    rs = e2e.summarize(fabricated())
    text = e2e.report_text(rs, loss_steps=5, meta=dict(device="cuda", steps=10))
    assert "Cold start" in text and "Steady state" in text and "Goals (liger-aot)" in text
    assert "MISMATCH" in text and "Failed children" in text and "OutOfMemoryError" in text
    assert "torch probe" in text and "by liger_kernel" in text and "NVIDIA H200" in text
    assert "53,000" in text and "0.96x" in text  # tok/s and the first-step ratio
    lines = e2e.cold_table(rs).splitlines()
    assert len(lines) == 2 + len(rs)
    rs[0]["step_split"] = dict(first=dict(forward=1.25, backward=0.5, optimizer=0.25,
                                          gpu_wait=0.125))
    split = e2e.split_table(rs).splitlines()
    assert len(split) == 2 + len(rs) and "1.250" in split[2] and split[3].count("-") >= 8
    assert len({len(line) for line in lines}) == 1  # aligned columns


def test_write_outputs_and_report(e2e, tmp_path):
    rs = e2e.summarize(fabricated())
    e2e.write_outputs(rs, str(tmp_path), dict(device="cuda"))
    with open(tmp_path / "end_to_end.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["mode"] for r in rows] == [r["mode"] for r in rs]
    assert set(rows[0]) == set(e2e.CSV_FIELDS)
    aot = rows[1]
    assert aot["losses"].split(";")[0] == "11.931000" and aot["loss_check"] == "ok"
    assert float(aot["first_step_s"]) == 2.6 and aot["lib_patch_s"] == "0.05"
    assert rows[5]["status"] == "oom" and rows[5]["tok_s"] == ""
    data = json.loads((tmp_path / "end_to_end.json").read_text())
    assert data["meta"] == {"device": "cuda"} and len(data["results"]) == len(rs)
    results, meta = e2e.load_report(str(tmp_path))
    assert e2e.report_text(results, 5, meta) == e2e.report_text(rs, 5, meta)


def test_child_output_parsing(e2e):
    out = "noise\n" + e2e.RESULT_MARKER + json.dumps(dict(status="ok", x=1)) + "\nmore noise\n"
    assert e2e.parse_child_output(out) == dict(status="ok", x=1)
    assert e2e.parse_child_output("nothing here") is None
    timeout = e2e.finish_result("m", "hf", None, None, "err", 240.0, 20.0, 0)
    assert timeout["status"] == "timeout" and timeout["stderr_tail"] == "err"
    crashed = e2e.finish_result("m", "hf", None, -11, "Segmentation fault", 5.0, 20.0, 0)
    assert crashed["status"] == "failed" and "exit status -11" in crashed["error"]
    ok = e2e.finish_result("m", "hf", dict(status="ok", phases={}), 0, "", 5.0, 20.0, 0)
    assert ok["status"] == "ok" and "stderr_tail" not in ok


def test_triton_import_watch(e2e):
    watch = e2e.TritonImportWatch(block=True)
    assert watch.find_spec("torch") is None and watch.importer is None
    with pytest.raises(ImportError):
        watch.find_spec("triton")
    assert watch.importer and watch.blocked == ["triton"]


# -- the whole flow, on the CPU ----------------------------------------------------------------

def test_cpu_tiny_run_end_to_end(tmp_path):
    """Parent -> fresh child -> JSON line -> tables and files, HF mode (Triton's interpreter
    makes a liger-aot child take ~40 s: `--device cpu --tiny --modes hf,liger-aot` by hand)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--models",
                           "qwen2_5_0_5b", "--modes", "hf", "--steps", "1", "--warmup", "0",
                           "--no-prewarm", "--cold-repeats", "2", "--profile-first-step",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Cold start" in proc.stdout and "Steady state" in proc.stdout
    data = json.loads((tmp_path / "end_to_end.json").read_text())
    (r,) = data["results"]
    assert r["status"] == "ok" and r["mode"] == "hf" and r["device"] == "cpu"
    assert len(r["losses"]) == 2 and all(x == x for x in r["losses"])
    assert r["first_step_s"] > 0 and r["tok_s"] > 0 and r["to_first_step_done_s"] > 0
    assert set(e2e_phases()) <= set(r["phases"])
    assert r["jit_files"] == 0 and r["liger_modules"] == 0
    # --warmup 0: only the first step is split; its phases sum to at most the step
    assert set(r["step_split"]) == {"first"}
    assert set(r["step_split"]["first"]) == {"forward", "backward", "optimizer", "gpu_wait"}
    assert 0 < sum(r["step_split"]["first"].values()) <= r["first_step_s"]
    assert "1st forward" in proc.stdout
    assert (tmp_path / "end_to_end.csv").exists()
    assert (tmp_path / "logs" / "qwen2_5_0_5b_hf.log").exists()
    # --cold-repeats 2: one more cold-only child, kept in the main result's cold_runs
    assert [c["status"] for c in r["cold_runs"]] == ["ok", "ok"]
    assert (tmp_path / "logs" / "qwen2_5_0_5b_hf_cold2.log").exists()
    assert "Cold start over fresh processes" in proc.stdout
    # --profile-first-step: the main child's first step profiled (the forward among its
    # calls), the cold-only repeat not
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == ["qwen2_5_0_5b_hf.txt"]
    profile = (tmp_path / "profiles" / "qwen2_5_0_5b_hf.txt").read_text()
    assert "cumulative" in profile and "train_step" in profile and "forward" in profile


def e2e_phases():
    return ("import_torch", "cuda_init", "import_transformers", "lib_patch", "build_model",
            "optimizer_data", "first_step")


def test_op_import_cost_cpu_tiny(tmp_path):
    """benchmarks/op_import_cost.py: four fresh children; the lazy ones define no custom op,
    the eager ones all that the imported modules declare."""
    script = os.path.join(ROOT, "benchmarks", "op_import_cost.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    proc = subprocess.run([sys.executable, script, "--device", "cpu", "--tiny", "--repeats",
                           "1", "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads((tmp_path / "op_import_cost.json").read_text())["runs"]
    assert sorted(r["way"] for r in runs) == sorted(
        ("lazy-pyc", "eager-pyc", "lazy-source", "eager-source"))
    for r in runs:
        assert r["seconds"] > 0 and r["declared"] >= 8
        assert r["defined"] == (r["declared"] if r["way"].startswith("eager") else 0)
    assert "median of 1" in proc.stdout
