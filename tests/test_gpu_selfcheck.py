"""The GPU self-check (experiments/gpu_selfcheck/) where it can be tested without a GPU.

* the report writer, a pure function of the recorded JSON, on hand-made recorded inputs;
* the command line on a machine without a GPU: the message, exit status 0, nothing written;
  and the artifacts written whole or not at all;
* the check machinery on CPU tensors (the comparison and its tolerances, the records, a wrong
  or failing layer, a dtype the layers refuse), the timing ratios, the layer-test runner and
  the device switch of tests/conftest.py;
* on a machine with a GPU, also a few checks and a timing point on CUDA tensors.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.gpu_selfcheck import checks, cli, layer_tests, parallel, report, timing

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()


# --------------------------------------------------------------------------- recorded inputs
def check_record(name, status, max_abs=1e-7, bound=1e-5, message=None):
    return {"name": name, "case": {"name": name.split(":")[0]}, "reference": "cpu_kernels",
            "reference_dtype": "float32", "quantity": name.split(": ")[1].split(" ")[0],
            "status": status, "max_abs_error": max_abs,
            "max_rel_error": None if max_abs is None else max_abs / 2, "bound": bound,
            "atol": 1e-6, "rtol": 1e-4, "message": message}


def ratio(value, floor, goal):
    return {"value": value, "floor": floor, "goal": goal, "goal_met": value <= goal,
            "below_floor": value < floor}


def timing_point(shape, dtype, forward, backward_i, backward_ii, fits_in_l2=False):
    copy_s = 1e-4
    return {"shape": shape, "dtype": dtype, "layout": "contiguous", "tensor_bytes": 1 << 28,
            "fits_in_l2": fits_in_l2, "status": "pass",
            "results": {"copy": {"median_s": copy_s, "min_s": copy_s, "max_s": copy_s,
                                 "repeats": 5}},
            "copy_bandwidth_GBps": 2684.4,
            "ratios": {"forward_over_copy": ratio(forward, 1.5, 1.7),
                       "backward_I_over_copy": ratio(backward_i, 2.5, 2.8),
                       "backward_II_over_copy": ratio(backward_ii, 2.5, 2.8)},
            "speedup_vs_batch_norm_act": {"I": 1.91, "II": 2.04}}


def recorded_result():
    """A self-check result as the JSON holds it: 6 checks (3 pass, a failure, an error, a
    skip), 2 failed layer tests, 3 timing points (one with every goal met, one missing two and
    below a floor, one that could not run)."""
    return json.loads(json.dumps({
        "selfcheck": "gpu_selfcheck",
        "settings": {"quick": False, "warmup": 5, "repeats": 25,
                     "bounds": {"forward_over_copy": {"floor": 1.5, "goal": 1.7},
                                "backward_I_over_copy": {"floor": 2.5, "goal": 2.8},
                                "backward_II_over_copy": {"floor": 2.5, "goal": 2.8}}},
        "environment": {"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.14.1",
                        "cuda_runtime": "13.0", "numba": "0.68.1", "git_commit": "0123456789abcdef",
                        "date_utc": "2026-01-02T03:04:05+00:00",
                        "gpu": {"capability": "9.0", "cudnn": 91000}},
        "layer_tests": {"status": "fail", "test_files": ["tests/test_abn.py"], "marker": "kernels",
                        "environment": {"LAYERS_TEST_DEVICE": "cuda"}, "returncode": 1,
                        "timed_out": False, "total": 75, "passed": 71, "failed": 2, "errors": 0,
                        "skipped": 2, "failures": ["test_abn::test_any_rank[ABN-2d]",
                                                   "test_abn::test_sum_backward"],
                        "duration_s": 30.0, "output_tail": "..."},
        "checks": [
            check_record("ABN/elu/float32/contiguous/train: output vs cpu_kernels", "pass"),
            check_record("ABN/elu/float32/contiguous/train: grad_input vs cpu_kernels", "pass"),
            check_record("InPlaceABN-I/elu/float16/channels_last/train: grad_weight vs "
                         "torch_batch_norm", "fail", max_abs=0.25, bound=0.01),
            check_record("InPlaceABN-II/identity/bfloat16/contiguous/eval: run vs layer",
                         "error", max_abs=None, bound=None,
                         message="RuntimeError: CUDA error | launch failed"),
            check_record("ABN/identity/float64/contiguous/eval: output vs torch_batch_norm",
                         "pass"),
            check_record("ABN/identity/float64/channels_last/eval: run vs cpu_kernels",
                         "skipped", max_abs=None, bound=None,
                         message="the layers refuse float64 on cuda: TypeError: ..."),
        ],
        "timings": [
            timing_point([32, 256, 56, 56], "float32", 1.62, 2.71, 2.65),
            timing_point([8, 64, 28, 28], "float16", 1.41, 3.10, 2.95, fits_in_l2=True),
            {"shape": [32, 2048, 7, 7], "dtype": "bfloat16", "layout": "channels_last",
             "status": "error", "message": "OutOfMemoryError: CUDA out of memory"},
        ],
        "durations_s": {"checks": 40.0, "layer_tests": 30.0, "timings": 20.0, "total": 61.0},
    }))


def passing_result():
    result = recorded_result()
    result["checks"] = [c for c in result["checks"] if c["status"] == "pass"]
    result["layer_tests"].update(status="pass", failed=0, failures=[], returncode=0)
    result["timings"] = result["timings"][:1]
    return result


# --------------------------------------------------------------------------- the report
def section(markdown, title):
    return markdown.split(f"## {title}")[1].split("\n## ")[0]


def test_report_counts_and_lists_the_failures():
    markdown = report.render_markdown(recorded_result())
    assert markdown.startswith("# GPU self-check: NVIDIA H100 80GB HBM3\n")
    assert "commit 0123456789ab" in markdown and "compute capability 9.0" in markdown
    assert "**FAILED.** Checks: **3 of 6 passed, 2 failed** (1 of them errors), 1 skipped." \
        in markdown
    assert "(`LAYERS_TEST_DEVICE=cuda pytest -m kernels tests/test_abn.py`): **71 passed, " \
        "2 failed**, 2 skipped" in markdown
    failures = section(markdown, "Failures")
    assert "none" not in failures.split("|")[0]
    rows = [line for line in failures.splitlines() if line.startswith("| InPlaceABN")]
    assert len(rows) == 2
    assert rows[0].startswith("| InPlaceABN-I/elu/float16/channels_last/train: grad_weight vs "
                              "torch_batch_norm | fail | 0.25 | 0.125 | 0.01 |")
    assert "| error |" in rows[1] and "CUDA error \\| launch failed" in rows[1]
    assert "Skipped (1 check(s)): the layers refuse float64 on cuda" in failures
    assert "- `test_abn::test_any_rank[ABN-2d]`" in failures
    assert "- `test_abn::test_sum_backward`" in failures
    assert "ABN/elu/float32/contiguous/train" not in failures  # passed checks are not listed


def test_report_timing_table_against_floors_and_goals():
    markdown = report.render_markdown(recorded_result())
    assert "Timing goals met: **4 of 6**" in markdown
    assert "1 ratio(s) below their floor" in markdown
    assert "1 timing point(s) failed to run" in markdown
    rows = {line.split(" | ")[0][2:]: line for line in section(markdown, "Timing").splitlines()
            if line.startswith("| 32x") or line.startswith("| 8x")}
    assert "| 0.100 | 2684 | 1.62 ✓ | 2.71 ✓ | 2.65 ✓ | 1.91 | 2.04 |" in rows["32x256x56x56"]
    assert "| 1.41 ✓ (below floor) | 3.10 ✗ | 2.95 ✗ |" in rows["8x64x28x28*"]
    assert "error: OutOfMemoryError: CUDA out of memory" in rows["32x2048x7x7"]
    header = [line for line in section(markdown, "Timing").splitlines()
              if line.startswith("| shape")][0]
    for row in rows.values():  # every row has the header's columns
        assert row.count(" |") == header.count(" |"), row
    assert "Median of 25 runs after 5 warm-up runs" in markdown


def test_report_of_a_clean_run():
    result = passing_result()
    markdown = report.render_markdown(result)
    assert "**PASSED.** Checks: **3 of 3 passed, 0 failed**." in markdown
    assert section(markdown, "Failures").strip() == "none"
    assert "Timing goals met: **3 of 3**" in markdown and "below their floor" not in markdown
    summary = report.summarize(result)
    assert summary["ok"] and summary["checks"] == {"pass": 3, "fail": 0, "error": 0,
                                                   "skipped": 0}


def test_summary_is_not_ok_for_each_kind_of_failure():
    assert not report.summarize(recorded_result())["ok"]
    for breaks in (lambda r: r["checks"][0].update(status="fail"),
                   lambda r: r["checks"][0].update(status="error"),
                   lambda r: r["layer_tests"].update(status="fail"),
                   lambda r: r["timings"].append({"status": "error", "message": "x"})):
        result = passing_result()
        breaks(result)
        assert not report.summarize(result)["ok"]
    result = passing_result()
    result["layer_tests"] = None  # not run: not a failure, and the report says so
    assert report.summarize(result)["ok"]
    assert "Layer tests on CUDA: not run." in report.render_markdown(result)


def test_layer_tests_that_could_not_run_are_reported_not_failed():
    result = passing_result()
    result["layer_tests"] = layer_tests.not_run("pytest is not installed (pip install -e '.[dev]')")
    assert report.summarize(result)["ok"]
    assert "Layer tests on CUDA: not run: pytest is not installed" \
        in report.render_markdown(json.loads(json.dumps(result)))
    assert layer_tests.unavailable() is None  # this checkout has pytest and its tests
    assert "none of tests/test_abn.py, tests/test_abn_dtypes.py exists" \
        in layer_tests.unavailable(root=Path("/nonexistent"))


def test_long_failure_lists_are_cut_to_one_page():
    result = recorded_result()
    result["checks"] = [check_record(f"ABN/elu/float32/contiguous/train: output vs x{i}", "fail")
                        for i in range(report.MAX_FAILURE_ROWS + 7)]
    markdown = report.render_markdown(result)
    assert markdown.count("| fail |") == report.MAX_FAILURE_ROWS
    assert "... and 7 more failures: see the JSON file" in markdown


@pytest.mark.parametrize("name, stem", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA_GeForce_RTX_4090"),
    ("Tesla V100-SXM2-16GB", "Tesla_V100-SXM2-16GB"),
    ("../../etc/passwd", "etc_passwd"),
    ("  weird/name\\with:chars*  ", "weird_name_with_chars"),
    ("", "unknown_gpu"),
    (None, "unknown_gpu"),
])
def test_artifact_stem(name, stem):
    assert report.artifact_stem(name) == stem


# --------------------------------------------------------------------------- command line
def test_cli_without_a_gpu_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cli, "run_selfcheck", lambda *a, **k: pytest.fail("ran without a GPU"))
    out = tmp_path / "selfcheck"
    assert cli.main(["--out", str(out)]) == 0
    assert "no CUDA GPU on this machine" in capsys.readouterr().out
    assert not out.exists()


def test_module_without_a_gpu_exits_cleanly(tmp_path):
    out = tmp_path / "selfcheck"
    run = subprocess.run([sys.executable, "-m", "experiments.gpu_selfcheck", "--out", str(out)],
                         cwd=tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to " \
           "check" in run.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_refuses_a_file_as_out(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        cli.parse_args(["--out", str(tmp_path / "file")])


def test_cli_jobs(capsys):
    assert cli.parse_args([]).jobs == 1
    assert cli.parse_args(["--jobs", "16"]).jobs == 16
    with pytest.raises(SystemExit):
        cli.parse_args(["--jobs", "0"])
    assert "--jobs 0: must be at least 1" in capsys.readouterr().err


def test_artifacts_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    result = recorded_result()
    json_path, md_path = cli.write_artifacts(result, tmp_path / "out")
    assert json_path == tmp_path / "out" / "NVIDIA_H100_80GB_HBM3.json"
    assert md_path == tmp_path / "out" / "NVIDIA_H100_80GB_HBM3.md"
    assert json.loads(json_path.read_text()) == result
    assert md_path.read_text() == report.render_markdown(result)  # a function of the JSON
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "NVIDIA_H100_80GB_HBM3.json", "NVIDIA_H100_80GB_HBM3.md"]

    bad = copy.deepcopy(result)
    bad["timings"][0]["copy_bandwidth_GBps"] = float("nan")  # strict JSON refuses it
    with pytest.raises(ValueError):
        cli.write_artifacts(bad, tmp_path / "nan")
    assert not (tmp_path / "nan").exists() or list((tmp_path / "nan").iterdir()) == []

    def broken(_):
        raise RuntimeError("report failed")

    monkeypatch.setattr(report, "render_markdown", broken)
    with pytest.raises(RuntimeError):
        cli.write_artifacts(result, tmp_path / "broken")
    assert not (tmp_path / "broken").exists()


def test_cli_with_a_gpu_writes_both_files_and_fails_on_failed_checks(tmp_path, monkeypatch,
                                                                     capsys):
    """The GPU path of main() with the measurement replaced by the recorded result."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cli, "run_selfcheck", lambda settings, jobs: recorded_result())
    assert cli.main(["--out", str(tmp_path), "--quick"]) == 1
    assert "FAILED; checks 3 passed, 2 failed, 1 skipped" in capsys.readouterr().out
    assert (tmp_path / "NVIDIA_H100_80GB_HBM3.md").is_file()
    asked = []
    monkeypatch.setattr(cli, "run_selfcheck",
                        lambda settings, jobs: asked.append(jobs) or passing_result())
    assert cli.main(["--out", str(tmp_path), "--jobs", "3"]) == 0
    assert asked == [3]


# --------------------------------------------------------------------------- parallel checks
def test_slices_cut_the_case_list_by_dtype_layout_and_layer():
    case_list = checks.cases()
    parts = parallel.slices(case_list)
    assert len(parts) == len(checks.DTYPES) * len(checks.LAYOUTS) * len(checks.LAYERS)
    assert sorted((c.name for part in parts for c in part)) == sorted(c.name for c in case_list)
    for part in parts:
        assert len({(c.dtype, c.layout, c.layer, c.variant) for c in part}) == 1


def test_parallel_checks_give_the_serial_records():
    """Two slices (ABN's cases, first and third, and InPlaceABN's) in two worker processes,
    each compiling into a cache of its own: the same records as one process, in the case
    list's order."""
    abn = dict(layer="ABN", variant=None, dtype="float64", layout="contiguous", training=False)
    case_list = [case(**abn, activation="identity", param=None),
                 case(dtype="float64", layout="contiguous", activation="identity", param=None,
                      training=False),
                 case(**abn, activation="leaky_relu", param=0.01)]
    serial = checks.run_checks(SHAPE, "cpu", case_list)
    progress = []
    records = parallel.run_checks(SHAPE, "cpu", case_list, jobs=2,
                                  progress=lambda items: progress.extend(items) or items)
    assert progress == [0, 1]
    assert [r["name"] for r in records] == [r["name"] for r in serial]
    assert all(r["status"] == "pass" for r in records)
    for got, want in zip(records, serial):
        if want["max_abs_error"] is None:  # a case that compares nothing: none in both
            assert got["max_abs_error"] is None
        else:
            assert got["max_abs_error"] == pytest.approx(want["max_abs_error"], rel=1e-6,
                                                         abs=1e-15)


def test_selfcheck_with_jobs_runs_the_layer_tests_beside_the_parallel_checks(monkeypatch):
    events = []

    class Tests:
        def __init__(self, device, timeout):
            events.append("tests started")

        def result(self):
            events.append("tests waited for")
            return {"status": "pass", "duration_s": 1.0}

    def parallel_checks(shape, device, case_list, jobs, progress=None):
        events.append(f"checks in {jobs} processes")
        return []

    monkeypatch.setattr(layer_tests, "unavailable", lambda: None)
    monkeypatch.setattr(layer_tests, "Run", Tests)
    monkeypatch.setattr(parallel, "run_checks", parallel_checks)
    monkeypatch.setattr(checks, "run_checks", lambda *a, **k: pytest.fail("ran serially"))
    monkeypatch.setattr(timing, "run_timings", lambda *a, **k: [])
    result = cli.run_selfcheck(cli.QUICK, "cpu", jobs=3)
    assert events == ["tests started", "checks in 3 processes", "tests waited for"]
    assert result["settings"]["jobs"] == 3 and result["layer_tests"]["status"] == "pass"


def test_a_worker_that_dies_leaves_an_error_record_per_case(monkeypatch):
    monkeypatch.setattr(parallel, "_command", lambda spec, out: [
        sys.executable, "-c", "import sys; print('worker broke'); sys.exit(3)"])
    case_list = [case(), case(dtype="float64")]
    records = parallel.run_checks(SHAPE, "cpu", case_list, jobs=1)
    assert [(r["case"]["name"], r["status"]) for r in records] == [
        (c.name, "error") for c in case_list]
    assert "exited with status 3" in records[0]["message"]
    assert "worker broke" in records[0]["message"]
    with pytest.raises(ValueError, match="jobs=0"):
        parallel.run_checks(SHAPE, "cpu", case_list, jobs=0)
    with pytest.raises(ValueError, match="named once"):
        parallel.run_checks(SHAPE, "cpu", [case(), case()], jobs=2)


# --------------------------------------------------------------------------- comparisons
def test_compare_passes_within_the_bound_only():
    expected = torch.tensor([1.0, -2.0, 4.0])
    result = checks.compare(expected + torch.tensor([0.0, 0.0, 3e-4]), expected, 0.0, 1e-4)
    assert result["status"] == "pass"
    assert result["bound"] == pytest.approx(4e-4)
    assert result["max_abs_error"] == pytest.approx(3e-4, rel=1e-3)
    assert result["max_rel_error"] == pytest.approx(3e-4 / 4, rel=1e-3)
    result = checks.compare(expected + torch.tensor([0.0, 5e-4, 0.0]), expected, 0.0, 1e-4)
    assert result["status"] == "fail" and result["max_abs_error"] > result["bound"]


def test_compare_fails_on_shape_and_non_finite_mismatches():
    expected = torch.tensor([1.0, float("nan"), float("inf")])
    assert checks.compare(expected.clone(), expected, 0, 1e-4)["status"] == "pass"
    for actual in (torch.tensor([1.0, 2.0, float("inf")]), torch.tensor([1.0, float("nan"), 3.0]),
                   torch.tensor([1.0, float("nan"), -float("inf")])):
        result = checks.compare(actual, expected, 0, 1e-4)
        assert result["status"] == "fail" and "non-finite" in result["message"]
    result = checks.compare(torch.zeros(3), torch.zeros(2), 0, 1e-4)
    assert result["status"] == "fail" and "shape" in result["message"]
    zeros = checks.compare(torch.zeros(2), torch.zeros(2), 0, 1e-4)
    assert zeros["status"] == "pass" and zeros["max_rel_error"] is None


def test_compare_takes_any_dtype_and_device():
    expected = torch.randn(4, 5, dtype=torch.float64)
    result = checks.compare(expected.to(torch.bfloat16), expected, *checks.TOLERANCES["bfloat16"])
    assert result["status"] == "pass" and result["max_abs_error"] > 0
    assert checks.compare(expected.float(), expected, *checks.TOLERANCES["float64"])["status"] \
        == "fail"  # float32 rounding is far outside float64's tolerance


def test_tolerances_of_statistics_follow_their_float32_storage():
    assert checks.tolerance("float16", "running_var") == checks.TOLERANCES["float32"]
    assert checks.tolerance("float16", "grad_input") == checks.TOLERANCES["float16"]
    assert checks.tolerance("float64", "running_mean") == checks.TOLERANCES["float64"]


def test_the_check_matrix():
    every = checks.cases()
    assert len(every) == len(checks.DTYPES) * len(checks.LAYOUTS) * 3 * 3 * 2 == 144
    assert len({c.name for c in every}) == 144
    assert {c.dtype for c in every} == {"float32", "float16", "bfloat16", "float64"}
    assert {(c.layer, c.variant) for c in every} == {("ABN", None), ("InPlaceABN", "I"),
                                                     ("InPlaceABN", "II")}
    with pytest.raises(ValueError, match="float8"):
        checks.cases(dtypes=("float8",))
    with pytest.raises(ValueError, match="strided"):
        checks.cases(layouts=("strided",))


# --------------------------------------------------------------------------- checks on the CPU
SHAPE = (3, 4, 5, 6)


def case(layer="InPlaceABN", variant="II", activation="elu", param=1.0, dtype="float32",
         layout="channels_last", training=True):
    return checks.Case(layer, variant, activation, param, dtype, layout, training)


def by_key(records):
    return {(r["reference"], r["quantity"]): r for r in records}


@pytest.mark.parametrize("the_case", [
    case(),
    case(layer="ABN", variant=None, activation="leaky_relu", param=0.01, layout="contiguous",
         training=False),
    case(variant="I", activation="identity", param=None, dtype="bfloat16"),
    case(dtype="float64", layout="contiguous"),
], ids=lambda c: c.name)
def test_a_case_on_the_cpu_passes_every_check(the_case):
    records = checks.run_case(the_case, checks.make_data(SHAPE), "cpu")
    keyed = by_key(records)
    expected = {(ref, q) for ref in checks.REFERENCES for q in checks.QUANTITIES}
    expected.add(("input", "layout"))
    if the_case.layer == "InPlaceABN":
        expected.add(("input", "in_place"))
    assert set(keyed) == expected
    failed = [r["name"] for r in records if r["status"] != "pass"]
    assert not failed
    record = keyed[("torch_batch_norm", "grad_weight")]
    assert record["name"] == f"{the_case.name}: grad_weight vs torch_batch_norm"
    assert record["case"]["dtype"] == the_case.dtype and record["reference_dtype"] == the_case.dtype
    assert record["bound"] >= record["max_abs_error"] >= 0
    assert (record["atol"], record["rtol"]) == checks.TOLERANCES[the_case.dtype]
    json.dumps(records, allow_nan=False)


def test_a_wrong_result_fails_its_checks(monkeypatch):
    """The torch reference perturbed in its input gradient and running variance: exactly those
    two comparisons fail, with their errors."""
    original = checks.torch_reference

    def perturbed(*args):
        out = original(*args)
        out["grad_input"] = out["grad_input"] * 1.01
        out["running_var"] = out["running_var"] + 1e-3
        return out

    monkeypatch.setattr(checks, "torch_reference", perturbed)
    records = checks.run_case(case(), checks.make_data(SHAPE), "cpu")
    failed = {(r["reference"], r["quantity"]) for r in records if r["status"] == "fail"}
    assert failed == {("torch_batch_norm", "grad_input"), ("torch_batch_norm", "running_var")}
    record = by_key(records)[("torch_batch_norm", "running_var")]
    assert record["max_abs_error"] == pytest.approx(1e-3, rel=1e-3)
    assert report.summarize({"checks": records})["checks"]["fail"] == 2


def test_a_layer_that_raises_is_an_error_record(monkeypatch):
    def raising(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(checks, "run_layer", raising)
    records = checks.run_case(case(), checks.make_data(SHAPE), "cpu")
    assert [(r["status"], r["quantity"]) for r in records] == [("error", "run")]
    assert "RuntimeError: kernel launch failed" in records[0]["message"]


def test_run_checks_records_a_case_that_raises_and_goes_on(monkeypatch):
    def accepts(device, dtype):
        if dtype == torch.float16:
            raise RuntimeError("NVVM failed to compile")
        return True, None

    monkeypatch.setattr(checks, "accepts", accepts)
    the_cases = checks.cases(dtypes=("float16", "float32"), activations=(("identity", None),),
                             layer_kinds=(("ABN", None),), modes=(True,),
                             layouts=("contiguous",))
    records = checks.run_checks(SHAPE, "cpu", the_cases)
    assert records[0]["status"] == "error" and "NVVM failed" in records[0]["message"]
    assert records[0]["case"]["dtype"] == "float16"
    assert {r["status"] for r in records[1:]} == {"pass"} and len(records) > 10


def test_a_refused_dtype_is_skipped(monkeypatch):
    monkeypatch.setattr(checks, "accepts", lambda device, dtype: (False, "TypeError: no"))
    records = checks.run_case(case(dtype="float16"), checks.make_data(SHAPE), "cpu")
    assert {r["status"] for r in records} == {"skipped"}
    assert {r["reference"] for r in records} == set(checks.REFERENCES)
    assert "the layers refuse float16 on cpu: TypeError: no" in records[0]["message"]


def test_the_layers_refusal_is_detected():
    checks._ACCEPTS.pop(("cpu", torch.int32), None)
    accepted, reason = checks.accepts("cpu", torch.int32)
    assert not accepted and reason.startswith("TypeError")
    assert checks.accepts("cpu", torch.float32) == (True, None)


def test_cpu_reference_falls_back_to_float32_for_16_bit(monkeypatch):
    """Where the CPU kernels do not take a 16-bit dtype, the CPU reference runs float32 on the
    same values, within the 16-bit tolerance."""
    monkeypatch.setattr(checks, "cpu_reference_dtype", lambda dtype: torch.float32)
    records = checks.run_case(case(dtype="bfloat16"), checks.make_data(SHAPE), "cpu")
    cpu = [r for r in records if r["reference"] == "cpu_kernels"]
    assert {r["reference_dtype"] for r in cpu} == {"float32"}
    assert all(r["status"] == "pass" for r in records)
    assert any(r["max_abs_error"] > 0 for r in cpu)  # a real comparison, not 16-bit vs itself


def test_run_checks_wants_four_dimensions():
    with pytest.raises(ValueError, match="channels_last"):
        checks.run_checks((4, 3, 5), "cpu")


# --------------------------------------------------------------------------- timing
def test_ratios_against_floors_and_goals():
    results = {name: {"median_s": seconds} for name, seconds in (
        ("copy", 1.0), ("forward", 1.6), ("backward_I", 2.9), ("backward_II", 2.4),
        ("fwd_bwd_I", 5.0), ("fwd_bwd_II", 4.0), ("batch_norm_act", 8.0))}
    bounds, speedups = timing.ratios(results)
    assert bounds["forward_over_copy"] == {"value": 1.6, "floor": 1.5, "goal": 1.7,
                                           "goal_met": True, "below_floor": False}
    assert bounds["backward_I_over_copy"]["goal_met"] is False
    assert bounds["backward_II_over_copy"]["below_floor"] is True
    assert bounds["backward_II_over_copy"]["goal_met"] is True
    assert speedups == {"I": pytest.approx(1.6), "II": pytest.approx(2.0)}


def test_a_timing_point_on_the_cpu():
    point = timing.time_point((2, 3, 4, 5), "float16", "channels_last", "cpu", warmup=1,
                              repeats=2)
    assert point["status"] == "pass" and point["tensor_bytes"] == 2 * 3 * 4 * 5 * 2
    assert list(point["results"]) == list(timing.CONTENDERS)
    assert set(point["ratios"]) == set(timing.BOUNDS)
    json.dumps(point, allow_nan=False)
    errors = timing.run_timings([(2, 3, 4)], ["float32"], ["channels_last"], "cpu", 0, 1)
    assert errors[0]["status"] == "error" and errors[0]["message"]


# --------------------------------------------------------------------------- layer tests
PROBE_TESTS = '''
import pytest
kernels = pytest.mark.kernels

@kernels
def test_passes():
    pass

@kernels
def test_fails():
    assert False, "broken on purpose"

@kernels
def test_skipped():
    pytest.skip("not here")

def test_not_selected():
    assert False
'''


def test_layer_test_run_summarises_pytest(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE_TESTS)
    result = layer_tests.Run("cpu", test_files=("test_probe.py", "test_missing.py"),
                             root=tmp_path).result()
    assert result["status"] == "fail" and result["returncode"] == 1
    assert (result["total"], result["passed"], result["failed"], result["skipped"]) \
        == (3, 1, 1, 1)
    assert result["failures"] == ["test_probe::test_fails"]
    assert "broken on purpose" in result["output_tail"]
    assert result["environment"] == {"LAYERS_TEST_DEVICE": "cpu"}
    assert result["test_files"] == ["test_probe.py"]  # the files that exist


def test_layer_test_summary_needs_tests_that_ran():
    counts = {"total": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    assert layer_tests.summarise(["pytest"], "cuda", 5, counts, "", 1.0)["status"] == "fail"
    assert layer_tests.summarise(["pytest"], "cuda", 0, None, "", 1.0)["status"] == "fail"
    counts.update(total=1, passed=1)
    assert layer_tests.summarise(["pytest"], "cuda", 0, counts, "", 1.0)["status"] == "pass"


DEVICE_PROBE = '''
import os
import torch

def test_tensors_are_made_on_the_test_device():
    device = os.environ.get("LAYERS_TEST_DEVICE", "cpu")
    assert torch.zeros(1).device.type == device
    generator = torch.Generator().manual_seed(0)
    assert generator.device.type == device
    assert torch.randn(3, generator=generator).device.type == device
    assert torch.nn.Linear(2, 2).weight.device.type == device
'''


def run_device_probe(tmp_path, device):
    """pytest on a probe test beside a copy of tests/conftest.py, with LAYERS_TEST_DEVICE."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_device_probe.py").write_text(DEVICE_PROBE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "LAYERS_TEST_DEVICE": device}, timeout=300)


def test_conftest_device_switch(tmp_path):
    run = run_device_probe(tmp_path, "cpu")
    assert run.returncode == 0, run.stdout + run.stderr
    run = run_device_probe(tmp_path, "gpu")
    assert run.returncode != 0 and "LAYERS_TEST_DEVICE='gpu' is not supported" in run.stderr
    run = run_device_probe(tmp_path, "cuda")
    if CUDA:
        assert run.returncode == 0, run.stdout + run.stderr
    else:
        assert run.returncode != 0 and "no CUDA GPU is available" in run.stderr


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", list(checks.DTYPES))
def test_cuda_kernels_pass_the_checks(dtype):
    the_cases = checks.cases(dtypes=(dtype,), activations=(("elu", 1.0),), modes=(True,))
    records = checks.run_checks((4, 8, 9, 11), "cuda", the_cases)
    assert [r["name"] for r in records if r["status"] != "pass"] == []


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_a_timing_point_on_cuda():
    point = timing.time_point((8, 64, 28, 28), "float16", "contiguous", "cuda", warmup=1,
                              repeats=3, l2_bytes=1 << 20)
    assert point["status"] == "pass" and point["fits_in_l2"] is False
    assert all(r["median_s"] > 0 for r in point["results"].values())
