"""The measurement toolkit (``experiments.measure``): fields, counts and the lower bound."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from experiments.measure.step import (IMPLEMENTATIONS, ModelSpec, cifar_spec, lower_bound_bytes,
                                      measure, parse_args, saved_tensor_bytes)
from layers.densenet import densenet_bc

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "densenet_bc", "--depth", "10", "--growth-rate", "4", "--batch", "2",
        "--size", "8"]
FIELDS = ("model", "input_shape", "dtype", "device", "warmup", "param_count", "param_bytes",
          "saved_tensor_bytes", "saved_tensor_count", "shared_storage_bytes", "saved_bytes",
          "lower_bound_bytes", "saved_over_lower_bound", "saved_tensor_over_lower_bound",
          "excess_shared_storage_bytes", "excess_feature_map_bytes", "excess_per_channel_bytes",
          "excess_not_saved_bytes", "excess_tensors", "peak_bytes", "peak_baseline_bytes",
          "peak_method", "time", "environment")
EXCESS = ("excess_shared_storage_bytes", "excess_feature_map_bytes", "excess_per_channel_bytes",
          "excess_not_saved_bytes")


def test_cli_reports_every_field(tmp_path):
    out = tmp_path / "m.json"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.measure", *TINY, "--impl", "shared", "--warmup",
         "1", "--repeats", "2", "--threads", "1", "--json", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert set(FIELDS) <= set(report)
    assert report["model"] == {"model": "densenet_bc", "depth": 10, "growth_rate": 4,
                               "impl": "shared", "norm": "bn", "preact": True,
                               "num_classes": None}
    assert report["input_shape"] == [2, 3, 8, 8]
    t = report["time"]
    assert t["repeats"] == 2 and 0 < t["min_s"] <= t["median_s"] <= t["max_s"]
    assert report["shared_storage_bytes"] > 0
    assert report["saved_bytes"] == report["saved_tensor_bytes"] + report["shared_storage_bytes"]
    assert report["saved_over_lower_bound"] == pytest.approx(
        report["saved_bytes"] / report["lower_bound_bytes"])
    assert report["peak_method"] == "tensor_tracker"
    assert report["peak_bytes"] > report["saved_tensor_bytes"] > 0
    assert report["peak_baseline_bytes"] > 0
    assert report["environment"]["threads"]["torch"] == 1
    assert "lower bound" in result.stdout


def test_saved_bytes_rank_the_implementations():
    shape = (4, 3, 16, 16)
    reports = {impl: measure(cifar_spec(impl, 28, 6), shape, warmup=1, repeats=1, peak=False)
               for impl in IMPLEMENTATIONS}
    saved = {name: r["saved_bytes"] for name, r in reports.items()}
    assert (saved["shared_inplace"] < saved["shared"] < saved["checkpoint"]
            == saved["torchvision"] < saved["naive"])
    assert len({r["lower_bound_bytes"] for r in reports.values()}) == 1
    assert len({r["param_count"] for r in reports.values()}) == 1
    assert reports["naive"]["shared_storage_bytes"] == 0
    assert all(r["peak_bytes"] is None for r in reports.values())
    for report in reports.values():  # the excess adds up, whatever the implementation
        assert sum(report[key] for key in EXCESS) == (report["saved_bytes"]
                                                      - report["lower_bound_bytes"])
    # one storage, and no feature map beyond the bound: only per-channel states remain
    inplace = reports["shared_inplace"]
    assert inplace["excess_feature_map_bytes"] == inplace["excess_not_saved_bytes"] == 0
    assert {t["shape"] for t in inplace["excess_tensors"]} == {"(3, C)", "(6, C)"}
    assert 0 < inplace["excess_per_channel_bytes"] < inplace["excess_shared_storage_bytes"]
    # the two-storage method keeps the last block's concatenation and its normalized copy
    last = (4, densenet_bc(28, 6).classifier.in_features, 4, 4)
    shared = {t["shape"]: t["count"] for t in reports["shared"]["excess_tensors"]}
    assert shared[str(last)] == 2


def test_torchvision_reference_is_the_same_network():
    torch.manual_seed(0)
    theirs = ModelSpec("torchvision_densenet", 16, 4).build().double()
    ours = densenet_bc(16, 4, impl="naive").double()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-12)


def test_lower_bound_counts_conv_and_pool_outputs_and_channel_vectors():
    # densenet_bc(10, 4) on (2, 3, 8, 8): one dense layer per block, 8 initial features,
    # transitions 12 -> 6 and 10 -> 5 channels, blocks at 8x8, 4x4, 2x2.
    n = 2
    elements = (n * 3 * 64  # the input
                + n * 8 * 64  # conv0
                + n * (16 + 4) * (64 + 16 + 4)  # conv1 (bottleneck) and conv2 of each block
                + n * 6 * 64 + n * 6 * 16  # transition 1: conv, pool
                + n * 5 * 16 + n * 5 * 4  # transition 2: conv, pool
                + n * 9  # classifier input
                + 2 * (8 + 16 + 12 + 6 + 16 + 10 + 5 + 16 + 9))  # BN channels, mean and rstd
    with torch.device("meta"):
        model = densenet_bc(10, 4, impl="naive")
    assert lower_bound_bytes(model, (n, 3, 8, 8)) == 4 * elements
    assert lower_bound_bytes(model, (n, 3, 8, 8), torch.float64) == 8 * elements


def test_saved_tensor_bytes_counts_storages_once_and_skips_parameters():
    class Square(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(5, 5, bias=False)

        def forward(self, t):
            return self.linear(t * t)  # mul saves t twice, linear its input and its weight

    x = torch.randn(3, 5, requires_grad=True)
    assert saved_tensor_bytes(Square(), x) == (2 * 3 * 5 * 4, 2)


def test_spec_from_the_command_line():
    spec = ModelSpec("densenet_bc", 40, 12, impl="checkpoint", norm="iabn", preact=False,
                     num_classes=100)
    assert parse_args(["--depth", "40", "--growth-rate", "12", "--impl", "checkpoint",
                       "--norm", "iabn", "--postact", "--num-classes", "100"]).spec == spec
    reference = ModelSpec("torchvision_densenet", 40)
    assert parse_args(["--model", "torchvision_densenet", "--depth", "40"]).spec == reference
    assert (reference.impl, reference.norm, reference.preact) == (None, None, None)
    assert parse_args(["--model", "densenet264", "--growth-rate", "48"]).input_shape == (
        64, 3, 224, 224)


@pytest.mark.parametrize("args, message", [
    (["--depth", "41"], "depth=41"),
    (["--model", "densenet121", "--depth", "40"], "depth=40"),
    (["--model", "densenet121", "--growth-rate", "12"], "growth_rate=12"),
    (["--model", "torchvision_densenet", "--depth", "40", "--impl", "naive"], "impl"),
    (["--model", "densenet_bc"], "depth=None"),
    (["--depth", "40", "--repeats", "0"], "--repeats"),
    (["--depth", "40", "--batch", "0"], "--batch"),
])
def test_bad_arguments_are_named(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_simulates_a_paper_sized_step(tmp_path, capsys):
    from experiments.measure.step import main

    out = tmp_path / "sim.json"
    report = main(["--model", "densenet_bc", "--depth", "100", "--growth-rate", "24",
                   "--impl", "naive", "--batch", "256", "--simulate", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["tensor_memory_method"] == "simulated_meta_device"
    assert report["tensor_peak_bytes"] > 8 * 2 ** 30  # more than this test may allocate
    assert report["tensor_peak_bytes"] == sum(
        value for key, value in report.items()
        if key.startswith("tensor_peak_") and key != "tensor_peak_bytes")
    assert "simulated peak tensor memory" in capsys.readouterr().out
