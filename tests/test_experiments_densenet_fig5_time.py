"""The DenseNet Fig. 5 experiment (time per minibatch per implementation, interleaved) and the
interleaved timer behind it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import densenet_fig5_time as fig5
from experiments.measure import step as measure
from experiments.measure.timing import time_interleaved

ROOT = Path(__file__).resolve().parents[1]


def test_one_point_times_every_implementation(tmp_path):
    out = tmp_path / "d10.json"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.densenet_fig5_time", "--depth", "10",
         "--growth-rate", "4", "--batch", "2", "--size", "8", "--warmup", "1", "--repeats", "2",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["d10.json"]
    report = json.loads(out.read_text())
    assert report["config"] == {**report["config"], "depth": 10, "growth_rate": 4, "batch": 2,
                                "size": 8, "interleaved": True, "warmup": 1, "repeats": 2}
    results = report["results"]
    assert [r["impl"] for r in results] == list(measure.IMPLEMENTATIONS)
    assert [r["model"] for r in results] == ["densenet_bc"] * 4 + ["torchvision_densenet"]
    assert len({r["param_count"] for r in results}) == 1
    for r in results:
        assert r["repeats"] == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"], r["impl"]
    assert "x naive" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--impls", "naive", "naive"], "each implementation at most once"),
    (["--impls", "fast"], "invalid choice: 'fast'"),
    (["--depth", "41"], "depth=41"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        fig5.parse_args([*args, "--out", str(tmp_path / "p.json")])
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_interleaved_rounds_shuffle_the_order_and_time_after_warmup():
    calls = []
    names = "abcd"
    fns = {name: (lambda arg, name=name: calls.append((name, arg))) for name in names}
    setups = {name: (lambda name=name: f"setup {name}") for name in names}
    result = time_interleaved(fns, warmup=1, repeats=11, setups=setups)
    order = [name for name, _ in calls]
    rounds = [order[i:i + len(names)] for i in range(0, len(order), len(names))]
    assert len(rounds) == 12 and all(sorted(r) == list(names) for r in rounds)
    assert all(arg == f"setup {name}" for name, arg in calls)
    # Neither the first place nor any callable's predecessor is fixed, unlike a rotation
    # (where each callable always follows the same neighbour, but in the first place).
    assert {r[0] for r in rounds} == set(names)
    predecessors = {name: {r[r.index(name) - 1] for r in rounds if r.index(name)}
                    for name in names}
    assert all(len(before) >= 2 for before in predecessors.values()), predecessors
    assert list(result) == list(names)
    for timing in result.values():
        assert timing["repeats"] == 11 and timing["min_s"] <= timing["median_s"] <= timing["max_s"]

    calls.clear()
    time_interleaved(fns, warmup=1, repeats=11, setups=setups)
    assert [name for name, _ in calls] == order  # seeded: the same orders on every run


def test_interleaved_timer_refuses_bad_input():
    with pytest.raises(ValueError, match="fns is empty"):
        time_interleaved({}, 0, 1)
    with pytest.raises(ValueError, match=r"setups names \['b'\]"):
        time_interleaved({"a": lambda: None}, 0, 1, setups={"b": lambda: None})
    with pytest.raises(ValueError, match="repeats=0"):
        time_interleaved({"a": lambda: None}, 0, 0)
