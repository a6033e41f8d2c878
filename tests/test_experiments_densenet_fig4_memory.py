"""The DenseNet Fig. 4 experiment: memory of one training step per implementation and depth."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.cuda._utils import _get_device_index

from experiments import densenet_fig4_memory as fig4
from experiments.measure import step as measure
from experiments.records import point

ROOT = Path(__file__).resolve().parents[1]
#: A DenseNet-BC of one layer per block, k = 4, on 8x8 inputs: a point in a few seconds.
TINY = ["--depth", "10", "--growth-rate", "4", "--batch", "2", "--size", "8"]


def test_one_point_writes_a_complete_artifact(tmp_path):
    out = tmp_path / "shared_d10.json"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.densenet_fig4_memory", "--impl", "shared", *TINY,
         "--budget-gib", "12", "--warmup", "0", "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["shared_d10.json"]
    report = json.loads(out.read_text())
    config = report["config"]
    assert (config["impl"], config["model"], config["depth"], config["growth_rate"],
            config["batch"], config["size"]) == ("shared", "densenet_bc", 10, 4, 2, 8)
    assert (config["memory_budget_gib"], config["budget_bytes"]) == (12, 12 * 2 ** 30)
    assert config["budget_enforced"] is False and config["peak"] is True
    [record] = report["results"]
    assert record["status"] == fig4.OK and record["error"] is None
    assert record["saved_bytes"] == record["saved_tensor_bytes"] + record["shared_storage_bytes"]
    assert record["shared_storage_bytes"] > 0
    assert record["saved_bytes"] >= record["lower_bound_bytes"] > 0
    assert record["peak_method"] == "tensor_tracker" and record["peak_bytes"] > 0
    assert record["peak_total_bytes"] == record["peak_baseline_bytes"] + record["peak_bytes"]
    assert 0 < record["min_s"] <= record["median_s"] <= record["max_s"]
    assert record["param_count"] == measure.architecture(
        measure.cifar_spec("shared", 10, 4), (2, 3, 8, 8))["param_count"]
    assert "lower bound" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--impl", "fast", *TINY], "invalid choice: 'fast'"),
    (["--impl", "naive", "--depth", "41"], "depth=41"),
    (["--impl", "naive", "--depth", "40", "--batch", "0"], "--batch 0: must be >= 1"),
    (["--impl", "naive", "--depth", "40", "--budget-gib", "0"], "--budget-gib 0.0: must be > 0"),
    (["--impl", "naive", "--depth", "40", "--batch", "1", "--size", "4"], "size=4 with batch=1"),
    (["--impl", "torchvision", "--depth", "40", "--size", "2"], "size=2"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        fig4.parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_a_step_that_runs_out_of_memory_is_recorded_not_raised(tmp_path, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    monkeypatch.setattr(measure, "measure", out_of_memory)
    spec = measure.cifar_spec("naive", 40)
    record, report = fig4.measure_point(spec, (64, 3, 32, 32), torch.device("cpu"),
                                        torch.float32, 0, 1, True, 1)
    assert report is None
    assert record["status"] == fig4.OUT_OF_MEMORY
    assert record["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert record["param_count"] == 176122  # DenseNet-BC-40, k = 12 (the paper's "160K")
    assert record["lower_bound_bytes"] > 0
    for key in (*fig4.MEMORY_FIELDS, "peak_total_bytes", "median_s", "min_s", "max_s"):
        assert record[key] is None, key
    # The artifact stays strict JSON (no NaN) and aggregates like any other point.
    args = fig4.parse_args(["--impl", "naive", "--depth", "40", "--out",
                            str(tmp_path / "naive_d40.json")])
    point.write(args, fig4.EXPERIMENT, {"impl": "naive", "depth": 40}, [record])
    assert json.loads(args.out.read_text())["results"][0]["status"] == "out_of_memory"


def test_budget_caps_a_larger_gpu_and_is_only_recorded_elsewhere(monkeypatch):
    assert fig4.apply_budget(12, torch.device("cpu")) == {
        "budget_bytes": 12 * 2 ** 30, "budget_enforced": False, "device_memory_bytes": None}
    fractions = []

    class Properties:
        total_memory = 48 * 2 ** 30

    def set_fraction(fraction, device):
        # torch's own check: an index, or a device with one (a bare "cuda" raises ValueError)
        fractions.append((fraction, _get_device_index(device)))

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = torch.device("cuda")  # as --device cuda gives it: no index
    assert fig4.apply_budget(12, cuda)["budget_enforced"] is True
    assert fractions == [(0.25, 0)]
    assert fig4.apply_budget(12, torch.device("cuda:1"))["budget_enforced"] is True
    assert fractions == [(0.25, 0), (0.25, 1)]
    assert fig4.apply_budget(64, cuda)["budget_enforced"] is False  # the GPU is the limit
    assert fig4.apply_budget(None, cuda) == {"budget_bytes": None, "budget_enforced": False,
                                             "device_memory_bytes": 48 * 2 ** 30}
    assert len(fractions) == 2


SIMULATED = ["--simulate", "--growth-rate", "4", "--batch", "2", "--size", "8"]


def test_simulated_point_finds_the_deepest_fitting_depth(tmp_path):
    """Against brute force: every depth 6n + 4 up to --max-depth simulated one by one."""
    peaks = {depth: measure.simulated_step_memory(measure.cifar_spec("naive", depth, 4),
                                                  (2, 3, 8, 8)).peak_bytes
             for depth in range(10, 53, 6)}
    budget = (peaks[34] + peaks[40]) / 2  # 34 fits, 40 does not
    out = tmp_path / "simulated_naive.json"
    fig4.main(["--impl", "naive", *SIMULATED, "--depths", "10", "16", "--max-depth", "52",
               "--budget-gib", str(budget / fig4.GIB), "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["memory"] == "simulated_meta_device"
    assert "CUDA caching allocator" in report["config"]["memory_not_counted"]
    *depths, deepest = report["results"]
    assert deepest["kind"] == "simulated_deepest"
    assert (deepest["depth"], deepest["first_failing_depth"], deepest["capped"]) == (34, 40, False)
    for record in depths:
        assert record["tensor_peak_bytes"] == peaks[record["depth"]]
        assert record["fits"] == (peaks[record["depth"]] <= int(budget))
    assert [r["depth"] for r in depths] == sorted(r["depth"] for r in depths)


def test_simulated_search_stops_at_max_depth(tmp_path):
    out = tmp_path / "simulated_shared.json"
    fig4.main(["--impl", "shared", *SIMULATED, "--depths", "10", "--max-depth", "22",
               "--budget-gib", "1", "--out", str(out)])
    deepest = json.loads(out.read_text())["results"][-1]
    assert (deepest["depth"], deepest["capped"], deepest["first_failing_depth"]) == (22, True,
                                                                                     None)


@pytest.mark.parametrize("args, message", [
    (["--impl", "naive", *SIMULATED, "--depth", "40", "--budget-gib", "1"], "not --depth"),
    (["--impl", "naive", *SIMULATED, "--depths", "40"], "needs --budget-gib"),
    (["--impl", "naive", *SIMULATED, "--depths", "41", "--budget-gib", "1"], "depth 41"),
    (["--impl", "naive", *SIMULATED, "--depths", "46", "--max-depth", "40", "--budget-gib", "1"],
     "--max-depth 40"),
    (["--impl", "naive", "--depths", "40"], "--depth is required"),
])
def test_bad_simulated_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        fig4.parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err
