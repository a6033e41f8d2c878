"""Tests of the kernel benchmark (``experiments.bench_kernels``) and its reusable helpers."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments import bench_kernels
from experiments.records.atomic import write_json_atomic
from experiments.records.environment import describe_environment
from experiments.measure.timing import time_callable
from in_place_gradient import spy_in_place_backward

REPO_ROOT = Path(__file__).resolve().parents[1]

MEASUREMENTS = ("inplace_abn_fwd_bwd_I", "inplace_abn_fwd_bwd_II", "composite_fwd_bwd",
                "aten_inplace_fwd_bwd", "whole_steps_fwd_bwd", "inplace_abn_fwd_I", "copy",
                "python_function_floor")
ENVIRONMENT_KEYS = ("python", "torch", "numba", "platform", "processor", "cpu_count", "threads",
                    "device", "device_name", "git_commit", "date_utc")


def _run_benchmark(*args):
    return subprocess.run([sys.executable, "-m", "experiments.bench_kernels", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)


# --------------------------------------------------------------------------- end to end
def test_bench_kernels_writes_a_complete_report(tmp_path):
    out = tmp_path / "b.json"
    shapes = [[2, 4, 8, 8], [2, 3, 4, 4]]
    result = _run_benchmark("--shapes", *(str(s) for shape in shapes for s in shape),
                            "--repeats", "2", "--warmup", "1", "--threads", "1",
                            "--dtypes", "float32", "bfloat16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]  # no temporary file left

    config = report["config"]
    assert config["shapes"] == shapes
    assert (config["dtypes"], config["device"]) == (["float32", "bfloat16"], "cpu")
    assert (config["repeats"], config["warmup"], config["threads"]) == (2, 1, 1)
    assert report["threads"] == 1
    assert report["machine"] == report["environment"]["device_name"]

    # One row per shape and dtype, shape by shape.
    assert [(row["shape"], row["dtype"]) for row in report["rows"]] == [
        (shape, dtype) for shape in shapes for dtype in ("float32", "bfloat16")]
    assert [row["tensor_bytes"] for row in report["rows"]] == [
        2 * 4 * 8 * 8 * 4, 2 * 4 * 8 * 8 * 2, 2 * 3 * 4 * 4 * 4, 2 * 3 * 4 * 4 * 2]
    for row in report["rows"]:
        results = row["results"]
        assert list(results) == list(MEASUREMENTS)
        for name, r in {**results, **row["profile"]}.items():
            assert r["repeats"] == 2, name
            assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], name
        assert results["copy"]["effective_bandwidth_GBps"] > 0
        assert row["ratios"] == pytest.approx(bench_kernels.ratios(results))
        assert set(row["goals"]) == {"speedup_vs_composite"}  # not a shape of the table
        assert row["goals"] == bench_kernels.goals(row["shape"], row["ratios"])
        copy = results["copy"]["median_s"]
        assert list(row["profile"]) == list(bench_kernels.PASSES)
        for name, p in row["profile"].items():
            assert p["operator"] == bench_kernels.PASSES[name][0]
            assert p["over_copy"] == pytest.approx(p["median_s"] / copy)
            assert p["over_floor"] == pytest.approx(p["over_copy"] / p["floor_copies"])

    assert report["run"] == "manual-cpu"  # by hand; the pipeline passes its run

    env = report["environment"]
    assert set(ENVIRONMENT_KEYS) <= set(env)
    assert env["threads"]["torch"] == env["threads"]["numba"] == 1
    assert env["device"] == "cpu"
    assert env["git_commit"] is None or len(env["git_commit"]) == 40
    assert "2x3x4x4 bfloat16" in result.stdout and "speedup_vs_composite" in result.stdout


def test_every_round_times_every_contender_and_pass_in_a_shuffled_order(monkeypatch):
    """The contenders and passes of a row run interleaved: each round calls each once (after
    its untimed setup), in an order that changes from round to round."""
    calls = []
    timed = bench_kernels._timed

    def recording(shape, dtype, device):
        fns, setups = timed(shape, dtype, device)

        def record(name, fn):
            def run(*args):
                calls.append(name)
                return fn(*args)
            return run

        return {name: record(name, fn) for name, fn in fns.items()}, setups

    monkeypatch.setattr(bench_kernels, "_timed", recording)
    args = bench_kernels.parse_args(["--shapes", "2", "3", "4", "4", "--repeats", "2",
                                     "--warmup", "1"])
    row = bench_kernels._row((2, 3, 4, 4), "float32", torch.device("cpu"), args)
    names = [*MEASUREMENTS, *bench_kernels.PASSES]
    rounds = [calls[i:i + len(names)] for i in range(0, len(calls), len(names))]
    assert len(rounds) == 3  # warm-up + repeats
    assert all(sorted(r) == sorted(names) for r in rounds)
    assert len({tuple(r) for r in rounds}) == 3
    assert all(r["repeats"] == 2 for r in {**row["results"], **row["profile"]}.values())


def _results(**medians_ms):
    return {name: {"median_s": ms / 1e3} for name, ms in medians_ms.items()}


def test_ratios_come_from_the_medians():
    results = _results(inplace_abn_fwd_bwd_I=5.0, inplace_abn_fwd_bwd_II=4.0,
                       composite_fwd_bwd=20.0, aten_inplace_fwd_bwd=25.0,
                       whole_steps_fwd_bwd=2.0, inplace_abn_fwd_I=1.2, copy=1.0,
                       python_function_floor=3.0)
    assert bench_kernels.ratios(results) == pytest.approx({
        "speedup_vs_composite": 5.0, "speedup_vs_composite_I": 4.0,
        "fwd_bwd_over_traffic_floor": 4.0 / 3.5, "forward_over_copy": 1.2,
        "python_floor_over_composite": 0.15, "aten_inplace_over_composite": 1.25,
        "whole_steps_over_composite": 0.1})


@pytest.mark.parametrize("shape, speedup_goal, traffic_goals", [
    ((32, 256, 56, 56), 4.0, True), ((32, 512, 28, 28), 2.0, False),
    ((32, 1024, 14, 14), 2.0, False), ((32, 2048, 7, 7), 2.0, False),
    ((8, 64, 28, 28), 1.0, False), ((2, 3, 4, 4), 1.0, False)])
def test_goals_thresholds_follow_the_shape(shape, speedup_goal, traffic_goals):
    at = {"speedup_vs_composite": speedup_goal, "fwd_bwd_over_traffic_floor": 1.5,
          "forward_over_copy": 1.1}
    goals = bench_kernels.goals(shape, at)  # on the threshold: met
    expected = {"speedup_vs_composite": (speedup_goal, True)}
    if traffic_goals:  # the table shape only
        expected.update(fwd_bwd_over_traffic_floor=(1.5, True), forward_over_copy=(1.1, True))
    assert {n: (g["threshold"], g["met"]) for n, g in goals.items()} == expected
    worse = {"speedup_vs_composite": speedup_goal * 0.99, "fwd_bwd_over_traffic_floor": 1.51,
             "forward_over_copy": 1.11}
    assert not any(g["met"] for g in bench_kernels.goals(shape, worse).values())


def test_fwd_bwd_hands_the_incoming_gradient_over_and_the_layer_never_writes_it(monkeypatch):
    """The layer's backward gets a gradient no one else holds, as in a network, and still
    allocates its own: a backward never writes its incoming gradient (hooks may keep it)."""
    overwritten = spy_in_place_backward(monkeypatch)
    src, grad = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    c = bench_kernels.Contenders(src, grad)
    for variant in ("I", "II", "I", "II"):
        c.fwd_bwd(c.abn[variant])(c.fresh_input(c.abn[variant])())
    assert overwritten == []
    untouched = grad.clone()
    c.fwd_bwd(c.composite)(c.fresh_input(c.composite)())
    assert torch.equal(c.grad, untouched)  # the fixed gradient itself: only copies are handed


def test_fresh_inputs_are_the_source_and_pass_its_gradient_on():
    """Every run's input equals the source, whatever the previous run wrote over it, and its
    gradient reaches the source: the same input gradient from the layer as from the
    composite, run after run in the same reused memory."""
    src, grad = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randn(2, 3, 4, 4,
                                                                         dtype=torch.float64)
    c = bench_kernels.Contenders(src, grad)
    gradients = {}
    for name in ("composite", "II", "composite", "II", "I"):
        module = c.composite if name == "composite" else c.abn[name]
        x, box = c.fresh_input(module)()
        assert torch.equal(x, src) and x.requires_grad and x.grad_fn is not None
        c.backward(module(x), box)
        gradients.setdefault(name, []).append(c._base.grad.clone())
    reference = gradients["composite"][0]
    torch.testing.assert_close(gradients["composite"][1], reference, rtol=0, atol=0)
    for got in gradients["II"] + gradients["I"]:
        # the layers' scale is |weight| + eps where the composite's is weight (ones here)
        torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-6)


def test_python_function_floor_is_an_in_place_identity():
    """The floor contender does what an in-place layer's autograd function must, and nothing
    more: it returns its input's storage, versioned, and passes the gradient through."""
    base = torch.randn(2, 3, 4, 4, requires_grad=True)
    x = base * 2
    version = x._version
    out = bench_kernels.PythonFunctionFloor()(x)
    assert out.data_ptr() == x.data_ptr() and x._version > version  # mark_dirty bumps it
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.testing.assert_close(base.grad, grad * 2, rtol=0, atol=0)


@pytest.mark.parametrize("contender", ["AtenInPlaceABN", "WholeStepsABN"])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (6, 2, 7), (2, 40, 3, 3)])
def test_in_place_contender_is_in_place_abn(contender, shape):
    """The ATen path and the whole-step operators the benchmark times compute InPlace-ABN: in
    float64, their output, running statistics and gradients equal those of BN + leaky ReLU on
    the scale ``|weight| + eps`` through autograd (an independent reference), and they write
    their output into their input."""
    torch.manual_seed(0)
    channels = shape[1]
    options = dict(dtype=torch.float64)
    weight = torch.randn(channels, **options)
    bias, grad = torch.randn(channels, **options), torch.randn(shape, **options)
    base = torch.randn(shape, **options).mul_(3).add_(1).requires_grad_(True)

    layer = getattr(bench_kernels, contender)(channels, options)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    x = base * 1
    out = layer(x)
    assert out.data_ptr() == x.data_ptr()
    out.backward(grad.clone())  # a copy: the whole steps write their gradient over it

    reference_base = base.detach().clone().requires_grad_(True)
    reference_weight = weight.clone().requires_grad_(True)
    reference_bias = bias.clone().requires_grad_(True)
    running_mean, running_var = torch.zeros(channels, **options), torch.ones(channels, **options)
    y = torch.nn.functional.batch_norm(reference_base * 1, running_mean, running_var,
                                       reference_weight.abs() + bench_kernels.EPS,
                                       reference_bias, True, bench_kernels.MOMENTUM,
                                       bench_kernels.EPS)
    reference = torch.nn.functional.leaky_relu(y, bench_kernels.SLOPE)
    reference.backward(grad)

    torch.testing.assert_close(out.detach(), reference.detach())
    torch.testing.assert_close(layer.running_mean, running_mean)
    torch.testing.assert_close(layer.running_var, running_var)
    torch.testing.assert_close(base.grad, reference_base.grad)
    torch.testing.assert_close(layer.weight.grad, reference_weight.grad)
    torch.testing.assert_close(layer.bias.grad, reference_bias.grad)


def test_claims_report_lists_every_goal_of_every_run(tmp_path):
    from experiments.report import claims

    row_ratios = {"speedup_vs_composite": 4.5, "fwd_bwd_over_traffic_floor": 1.7,
                  "forward_over_copy": 1.05}
    row = {"shape": [32, 256, 56, 56], "dtype": "bfloat16", "tensor_bytes": 51380224,
           "results": {"copy": {"median_s": 1.3e-3, "effective_bandwidth_GBps": 79.04}},
           "ratios": row_ratios, "goals": bench_kernels.goals((32, 256, 56, 56), row_ratios)}
    write_json_atomic(tmp_path / "bench_kernels" / "smoke-cpu.json",
                      {"machine": "a CPU", "threads": 2, "rows": [row]})
    lines = claims.speed_goals(tmp_path)
    assert "| smoke-cpu | a CPU | 2 | 32x256x56x56 | bfloat16 | `speedup_vs_composite` >= 4 | " \
           "4.50 | 79.0 | **yes** |" in lines
    assert any("`fwd_bwd_over_traffic_floor` <= 1.5 | 1.70 | 79.0 | **no**" in line
               for line in lines)
    assert any("`forward_over_copy` <= 1.1 | 1.05 | 79.0 | **yes**" in line for line in lines)
    assert "No kernel benchmark yet." in claims.speed_goals(tmp_path / "none")
    del row["results"]  # an artifact without the copy's bandwidth
    write_json_atomic(tmp_path / "bench_kernels" / "smoke-cpu.json",
                      {"machine": "a CPU", "threads": 2, "rows": [row]})
    assert any("`forward_over_copy` <= 1.1 | 1.05 | not timed | **yes**" in line
               for line in claims.speed_goals(tmp_path))


def _sweep_report(speedups_by_dtype, family=(64, 28, 28), floor=None, aten=None, steps=None):
    """A report with one row per (dtype, batch) of ``speedups_by_dtype`` ({dtype: {batch:
    speedup}}), all of one ``family`` of channels and maps; ``floor(batch)``,
    ``aten(batch)`` and ``steps(batch)``: the row's ``python_floor_over_composite``,
    ``aten_inplace_over_composite`` and ``whole_steps_over_composite`` (``None``: an artifact
    that did not time it)."""
    itemsize = {"float32": 4, "bfloat16": 2}

    def ratios(batch, speedup):
        timed = {name: ratio(batch) for name, ratio in (("python_floor_over_composite", floor),
                                                         ("aten_inplace_over_composite", aten),
                                                         ("whole_steps_over_composite", steps))
                 if ratio is not None}
        return {"speedup_vs_composite": speedup, **timed}

    return {"machine": "a CPU", "threads": 2, "rows": [
        {"shape": [batch, *family], "dtype": dtype,
         "tensor_bytes": batch * math.prod(family) * itemsize[dtype],
         "ratios": ratios(batch, speedup),
         "goals": bench_kernels.goals((batch, *family), {"speedup_vs_composite": speedup})}
        for dtype, by_batch in speedups_by_dtype.items() for batch, speedup in by_batch.items()]}


def test_crossover_lies_between_the_last_slower_and_the_first_faster_size():
    from experiments.report import bench_kernels as report_bench

    report = _sweep_report({"float32": {16: 1.5, 2: 0.5, 4: 0.8, 8: 1.2},  # any order
                            "bfloat16": {2: 0.5, 4: 1.2, 8: 0.9, 16: 1.3}})
    rows = report_bench.crossover(report).set_index("dtype")
    assert rows.loc["float32", "family"] == "64x28x28" and rows.loc["float32", "sizes"] == 4
    assert rows.loc["float32", "slower_up_to"] == "4x64x28x28 (0.80 MB)"
    assert rows.loc["float32", "faster_from"] == "8x64x28x28 (1.61 MB)"
    # Slower again at a larger size: the crossover is above it, as measured.
    assert rows.loc["bfloat16", "slower_up_to"] == "8x64x28x28 (0.80 MB)"
    assert rows.loc["bfloat16", "faster_from"] == "16x64x28x28 (1.61 MB)"

    always = report_bench.crossover(_sweep_report({"float32": {2: 1.1, 4: 1.3}})).iloc[0]
    assert always["slower_up_to"] is None and always["faster_from"] == "2x64x28x28 (0.40 MB)"
    never = report_bench.crossover(_sweep_report({"float32": {2: 0.3, 4: 0.9},
                                                  "bfloat16": {2: 1.1, 4: 1.3}})).iloc[0]
    assert never["slower_up_to"] == "4x64x28x28 (0.80 MB)" and never["faster_from"] is None
    assert always["python_floor_at_smallest"] is None  # not timed
    assert always["aten_inplace_at_smallest"] is None
    assert always["whole_steps_at_smallest"] is None
    # The floor's share, the ATen path's and the whole steps' ratios at the smallest measured
    # size, whatever the rows' order.
    timed = report_bench.crossover(_sweep_report({"float32": {8: 1.2, 2: 0.5, 4: 0.8}},
                                                 floor=lambda batch: 1.0 / batch,
                                                 aten=lambda batch: 1.0 + batch,
                                                 steps=lambda batch: 0.1 * batch)).iloc[0]
    assert timed["python_floor_at_smallest"] == pytest.approx(0.5)
    assert timed["aten_inplace_at_smallest"] == pytest.approx(3.0)
    assert timed["whole_steps_at_smallest"] == pytest.approx(0.2)
    # A shape measured at one batch size only has no crossover.
    assert report_bench.crossover(_sweep_report({"float32": {8: 0.5}})).empty


def test_claims_report_states_the_crossover(tmp_path):
    from experiments.report import claims

    write_json_atomic(tmp_path / "bench_kernels" / "smoke-cpu.json",
                      _sweep_report({"bfloat16": {2: 0.5, 4: 1.2},
                                     "float32": {2: 0.5, 4: 0.9}}, floor=lambda batch: 0.6,
                                    aten=lambda batch: 2.25, steps=lambda batch: 0.95))
    lines = claims.speed_goals(tmp_path)
    assert "| smoke-cpu | bfloat16 | 64x28x28 | 2 | 2x64x28x28 (0.20 MB) | " \
           "4x64x28x28 (0.40 MB) | 0.60 | 2.25 | 0.95 |" in lines
    # Never as fast, beside a dtype that is: said so, not "nan".
    assert "| smoke-cpu | float32 | 64x28x28 | 2 | 4x64x28x28 (0.80 MB) | none measured | " \
           "0.60 | 2.25 | 0.95 |" in lines
    untimed = tmp_path / "untimed"
    write_json_atomic(untimed / "bench_kernels" / "smoke-cpu.json",
                      _sweep_report({"bfloat16": {2: 0.5, 4: 1.2}}))
    assert "| smoke-cpu | bfloat16 | 64x28x28 | 2 | 2x64x28x28 (0.20 MB) | " \
           "4x64x28x28 (0.40 MB) | not timed | not timed | not timed |" \
        in claims.speed_goals(untimed)
    single = tmp_path / "single"
    write_json_atomic(single / "bench_kernels" / "smoke-cpu.json",
                      _sweep_report({"bfloat16": {2: 0.5}}))
    assert not any("crossover" in line for line in claims.speed_goals(single))


@pytest.mark.parametrize("args, message", [
    (["--shapes", "2", "0", "8", "8"], "--shapes 2 0 8 8: every size must be >= 1"),
    (["--shapes", "1", "4", "1", "1"], "more than one value per channel"),
    (["--shapes", "2", "4", "8", "8", "2", "4"], "--shapes 2 4 8 8 2 4: expected groups of four"),
    (["--shapes", "2", "4", "8", "8", "2", "4", "8", "8"], "each shape once"),
    (["--repeats", "0"], "--repeats"),
    (["--warmup", "-1"], "--warmup"),
    (["--threads", "0"], "--threads"),
    (["--dtypes", "float32", "float32"], "--dtypes float32 float32: each dtype once"),
    (["--dtypes", "int8"], "--dtypes"),
])
def test_bench_kernels_rejects_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as error:
        bench_kernels.parse_args(args)
    assert error.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_kernels_default_shapes_are_the_tables():
    args = bench_kernels.parse_args([])
    assert args.shapes == [(32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14),
                           (32, 2048, 7, 7), (8, 64, 28, 28), (2, 64, 28, 28),
                           (4, 64, 28, 28), (16, 64, 28, 28), (32, 64, 28, 28),
                           (64, 64, 28, 28), (2, 48, 8, 8), (8, 48, 8, 8), (32, 48, 8, 8),
                           (128, 48, 8, 8)]


def test_bench_kernels_artifact_is_named_by_its_run():
    """Like every artifact, one file per run (<profile>-<device>): two profiles on one device
    do not share a benchmark (experiments/records/paths.py)."""
    from experiments.records import paths

    args = bench_kernels.parse_args(["--run", "paper-cpu"])
    assert args.out == Path(paths.bench_kernels_json("paper-cpu"))
    assert args.out == Path("artifacts/bench_kernels/paper-cpu.json")
    assert bench_kernels.parse_args([]).out == Path("artifacts/bench_kernels/manual-cpu.json")


@pytest.mark.parametrize("run", ["smoke-cuda", "smoke", "Smoke-cpu", "smoke_cpu"])
def test_bench_kernels_rejects_a_run_of_another_device(run, capsys):
    with pytest.raises(SystemExit) as error:
        bench_kernels.parse_args(["--run", run, "--device", "cpu"])
    assert error.value.code == 2
    assert f"--run {run}: must be <profile>-cpu" in capsys.readouterr().err


def test_bench_kernels_names_device_when_cuda_is_missing(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is available")
    with pytest.raises(SystemExit):
        bench_kernels.parse_args(["--device", "cuda"])
    err = capsys.readouterr().err
    assert "--device" in err and "cuda" in err


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
