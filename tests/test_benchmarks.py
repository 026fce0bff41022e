"""The benchmarks still run and print what they promise, on the CPU (tiny sizes; the speed
itself is measured by running the benchmark, never asserted here): the machine and the
device named on the first line and in the JSON line that ends the output; every benchmark
takes ``--device {auto,cpu,cuda}`` (tests/test_cuda.py runs them on CUDA) and ``--threads N``
(default: the CPUs the process may run on) from its harness (benchmarks/_harness.py), with
options of its own. The whole runs are ``slow`` (the full tier: docs/testing.md); the
options and the harness are checked quickly."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from functools import partial

import pytest
import torch

from crosslip.device import add_threads_argument, available_cpus

from .helpers import BENCHMARKS, TINY_BENCH_ARGS, as_benchmark, benchmark_module
from .helpers import run_benchmark as run_bench

BENCHES = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))

#: Every script with the benchmarks' command line (each has ``arguments()``, its parser),
#: with options of its own as a run gives them (the tiny runs' where there are some).
OWN_OPTIONS: dict[str, list[str]] = {
    **TINY_BENCH_ARGS,
    "bench_attack.py": [
        *("--mirror", "m", "--reference-rows", "2", "--refine-steps", "1", "--rounds", "1"),
        "--projections-only",
    ],
    "bench_certify.py": [
        *("--mirror", "m", "--reference-points", "2", "--all-kinds-points", "20"),
        *("--method-points", "20", "--all-norms-points", "10", "--model", "f.pt", "--no-kernel"),
        *("--trust-region-points", "5", "--trust-region-steps", "4"),
    ],
    "bench_kernel_scale.py": [
        *("--centers", "100", "200", "--iterations", "1", "--gamma-points", "300"),
        *("--points", "2", "--memory-gb", "1.5", "--mirror", "m", "--cache", "c", "--streamed"),
    ],
    "study_bracket.py": ["--results", "r", "--out", "o.json"],
    "study_settings.py": ["--results", "r", "--dataset", "mnist5k", "--out", "o.json"],
    "study_trust_region.py": ["--results", "r", "--points", "5", "--steps", "4", "--out", "o"],
    "study_soundness.py": [
        *("--results", "r", "--points", "5", "--norms", "l2", "linf", "--steps", "10"),
        *("--restarts", "1", "--out", "o"),
    ],
    "study_guarantee_gap.py": [
        *("--dataset", "mnist5k", "--mirror", "m", "--train-subset", "100", "--epochs", "2"),
        *("--networks", "none:0:0.5", "cross_lipschitz:1e-2:0.5", "--checkpoints", "1", "2"),
        *("--points", "20", "--train-points", "8", "--attack-points", "6", "--hidden", "16"),
        *("--alpha", "5", "--seed", "1", "--rtol", "1e-2", "--ascent-steps", "3"),
        *("--out", "r.json", "--verbose"),
    ],
    "make_run_times.py": [
        *("--baseline", "HEAD~1", "--candidate", "HEAD", "--rounds", "1", "--cores", "2"),
        *("--venv", ".venv"),
    ],
    "suite_times.py": [
        *("--tiers", "fast", "--baseline", "HEAD", "--rounds", "1"),
        *("--select", "tests/test_rounding.py"),
    ],
}
#: The scripts whose parser has no ``--device`` or ``--threads`` (no torch code of their own).
NO_TORCH_OPTIONS = {
    "make_run_times.py",
    "suite_times.py",
    "study_bracket.py",
    "study_settings.py",
}


def test_every_benchmark_has_its_options_listed_here():
    scripts = {p.name for p in BENCHMARKS.glob("[!_]*.py") if "def arguments()" in p.read_text()}
    assert scripts == set(OWN_OPTIONS) >= set(BENCHES)


@pytest.mark.parametrize("name", sorted(OWN_OPTIONS))
def test_every_benchmark_parses_the_common_options_and_its_own(name, capsys):
    """Its parser (``arguments()``) shows its help and takes ``--device cpu --threads 1``
    (where it runs torch code) with its own options."""
    parser = benchmark_module(name)["arguments"]()
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--help"])
    shown = capsys.readouterr().out
    assert stop.value.code == 0 and shown.startswith("usage: "), shown
    assert " ".join(parser.description.split()) in " ".join(shown.split())
    common = [] if name in NO_TORCH_OPTIONS else ["--device", "cpu", "--threads", "1"]
    assert ("--device" in shown) == bool(common) == ("--threads" in shown)
    args = parser.parse_args([*OWN_OPTIONS[name], *common])
    if common:
        assert (args.device, args.threads) == ("cpu", 1)


def test_the_harness_sets_up_a_run_and_times_kinds_in_turns():
    harness = benchmark_module("_harness.py")
    parser = harness["parser"]("First line.\nMore.")
    parser.add_argument("--points", type=int, default=3)
    threads = torch.get_num_threads()
    try:
        bench = harness["start"](parser, ["--device", "cpu", "--threads", "1"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert parser.description == "First line." and bench.args.points == 3
    assert bench.device == torch.device("cpu") and bench.machine.endswith(" on 1 thread")
    assert bench.header() == {"machine": bench.machine, "device": "cpu"}
    assert bench.machine_line() == f"machine: {bench.machine} (device cpu)"
    calls: list[str] = []

    def sleeps(kind: str, seconds: float) -> str:
        calls.append(kind)
        time.sleep(seconds)
        return kind

    out, seconds = harness["timed"](partial(sleeps, "once", 0.01))
    assert out == "once" and seconds >= 0.01
    kinds = {"slow": partial(sleeps, "slow", 0.02), "quick": partial(sleeps, "quick", 0.0)}
    medians = harness["medians"](kinds, 3, "cpu")
    assert calls == ["once", *["slow", "quick"] * 3]  # the kinds take turns
    assert list(medians) == ["slow", "quick"] and medians["slow"] >= 0.02


def test_a_benchmark_ends_with_its_json_line_and_may_write_it_with_provenance(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CROSSLIP_COMMIT", "abc1234")
    finish = benchmark_module("_harness.py")["finish"]
    with as_benchmark("bench_x.py", "--points", "3"):
        finish({"seconds": 1.5}, tmp_path / "out" / "r.json")
    assert capsys.readouterr().out.splitlines()[-1] == '{"seconds": 1.5}'
    entry = json.loads((tmp_path / "out" / "r.json").read_text())
    assert list(entry) == ["command", "date", "commit", "result"]
    assert entry["command"].endswith(" bench_x.py --points 3") and entry["commit"] == "abc1234"
    assert entry["result"] == {"seconds": 1.5}


@pytest.mark.parametrize("name", BENCHES)
def test_every_benchmark_takes_threads(name, capsys):
    """``--threads`` takes a whole number in every benchmark (crosslip.device's argument)."""
    with pytest.raises(SystemExit) as stop:
        run_bench(name, "--threads", "two")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --threads: invalid int value: 'two'" in err, err


def test_threads_default_to_the_cpus_this_process_may_run_on():
    parser = argparse.ArgumentParser()
    add_threads_argument(parser)
    assert parser.parse_args([]).threads == available_cpus() == len(os.sched_getaffinity(0))
    assert parser.parse_args(["--threads", "1"]).threads == 1


@pytest.mark.parametrize("name", BENCHES)
def test_every_benchmark_takes_a_device(name, capsys):
    """``--device`` is one of auto, cpu, cuda in every benchmark: another value stops it
    with argparse's message naming the choices."""
    with pytest.raises(SystemExit) as stop:
        run_bench(name, "--device", "gpu")
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert "argument --device: invalid choice: 'gpu'" in err, err
    assert "'auto', 'cpu', 'cuda'" in err, err


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_train_runs_and_ends_with_one_json_line():
    args = [*TINY_BENCH_ARGS["bench_train.py"], "--device", "cpu"]
    out = run_bench("bench_train.py", *args)
    assert out[0].startswith("machine: ") and out[0].endswith("on 1 thread (device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["hidden"] == 64 and out[1].startswith("784-64-10 ")
    for tag in ("", "_batch1024"):
        secs = res[f"step_seconds{tag}"]
        assert set(secs) == {
            "plain",
            "weight_decay",
            "dropout",
            "cross_lipschitz",
            "certified_margin",
            "cross_lipschitz_double_backprop",
            "cross_lipschitz_autograd_backward",
        }
        assert all(math.isfinite(v) and v > 0 for v in secs.values())
        cl = secs["cross_lipschitz"]
        assert math.isclose(res[f"ratio_cl_to_plain{tag}"], cl / secs["plain"])
        cm = res[f"ratio_certified_margin_to_cl{tag}"]
        assert math.isclose(cm, secs["certified_margin"] / cl)
        assert math.isclose(
            res[f"ratio_cl_to_double_backprop{tag}"], cl / secs["cross_lipschitz_double_backprop"]
        )
        bound = res[f"cl_arithmetic_bound_seconds{tag}"]
        assert math.isclose(res[f"ratio_cl_to_arithmetic_bound{tag}"], cl / bound)
        assert res[f"gemm_gflops_float32{tag}"] > 0
    assert res["kernel_centers"] == 50 and res["kernel_seconds_per_lbfgs_iteration"] > 0
    assert any(line.startswith("kernel (50 centres") for line in out)


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_pipeline_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench(
        "bench_pipeline.py",
        *TINY_BENCH_ARGS["bench_pipeline.py"],
        *("--device", "cpu"),
    )
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["points"] == 20 and res["results_agree"] is True
    for key in (
        "train_epoch_none_s",
        "train_epoch_cross_lipschitz_s",
        "certify_batched_s",
        "certify_per_point_s",
        "attack_s",
    ):
        assert math.isfinite(res[key]) and res[key] > 0, key
    speedup = res["certify_per_point_s"] / res["certify_batched_s"]
    assert math.isclose(res["speedup_certify_vs_per_point"], speedup)


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_kernel_bound_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench(
        "bench_kernel_bound.py",
        *TINY_BENCH_ARGS["bench_kernel_bound.py"],
        *("--device", "cpu"),
    )
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["kernel_centers"] == 60
    assert res["kernel_points"] == 8 and res["kernel_reference_points"] == 2
    assert res["kernel_agree"] is True and res["kernel_seconds"] > 0


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_grid_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench("bench_grid.py", *TINY_BENCH_ARGS["bench_grid.py"], *("--device", "cpu"))
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["points"] == 96 and res["grid"] == 26
    assert set(res["sizes"]) == {"1", "3"}
    assert res["grid_job_trains"] == "separate"  # on the CPU (stages.training.batched_on)
    for size, r in res["sizes"].items():
        assert r["batched_seconds"] > 0 and r["separate_seconds"] > 0
        assert math.isclose(
            r["speedup_batched_vs_separate"], r["separate_seconds"] / r["batched_seconds"]
        )
        assert math.isclose(
            r["ratio_to_arithmetic_bound"], r["batched_seconds"] / r["arithmetic_bound_seconds"]
        )
        epochs = int(size) * 96 / 60000
        assert math.isclose(r["network_epochs_per_second_batched"], epochs / r["batched_seconds"])
    one, three = res["sizes"]["1"], res["sizes"]["3"]  # Cross-Lipschitz networks both
    # a batched step of 3 networks runs the operations of one (a broadcast more or less);
    # separate steps, three times those of one
    assert abs(three["ops_per_step_batched"] - one["ops_per_step_batched"]) <= 2
    assert three["ops_per_step_separate"] == 3 * one["ops_per_step_separate"]
    assert res["speedup_batched_vs_separate"] == three["speedup_batched_vs_separate"]
    assert res["ratio_to_arithmetic_bound"] == three["ratio_to_arithmetic_bound"]
    assert any(line.startswith("G =  3: batched") for line in out)


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_adversarial_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench(
        "bench_adversarial.py", *TINY_BENCH_ARGS["bench_adversarial.py"], *("--device", "cpu")
    )
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["grid"] == 26 and res["adversarial_rows"] == 32
    assert set(res["sizes"]) == {"1", "3"}
    for r in res["sizes"].values():
        for kind in ("plain", "one_step", "search"):
            assert r[f"{kind}_seconds_per_step"] > 0
        assert math.isclose(
            r["speedup_one_step_vs_search"],
            r["search_seconds_per_step"] / r["one_step_seconds_per_step"],
        )
        # the plain step and the one-step attack read nothing back to the host (a recorded
        # graph could not); the search does, to shrink its working set
        assert r["host_reads_per_step_plain"] == r["host_reads_per_step_one_step"] == 0
        assert r["host_reads_per_step_search"] > 0
        assert r["ops_per_step_plain"] < r["ops_per_step_one_step"] < r["ops_per_step_search"]
    one, three = res["sizes"]["1"], res["sizes"]["3"]
    # batched: three networks make their samples with the operations of one
    assert abs(three["ops_per_step_one_step"] - one["ops_per_step_one_step"]) <= 2
    assert res["speedup_one_step_vs_search"] == three["speedup_one_step_vs_search"]
    assert any(line.startswith("G =  3: plain") for line in out)


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_compile_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench("bench_compile.py", *TINY_BENCH_ARGS["bench_compile.py"], "--device", "cpu")
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["backend"] == "aot_eager" and res["hidden"] == 16
    assert set(res["sizes"]) == {"1", "2"}
    for r in res["sizes"].values():
        assert r["eager_seconds_per_step"] > 0 and r["compiled_seconds_per_step"] > 0
        assert math.isclose(
            r["speedup_compiled_vs_eager"],
            r["eager_seconds_per_step"] / r["compiled_seconds_per_step"],
        )
        # the same steps on the same weights: the compiled copy trained as the eager one
        assert r["max_weight_difference"] < 1e-5
    assert res["compile_seconds_cold"] == res["sizes"]["1"]["compile_seconds_first_call"]
    assert res["speedup_compiled_vs_eager"] == res["sizes"]["2"]["speedup_compiled_vs_eager"]


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_min_norm_runs_on_the_cpu_and_ends_with_one_json_line():
    out = run_bench(
        "bench_min_norm.py", *TINY_BENCH_ARGS["bench_min_norm.py"], *("--device", "cpu")
    )
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["device"] == "cpu" and res["points"] == 12 and res["network"] == "784-32-10"
    assert res["default"] == "5:2:1:0.001:2:1.5" and res["thorough"] == "200:9:8:0:0:0"
    assert res["thorough_points"] == 8 and res["table_points"] == 4
    for key in ("paper_seconds", "refine_seconds", "min_norm_seconds", "thorough_seconds"):
        assert math.isfinite(res[key]) and res[key] > 0, key
    ratio = res["min_norm_seconds"] / (res["paper_seconds"] + res["refine_seconds"])
    assert math.isclose(res["min_norm_vs_paper_seconds"], ratio)
    means = res["mean_upper_bound"]
    assert set(means) == {"paper", "refined", "thorough", "min_norm"}
    # from the refined samples: never worse (up to the nudge across the boundary)
    assert means["min_norm"] <= means["refined"] * (1 + 1e-4) <= means["paper"] * (1 + 1e-4)
    assert res["mean_vs_old_default"] == res["vs_old_default"]["ratio_of_means"] > 0
    assert [row["setting"] for row in res["table"]] == ["5:1:0:0.001:2:1.5", "5:2:1:0:0:0"]
    for row in [res["vs_old_default"], *res["table"]]:
        assert row["success_rate"] == 1.0 and row["p99_excess"] <= row["max_excess"]
    assert any(line.startswith("default 5:2:1:0.001:2:1.5") for line in out)


@pytest.mark.slow  # two pytest runs
def test_suite_times_runs_a_tier_beside_a_baseline_and_ends_with_one_json_line(monkeypatch):
    """The test-suite benchmark on one small test file, against the committed HEAD's copy of
    it: both runs pass and are timed, and the JSON line carries the ratios. The Makefile's
    ``-n auto`` starts no worker in the runs here (``PYTEST_XDIST_AUTO_NUM_WORKERS`` 0: a
    worker's start-up was half of this test's 19 s), so each runs in its pytest process;
    the arguments the benchmark reads from the Makefile are checked as they are."""
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "0")
    out = run_bench(
        "suite_times.py",
        *("--tiers", "fast", "--baseline", "HEAD", "--select", "tests/test_rounding.py"),
    )
    assert out[0].startswith("machine: ")
    res = json.loads(out[-1])
    fast = res["tiers"]["fast"]
    assert res["baseline"] == "HEAD" and fast["passed"] > 10
    assert "--dist loadgroup" in res["xdist"]  # as make test runs it (the Makefile's XDIST)
    assert "baseline_xdist" in res
    assert fast["baseline_passed"] == fast["passed"]
    assert math.isclose(fast["ratio_to_baseline"], fast["seconds"] / fast["baseline_seconds"])
    assert math.isclose(fast["ratio_to_target"], fast["seconds"] / 90.0)
    assert 0 < fast["cpu_seconds"] and 0 < fast["baseline_cpu_seconds"]  # pytest's own at least
    assert math.isclose(fast["busy_cores"], fast["cpu_seconds"] / fast["seconds"])
    assert all(s["test"].startswith("tests/test_rounding.py::") for s in fast["slowest"])


@pytest.mark.slow  # a whole benchmark run: the full tier
def test_bench_preset_projects_the_whole_preset_from_its_measured_parts():
    out = run_bench("bench_preset.py", *TINY_BENCH_ARGS["bench_preset.py"], "--device", "cpu")
    assert out[0].startswith("machine: ") and out[0].endswith("(device cpu)")
    res = json.loads(out[-1])
    assert res["configfiles"] == ["config/presets/mnist.yaml", "config/overrides/gpu.yaml"]
    assert res["dataset"] == "mnist5k" and res["networks"] == 78 and res["hidden"] == 8
    assert res["epochs"] == 200 and res["epochs_measured"] == [1, 2]
    assert res["train_points_measured"] == 128 and res["eval_points_measured"] == 4
    # the preset with the GPU override: a training, a certification and an attack job per
    # setting; one job each per model without batches
    assert set(res["settings"]) == {"plain", "augment", "adversarial"}
    assert res["jobs"] == 9 and res["jobs_per_model"] == 3 * 78
    steps = math.ceil(res["train_points"] / 64) / math.ceil(128 / 64)
    for s in res["settings"].values():
        assert s["networks"] == 26 and s["train_jobs"] == 1
        assert len(s["models_evaluated"]) == 2 and 0 <= s["attack_min_norm_share"] <= 1
        b = s["train_batched"]
        (t1, t2), (e1, e2) = b["measured_seconds"], res["epochs_measured"]
        if b["through_origin"]:  # the epochs lost in noise: the longer run's line
            assert t2 <= t1 and b["fixed_seconds"] == 0
            assert math.isclose(b["seconds_per_epoch"], t2 / e2 * steps)
        else:
            per_epoch = (t2 - t1) / (e2 - e1)
            assert math.isclose(b["seconds_per_epoch"], per_epoch * steps)
            assert math.isclose(b["fixed_seconds"], max(t1 - e1 * per_epoch, 0))
        assert math.isclose(
            b["projected_seconds"], b["fixed_seconds"] + 200 * b["seconds_per_epoch"]
        )
        each = s["train_per_model_each"]["projected_seconds"]
        assert math.isclose(s["train_per_model_projected_seconds"], 26 * each)
        points = res["eval_points"] / 4
        assert math.isclose(
            s["attack_projected_seconds"], 26 * s["attack_seconds_per_model"] * points
        )
        assert math.isclose(
            s["certify_projected_seconds"], 26 * s["certify_seconds_per_model"] * points
        )
    stages = res["projected_seconds_by_stage"]
    assert math.isclose(res["projected_preset_seconds"], sum(stages.values()))
    assert math.isclose(stages["startup"], 9 * res["startup_seconds_per_job"])
    per_model = res["projected_per_model_seconds_by_stage"]
    assert per_model["certify"] == stages["certify"] and per_model["attack"] == stages["attack"]
    assert math.isclose(per_model["startup"], 234 * res["startup_seconds_per_job"])
    assert math.isclose(
        res["speedup_vs_per_model"],
        res["projected_per_model_seconds"] / res["projected_preset_seconds"],
    )
    assert res["within_target"] == (res["projected_preset_seconds"] <= 1800)
    assert any(line.startswith("projected: train ") for line in out)
    # the arithmetic floor: training in float32, certificates and attacks in float64; the
    # preset's flops are the settings' added, the floor their seconds at the measured rates
    flops, rates = res["flops_by_stage"], res["matmul_gflops"]
    assert set(flops) == {"train", "certify", "attack"} and set(rates) >= {"float32", "float64"}
    assert flops["train"]["float32"] > 0 and "float64" not in flops["train"]
    assert flops["certify"]["float64"] > 0 and flops["attack"]["float64"] > 0
    for stage, by_dtype in flops.items():
        assert math.isclose(
            sum(s["flops"][stage].get(k, 0) for s in res["settings"].values() for k in by_dtype),
            sum(by_dtype.values()),
        )
        floor = sum(v / (rates[k] * 1e9) for k, v in by_dtype.items())
        assert math.isclose(res["arithmetic_floor_seconds_by_stage"][stage], floor)
        assert math.isclose(
            res["ratio_to_arithmetic_floor_by_stage"][stage],
            stages[stage] / res["arithmetic_floor_seconds_by_stage"][stage],
        )
    for s in res["settings"].values():
        f = s["flops"]
        assert math.isclose(sum(f["certify"].values()), 26 * sum(f["certify_per_model"].values()))
        train = sum(f["train"].values())
        assert 200 * sum(f["train_per_epoch"].values()) <= train * (1 + 1e-9)
    assert any(line.startswith("arithmetic floor at this device") for line in out)


def test_bench_preset_refuses_epochs_out_of_order(capsys):
    with pytest.raises(SystemExit) as stop:
        run_bench("bench_preset.py", "--epochs", "3", "3", "--device", "cpu")
    assert stop.value.code == 2
    assert "--epochs 3 3: give two epoch counts, 0 < E1 < E2" in capsys.readouterr().err
