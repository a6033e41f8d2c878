"""The BN+ACT+CONV strategies (InPlace-ABN paper, Fig. 2) and their timing experiment."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.measure.blocks import STRATEGIES, build_block
from experiments.iabn_table1_timing import MODULES, module_shape, parse_args
from experiments.measure.saved_tensors import saved_storages

ROOT = Path(__file__).resolve().parents[1]
#: Feature-map buffers each strategy keeps for backward (paper, Sec. 3.2 and Fig. 2).
BUFFERS = {"standard": 2, "checkpoint": 1, "checkpoint_proposed": 1, "inplace_abn_I": 1,
           "inplace_abn_II": 1}


def run_point(*args):
    return subprocess.run([sys.executable, "-m", "experiments.iabn_table1_timing", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_one_point_writes_a_complete_artifact(tmp_path):
    out = tmp_path / "conv4.json"
    result = run_point("--module", "conv4", "--batch", "2", "--max-size", "3", "--warmup", "0",
                       "--repeats", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["conv4.json"]
    report = json.loads(out.read_text())
    config = report["config"]
    assert (config["module"], config["batch"], config["channels"], config["height"],
            config["groups"]) == ("conv4", 2, 2048, 3, 64)
    assert [r["strategy"] for r in report["results"]] == list(STRATEGIES)
    for r in report["results"]:
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r["strategy"]
        assert r["input_bytes"] == 2 * 2048 * 3 * 3 * 4
        assert r["saved_buffers"] == BUFFERS[r["strategy"]], r["strategy"]
        assert r["saved_bytes"] == r["saved_map_bytes"] + r["saved_channel_bytes"]
    assert report["environment"]["device"] == "cpu"


@pytest.mark.parametrize("args, message", [
    (["--module", "conv5"], "invalid choice: 'conv5'"),
    (["--module", "conv1", "--batch", "0"], "--batch 0: must be >= 1"),
    (["--module", "conv1", "--max-size", "0"], "--max-size 0: must be >= 1"),
    (["--module", "conv1", "--batch", "1", "--max-size", "1"], "more than one value per channel"),
    (["--module", "conv1", "--strategies", "standard", "standard"], "at most once"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_module_shapes_follow_resnext101_and_the_size_cap():
    assert module_shape("conv1", 32) == (32, 256, 56, 56)
    assert module_shape("conv4", 32) == (32, 2048, 7, 7)
    assert module_shape("conv1", 2, max_size=14) == (2, 256, 14, 14)
    assert module_shape("conv4", 2, max_size=14) == (2, 2048, 7, 7)
    assert all(channels % 64 == 0 for channels, _ in MODULES.values())
    with pytest.raises(ValueError, match="module='conv0'"):
        module_shape("conv0", 2)


def test_strategies_compute_the_same_function_and_gradients():
    torch.manual_seed(0)
    channels, groups = 8, 4
    x = torch.randn(3, channels, 5, 5, dtype=torch.float64) * 2 + 1
    grad = torch.randn(3, channels, 5, 5, dtype=torch.float64)
    reference = build_block("standard", channels, groups, torch.float64)
    with torch.no_grad():
        reference.bn.weight.uniform_(0.5, 1.5)
        reference.bn.bias.normal_()
    state = reference.state_dict()
    outcomes = {}
    for strategy in STRATEGIES:
        block = build_block(strategy, channels, groups, torch.float64)
        block.load_state_dict(state)
        base = x.clone().requires_grad_(True)
        out = block(base.clone())
        out.backward(grad)
        outcomes[strategy] = (out.detach(), base.grad, block.bn.weight.grad, block.bn.bias.grad,
                              block.conv.weight.grad, block.bn.running_mean,
                              block.bn.running_var)
    for strategy, tensors in outcomes.items():
        for got, want in zip(tensors, outcomes["standard"]):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_feature_map_buffers_saved_per_strategy(strategy):
    block = build_block(strategy, 64, 64)
    x = torch.randn(4, 64, 8, 8).requires_grad_(True).clone()
    buffer = x.numel() * x.element_size()
    storages = saved_storages(block, x)
    assert sum(1 for b in storages if b >= buffer) == BUFFERS[strategy]
    assert all(b == buffer for b in storages if b >= buffer)


def test_recomputing_block_and_factory_refuse_bad_input():
    with pytest.raises(ValueError, match="strategy='fused'"):
        build_block("fused", 8, 4)
    block = build_block("checkpoint", 8, 4).eval()
    with pytest.raises(RuntimeError, match=r"\.train\(\)"):
        block(torch.randn(2, 8, 3, 3))
