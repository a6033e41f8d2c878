"""The contiguous vs non-contiguous convolution experiment (DenseNet paper, Fig. 2 right)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.densenet_fig2_contiguous import LAYOUTS, PASSES, make_input, parse_args

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT_KEYS = ("python", "torch", "numba", "threads", "device", "device_name", "git_commit",
                    "date_utc")


def run_point(*args):
    return subprocess.run([sys.executable, "-m", "experiments.densenet_fig2_contiguous", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_one_point_writes_a_complete_artifact(tmp_path):
    out = tmp_path / "c6.json"
    result = run_point("--in-channels", "6", "--out-channels", "3", "--batch", "2", "--size",
                       "5", "--warmup", "0", "--repeats", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["c6.json"]  # no temporary file left
    report = json.loads(out.read_text())
    assert report["experiment"] == "densenet_fig2_contiguous"
    config = report["config"]
    assert (config["in_channels"], config["out_channels"], config["batch"], config["size"]) == (6, 3, 2, 5)
    assert config["non_contiguous_parent_channels"] == 12
    assert (config["device"], config["threads"], config["repeats"]) == ("cpu", 1, 2)
    measured = {(r["layout"], r["pass"]) for r in report["results"]}
    assert measured == {(layout, name) for layout in LAYOUTS for name in PASSES}
    for r in report["results"]:
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
    assert set(ENVIRONMENT_KEYS) <= set(report["environment"])


@pytest.mark.parametrize("args, message", [
    (["--in-channels", "0"], "--in-channels 0: must be >= 1"),
    (["--in-channels", "4", "--size", "0"], "--size 0: must be >= 1"),
    (["--in-channels", "4", "--repeats", "0"], "--repeats 0: must be >= 1"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_non_contiguous_input_is_a_channel_slice_of_a_larger_tensor():
    x, source = make_input("non_contiguous", (2, 3, 4, 4), torch.float32, "cpu")
    assert x.shape == (2, 3, 4, 4) and source.shape == (2, 6, 4, 4)
    assert not x.is_contiguous() and x.data_ptr() == source.data_ptr()
    y, own = make_input("contiguous", (2, 3, 4, 4), torch.float32, "cpu")
    assert y.is_contiguous() and own.shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="layout='strided'"):
        make_input("strided", (2, 3, 4, 4), torch.float32, "cpu")
