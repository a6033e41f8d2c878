"""Tests of the kernel benchmark (``experiments.bench_kernels``) and its reusable helpers."""
import json
import time
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.records.atomic import write_json_atomic
from experiments.records.environment import describe_environment
from experiments.measure.timing import time_callable

REPO_ROOT = Path(__file__).resolve().parents[1]

MEASUREMENTS = ("inplace_abn_fwd_bwd_I", "inplace_abn_fwd_bwd_II", "composite_fwd_bwd",
                "inplace_abn_fwd_I", "copy")
ENVIRONMENT_KEYS = ("python", "torch", "numba", "platform", "processor", "cpu_count", "threads",
                    "device", "device_name", "git_commit", "date_utc")


def _run_benchmark(*args):
    return subprocess.run([sys.executable, "-m", "experiments.bench_kernels", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)


# --------------------------------------------------------------------------- end to end
def test_bench_kernels_writes_a_complete_report(tmp_path):
    out = tmp_path / "b.json"
    result = _run_benchmark("--shape", "2", "4", "8", "8", "--repeats", "2", "--warmup", "1",
                            "--threads", "1", "--dtypes", "float32", "bfloat16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]  # no temporary file left

    config = report["config"]
    assert config["shape"] == [2, 4, 8, 8]
    assert (config["dtypes"], config["device"]) == (["float32", "bfloat16"], "cpu")
    assert (config["repeats"], config["warmup"], config["threads"]) == (2, 1, 1)

    assert [row["dtype"] for row in report["rows"]] == ["float32", "bfloat16"]
    assert [row["tensor_bytes"] for row in report["rows"]] == [2 * 4 * 8 * 8 * 4,
                                                               2 * 4 * 8 * 8 * 2]
    for row in report["rows"]:
        results = row["results"]
        assert set(results) == set(MEASUREMENTS)
        for name in MEASUREMENTS:
            r = results[name]
            assert r["repeats"] == 2, name
            assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], name
        assert results["copy"]["effective_bandwidth_GBps"] > 0

        ratios = row["ratios"]
        assert set(ratios) == {"speedup_vs_composite_I", "speedup_vs_composite_II",
                               "forward_over_copy"}
        assert all(value > 0 for value in ratios.values())
        expected = (results["composite_fwd_bwd"]["median_s"]
                    / results["inplace_abn_fwd_bwd_I"]["median_s"])
        assert ratios["speedup_vs_composite_I"] == pytest.approx(expected)

    assert report["run"] == "manual-cpu"  # by hand; the pipeline passes its run

    env = report["environment"]
    assert set(ENVIRONMENT_KEYS) <= set(env)
    assert env["threads"]["torch"] == env["threads"]["numba"] == 1
    assert env["device"] == "cpu"
    assert env["git_commit"] is None or len(env["git_commit"]) == 40
    assert "bfloat16" in result.stdout and "speedup_vs_composite_I" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--shape", "2", "0", "8", "8"], "--shape"),
    (["--shape", "1", "4", "1", "1"], "more than one value per channel"),
    (["--repeats", "0"], "--repeats"),
    (["--threads", "0"], "--threads"),
    (["--dtypes", "float32", "float32"], "each dtype once"),
    (["--dtypes", "int8"], "--dtypes"),
])
def test_bench_kernels_rejects_bad_arguments(tmp_path, args, message):
    result = _run_benchmark(*args, "--out", str(tmp_path / "b.json"))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "b.json").exists()


def test_bench_kernels_artifact_is_named_by_its_run():
    """Like every artifact, one file per run (<profile>-<device>): two profiles on one device
    do not share a benchmark (experiments/records/paths.py)."""
    from experiments import bench_kernels
    from experiments.records import paths

    args = bench_kernels.parse_args(["--run", "paper-cpu"])
    assert args.out == Path(paths.bench_kernels_json("paper-cpu"))
    assert args.out == Path("artifacts/bench_kernels/paper-cpu.json")
    assert bench_kernels.parse_args([]).out == Path("artifacts/bench_kernels/manual-cpu.json")


@pytest.mark.parametrize("run", ["smoke-cuda", "smoke", "Smoke-cpu", "smoke_cpu"])
def test_bench_kernels_rejects_a_run_of_another_device(run, capsys):
    from experiments import bench_kernels

    with pytest.raises(SystemExit) as error:
        bench_kernels.parse_args(["--run", run, "--device", "cpu"])
    assert error.value.code == 2
    assert f"--run {run}: must be <profile>-cpu" in capsys.readouterr().err


def test_bench_kernels_names_device_when_cuda_is_missing(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is available")
    result = _run_benchmark("--device", "cuda", "--out", str(tmp_path / "b.json"))
    assert result.returncode == 2
    assert "--device" in result.stderr and "cuda" in result.stderr


# --------------------------------------------------------------------------- write_json_atomic
def test_write_json_atomic_writes_and_replaces(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    write_json_atomic(path, {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert os.listdir(path.parent) == ["r.json"]


def test_write_json_atomic_failure_leaves_nothing(tmp_path):
    path = tmp_path / "r.json"
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not serialisable, midway through the dump
    assert os.listdir(tmp_path) == []


def test_write_json_atomic_failure_keeps_the_previous_file(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # strict JSON refuses NaN
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["r.json"]


# --------------------------------------------------------------------------- time_callable
def test_time_callable_runs_setup_untimed_before_each_call():
    events = []

    def setup():
        events.append("setup")
        time.sleep(0.02)  # must not be counted
        return len(events)

    def fn(token):
        events.append(("fn", token))

    result = time_callable(fn, warmup=2, repeats=3, device="cpu", setup=setup)
    assert result["repeats"] == 3
    assert events == [e for i in range(5) for e in ("setup", ("fn", 2 * i + 1))]
    assert 0 <= result["min_s"] <= result["median_s"] <= result["max_s"] < 0.02


def test_time_callable_without_setup_counts_repeats():
    calls = []
    result = time_callable(lambda: calls.append(1), warmup=1, repeats=4, device="cpu")
    assert len(calls) == 5
    assert result["repeats"] == 4
    assert set(result) == {"median_s", "min_s", "max_s", "repeats"}


@pytest.mark.parametrize("warmup, repeats", [(0, 0), (-1, 1), (0, 1.5)])
def test_time_callable_rejects_bad_counts(warmup, repeats):
    with pytest.raises(ValueError):
        time_callable(lambda: None, warmup=warmup, repeats=repeats)


def test_describe_environment_is_json_serialisable():
    env = describe_environment("cpu")
    assert set(ENVIRONMENT_KEYS) <= set(env)
    json.dumps(env, allow_nan=False)
