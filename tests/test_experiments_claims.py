"""The claims report, the aggregation of points into CSVs, and the papers' numbers it uses."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments import aggregate, claims

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "artifacts" / "paper"
STRATEGIES = ("standard", "checkpoint", "checkpoint_proposed", "inplace_abn_I", "inplace_abn_II")


@pytest.fixture
def artifacts(tmp_path):
    shutil.copytree(PAPER, tmp_path / "paper")
    return tmp_path


def iabn_frame(device, overhead_pct, map_bytes=None):
    """A ``iabn_table1_timing`` CSV: ``overhead_pct[strategy]`` over a 10 ms STANDARD."""
    map_bytes = map_bytes or {s: (2 if s == "standard" else 1) * 1000 for s in STRATEGIES}
    rows = [{"module": module, "strategy": s, "device": device, "env_device_name": "a device",
             "median_s": 0.01 * (1 + overhead_pct[s] / 100), "min_s": 0.009, "max_s": 0.02,
             "saved_bytes": map_bytes[s] + 10, "saved_map_bytes": map_bytes[s],
             "saved_buffers": map_bytes[s] / 1000}
            for module in ("conv1", "conv2") for s in STRATEGIES]
    return pd.DataFrame(rows)


def fig2_frame(device, overhead_pct):
    rows = [{"pass": name, "in_channels": c, "layout": layout, "device": device,
             "env_device_name": "a device",
             "median_s": 0.001 * (1 + (overhead_pct / 100 if layout == "non_contiguous" else 0))}
            for name in ("forward", "forward_backward") for c in (16, 32)
            for layout in ("contiguous", "non_contiguous")]
    return pd.DataFrame(rows)


def write(artifacts, experiment, run, frame):
    frame.to_csv(artifacts / f"{experiment}.{run}.csv", index=False)


def verdicts(artifacts):
    """``{(claim id, run): verdict}`` of every claim."""
    return {(c["id"], run): outcome.verdict for c in claims.load_claims(artifacts)
            for run, _, outcome in claims.evaluate(c, artifacts)}


GOOD = {"standard": 0, "checkpoint": 3.0, "checkpoint_proposed": 2.5, "inplace_abn_I": 1.5,
        "inplace_abn_II": 1.0}


# --------------------------------------------------------------------------- verdicts
def test_gpu_numbers_like_the_papers_are_reproduced(artifacts):
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", GOOD))
    write(artifacts, "densenet_fig2_contiguous", "paper-cuda", fig2_frame("cuda", 40))
    got = verdicts(artifacts)
    for claim_id in ("iabn_time_overhead", "iabn_checkpoint_doubles_overhead",
                     "iabn_memory_saving", "iabn_buffers_per_strategy",
                     "iabn_ii_faster_than_checkpoint_proposed",
                     "densenet_noncontiguous_overhead"):
        assert got[(claim_id, "paper-cuda")] == claims.REPRODUCED, claim_id


def test_gpu_numbers_unlike_the_papers_are_not_reproduced(artifacts):
    slow = {**GOOD, "inplace_abn_I": 10.0, "inplace_abn_II": 4.0}
    leaky = {s: (2 if s in ("standard", "inplace_abn_II") else 1) * 1000 for s in STRATEGIES}
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", slow, leaky))
    write(artifacts, "densenet_fig2_contiguous", "paper-cuda", fig2_frame("cuda", 5))
    got = verdicts(artifacts)
    for claim_id in ("iabn_time_overhead", "iabn_checkpoint_doubles_overhead",
                     "iabn_memory_saving", "iabn_buffers_per_strategy",
                     "iabn_ii_faster_than_checkpoint_proposed",
                     "densenet_noncontiguous_overhead"):
        assert got[(claim_id, "paper-cuda")] == claims.NOT_REPRODUCED, claim_id


def test_cpu_runs_judge_memory_but_not_gpu_timings(artifacts):
    write(artifacts, "iabn_table1_timing", "smoke-cpu", iabn_frame("cpu", GOOD))
    write(artifacts, "densenet_fig2_contiguous", "smoke-cpu", fig2_frame("cpu", 40))
    got = verdicts(artifacts)
    for claim_id in ("iabn_time_overhead", "iabn_checkpoint_doubles_overhead",
                     "iabn_ii_faster_than_checkpoint_proposed",
                     "densenet_noncontiguous_overhead"):
        assert got[(claim_id, "smoke-cpu")] == claims.NOT_MEASURABLE, claim_id
    assert got[("iabn_memory_saving", "smoke-cpu")] == claims.REPRODUCED
    assert got[("iabn_buffers_per_strategy", "smoke-cpu")] == claims.REPRODUCED


def test_claims_without_results_are_not_run_and_every_run_gets_a_row(artifacts):
    write(artifacts, "iabn_table1_timing", "smoke-cpu", iabn_frame("cpu", GOOD))
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", GOOD))
    got = verdicts(artifacts)
    assert got[("iabn_time_overhead", "smoke-cpu")] == claims.NOT_MEASURABLE
    assert got[("iabn_time_overhead", "paper-cuda")] == claims.REPRODUCED
    assert got[("densenet_noncontiguous_overhead", "-")] == claims.NOT_RUN
    assert got[("densenet_pytorch_500_layers", "-")] == claims.NOT_RUN


def test_results_without_an_evaluator_are_an_error(artifacts):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", pd.DataFrame({"device": ["cpu"]}))
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_pytorch_500_layers")
    with pytest.raises(LookupError, match="densenet_pytorch_500_layers"):
        claims.evaluate(claim, artifacts)


def test_report_lists_every_claim_and_is_written_atomically(artifacts, tmp_path):
    write(artifacts, "iabn_table1_timing", "smoke-cpu", iabn_frame("cpu", GOOD))
    out = tmp_path / "figures" / "claims.md"
    claims.main(["--artifacts", str(artifacts), "--out", str(out)])
    text = out.read_text()
    assert [p.name for p in out.parent.iterdir()] == ["claims.md"]
    for claim in claims.load_claims(artifacts):
        assert f"`{claim['id']}`" in text
    assert "## Pleiss et al. 2017" in text and "## Rota Bulò et al. 2018" in text
    assert "| smoke-cpu | a device |" in text


# --------------------------------------------------------------------------- papers' numbers
def test_paper_claims_are_complete_and_every_evaluator_has_a_claim():
    entries = claims.load_claims(PAPER.parent)
    ids = [c["id"] for c in entries]
    assert len(ids) == len(set(ids)), "claim ids must be unique"
    for entry in entries:
        for field in ("id", "experiment", "statement", "claimed", "value", "unit", "setting",
                      "source", "quote"):
            assert field in entry, (entry["id"], field)
    assert set(claims.EVALUATORS) <= set(ids)
    for name in ("densenet_fig2_preact.csv", "iabn_table1_imagenet.csv",
                 "iabn_table2_segmentation.csv"):
        assert "source" in pd.read_csv(PAPER / name).columns, name


def test_papers_numbers_match_the_text():
    densenet = {c["id"]: c for c in yaml.safe_load(
        (PAPER / "memory_efficient_densenets.yaml").read_text())["claims"]}
    assert densenet["densenet_noncontiguous_overhead"]["value"] == [30, 50]
    assert densenet["densenet_preact_error_cifar10"]["value"] == {"preact": 4.51, "postact": 5.18}
    assert densenet["densenet_preact_error_cifar100"]["value"] == {"preact": 22.27,
                                                                   "postact": 24.30}


def test_papers_numbers_appear_in_the_papers_text():
    papers = ROOT.parent / "shared" / "papers"
    if not papers.is_dir():
        pytest.skip(f"no paper texts at {papers}")
    expected = {"memory-efficient-densenets.txt": ("4.51", "5.18", "22.27", "24.30", "22%",
                                                   "nearly 500 layers", "20.26%", "15%"),
                "inplace-abn.txt": ("0.8", "up to 50%", "+75%", "77.04", "78.08", "74.42")}
    for name, numbers in expected.items():
        body = (papers / name).read_text()
        for number in numbers:
            assert number in body, (name, number)


# --------------------------------------------------------------------------- aggregation
def point(path, results, config=None):
    report = {"experiment": "x", "config": config or {"batch": 2, "repeats": 3},
              "results": results, "environment": {"device_name": "cpu0", "torch": "2"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    return path


def test_aggregate_makes_one_row_per_record(tmp_path):
    a = point(tmp_path / "x" / "smoke-cpu" / "a.json", [{"k": 1, "repeats": 3}, {"k": 2}])
    b = point(tmp_path / "x" / "smoke-cpu" / "b.json", [{"k": 3}])
    out = tmp_path / "x.smoke-cpu.csv"
    aggregate.main([str(a), str(b), "--out", str(out)])
    frame = pd.read_csv(out)
    assert list(frame["point"]) == ["a", "a", "b"]
    assert list(frame["k"]) == [1, 2, 3]
    assert set(frame["run"]) == {"smoke-cpu"} and set(frame["batch"]) == {2}
    assert set(frame["env_device_name"]) == {"cpu0"}


def test_aggregate_refuses_clashing_or_incomplete_points(tmp_path):
    clash = point(tmp_path / "r" / "c.json", [{"batch": 5}])
    with pytest.raises(ValueError, match=r"\['batch'\]"):
        aggregate.rows_of(clash)
    empty = point(tmp_path / "r" / "e.json", [])
    with pytest.raises(ValueError, match="'results' is empty"):
        aggregate.rows_of(empty)
    broken = tmp_path / "r" / "b.json"
    broken.write_text(json.dumps({"config": {}}))
    with pytest.raises(ValueError, match="missing"):
        aggregate.rows_of(broken)
