"""The claims report, the aggregation of points into CSVs, and the papers' numbers it uses."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments.report import aggregate, claims

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
#: Claims judged from the two GPU timing experiments written below.
PAPER_CUDA_CLAIMS = ("iabn_time_overhead", "iabn_checkpoint_doubles_overhead",
                     "iabn_memory_saving", "iabn_buffers_per_strategy",
                     "iabn_ii_faster_than_checkpoint_proposed",
                     "densenet_noncontiguous_overhead")


def test_gpu_numbers_like_the_papers_are_reproduced(artifacts):
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", GOOD))
    write(artifacts, "densenet_fig2_contiguous", "paper-cuda", fig2_frame("cuda", 40))
    got = verdicts(artifacts)
    for claim_id in PAPER_CUDA_CLAIMS:
        assert got[(claim_id, "paper-cuda")] == claims.REPRODUCED, claim_id


def test_gpu_numbers_unlike_the_papers_are_not_reproduced(artifacts):
    slow = {**GOOD, "inplace_abn_I": 10.0, "inplace_abn_II": 4.0}
    leaky = {s: (2 if s in ("standard", "inplace_abn_II") else 1) * 1000 for s in STRATEGIES}
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", slow, leaky))
    write(artifacts, "densenet_fig2_contiguous", "paper-cuda", fig2_frame("cuda", 5))
    got = verdicts(artifacts)
    for claim_id in PAPER_CUDA_CLAIMS:
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


def test_claims_of_experiments_without_a_module_are_not_implemented(artifacts, monkeypatch):
    """"not implemented" follows whether experiments/<id>.py exists, not a list."""
    claim = {"id": "some_claim", "experiment": "densenet_fig5_time"}
    [(_, _, outcome)] = claims.evaluate(claim, artifacts)
    assert outcome.verdict == claims.NOT_RUN
    [(_, _, outcome)] = claims.evaluate({**claim, "experiment": "densenet_fig9_unheard"},
                                        artifacts)
    assert (outcome.verdict, outcome.reason) == (
        claims.NOT_IMPLEMENTED, "no experiments/densenet_fig9_unheard.py (and so no Snakemake "
        "rule) yet")

    # Every claim of the papers: "not implemented" exactly where the module is missing.
    modules = {p.stem for p in (ROOT / "experiments").glob("*.py")}
    for (claim_id, run), verdict in verdicts(artifacts).items():
        experiment = next(c["experiment"] for c in claims.load_claims(artifacts)
                          if c["id"] == claim_id)
        assert verdict == (claims.NOT_RUN if experiment in modules
                           else claims.NOT_IMPLEMENTED), claim_id

    # A module added (here: a directory of modules standing in for experiments/) counts.
    fake = artifacts / "modules"
    fake.mkdir()
    (fake / "densenet_fig9_unheard.py").write_text("")
    monkeypatch.setattr(claims, "EXPERIMENTS_DIR", fake)
    [(_, _, outcome)] = claims.evaluate({**claim, "experiment": "densenet_fig9_unheard"},
                                        artifacts)
    assert outcome.verdict == claims.NOT_RUN


def test_results_without_an_evaluator_are_an_error(artifacts):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", pd.DataFrame({"device": ["cpu"]}))
    claim = {"id": "densenet_unheard_of", "experiment": "densenet_fig4_memory"}
    with pytest.raises(LookupError, match="densenet_unheard_of"):
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
    assert f"**{claims.NOT_IMPLEMENTED}**" in text  # in the legend at least


# --------------------------------------------------------------------------- DenseNet Figs. 4, 5
MIB = 2 ** 20
DEPTHS = (40, 64, 88, 112, 136, 160)
#: Saved MiB as a function of depth, like the paper's (naive quadratic, about 10x from 40 to
#: 160 layers; shared linear, far below 22% of naive) ...
PAPER_LIKE = {"naive": lambda d: d + 0.05 * d * d, "shared": lambda d: 0.15 * d,
              "checkpoint": lambda d: 0.3 * d, "torchvision": lambda d: 0.3 * d}
#: ... and unlike it (naive linear, shared quadratic and above naive at 160 layers).
UNLIKE = {"naive": lambda d: 2 * d, "shared": lambda d: 0.02 * d * d}


def fig4_frame(device, saved_mib, depths=DEPTHS, out_of_memory=(), budget_gib=12.0,
               enforced=None):
    """A ``densenet_fig4_memory`` CSV: ``saved_mib[impl](depth)`` per point, peaks 10% above;
    ``(impl, depth)`` pairs in ``out_of_memory`` did not fit."""
    enforced = device == "cuda" if enforced is None else enforced
    rows = []
    for impl, saved in saved_mib.items():
        for depth in depths:
            fits = (impl, depth) not in out_of_memory
            rows.append({
                "impl": impl, "depth": depth, "batch": 64, "device": device,
                "env_device_name": "a device", "memory_budget_gib": budget_gib,
                "budget_enforced": enforced,
                "device_memory_bytes": 80 * 2 ** 30 if device == "cuda" else None,
                "status": "ok" if fits else "out_of_memory", "param_count": 1000 * depth ** 2,
                "lower_bound_bytes": 0.1 * depth * MIB,
                "saved_bytes": saved(depth) * MIB if fits else None,
                "peak_bytes": 1.1 * saved(depth) * MIB if fits else None,
                "median_s": 0.01 * depth if fits else None})
    return pd.DataFrame(rows)


def fig5_frame(device, overhead_pct, depth=100):
    """A ``densenet_fig5_time`` CSV: ``overhead_pct[impl]`` over a 100 ms naive step."""
    rows = [{"depth": depth, "impl": impl, "batch": 64, "device": device,
             "env_device_name": "a device", "median_s": 0.1 * (1 + pct / 100),
             "min_s": 0.09, "max_s": 0.2}
            for impl, pct in {"naive": 0, **overhead_pct}.items()]
    return pd.DataFrame(rows)


FIG4_MEMORY_CLAIMS = ("densenet_memory_160_layers", "densenet_naive_memory_160_vs_40",
                      "densenet_memory_linear_vs_quadratic")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_densenet_memory_claims_are_judged_from_saved_bytes_on_any_device(artifacts, device):
    write(artifacts, "densenet_fig4_memory", f"like-{device}", fig4_frame(device, PAPER_LIKE))
    write(artifacts, "densenet_fig4_memory", f"unlike-{device}", fig4_frame(device, UNLIKE))
    got = verdicts(artifacts)
    for claim_id in FIG4_MEMORY_CLAIMS:
        assert got[(claim_id, f"like-{device}")] == claims.REPRODUCED, claim_id
        assert got[(claim_id, f"unlike-{device}")] == claims.NOT_REPRODUCED, claim_id


def test_densenet_memory_claims_name_what_they_measured(artifacts):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE))
    outcomes = {c["id"]: claims.evaluate(c, artifacts)[0][2]
                for c in claims.load_claims(artifacts) if c["id"] in FIG4_MEMORY_CLAIMS}
    # shared 0.15 * 160 = 24 MiB; naive 160 + 0.05 * 160^2 = 1440 MiB, 120 MiB at 40 layers.
    assert "shared 1.7% of naive (checkpoint 3.3%, torchvision 3.3%)" in \
        outcomes["densenet_memory_160_layers"].measured
    assert "160 layers 12.0x 40 layers (1440 vs 120 MiB); peak 12.0x" in \
        outcomes["densenet_naive_memory_160_vs_40"].measured
    growth = outcomes["densenet_memory_linear_vs_quadratic"].measured
    assert "naive 88.9%, shared 0.00%" in growth and "-0.00" not in growth


def test_densenet_memory_claims_at_unmeasured_depths_are_not_measured(artifacts):
    write(artifacts, "densenet_fig4_memory", "short-cpu",
          fig4_frame("cpu", PAPER_LIKE, depths=(40, 64)))
    got = verdicts(artifacts)
    for claim_id in FIG4_MEMORY_CLAIMS:
        assert got[(claim_id, "short-cpu")] == claims.NOT_MEASURED, claim_id
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_memory_160_layers")
    [(_, _, outcome)] = claims.evaluate(claim, artifacts)
    assert "at 64 layers (the deepest both fitted): shared 3.6% of naive" in outcome.measured


def test_densenet_500_layers_needs_a_gpu_with_the_papers_budget(artifacts):
    deep = (40, 160, 280, 400, 472, 496, 520)
    naive_out = {("naive", d) for d in deep if d > 160}
    write(artifacts, "densenet_fig4_memory", "fits-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={*naive_out, ("shared", 520)}))
    write(artifacts, "densenet_fig4_memory", "short-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={*naive_out, ("shared", 400),
                                                              ("shared", 472), ("shared", 496),
                                                              ("shared", 520)}))
    write(artifacts, "densenet_fig4_memory", "shallow-cuda",
          fig4_frame("cuda", PAPER_LIKE, (40, 160, 280)))
    write(artifacts, "densenet_fig4_memory", "roomy-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, budget_gib=None, enforced=False))
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE, deep))
    got = {run: verdict for (claim_id, run), verdict in verdicts(artifacts).items()
           if claim_id == "densenet_pytorch_500_layers"}
    assert got == {"fits-cuda": claims.REPRODUCED, "short-cuda": claims.NOT_REPRODUCED,
                   "shallow-cuda": claims.NOT_MEASURED, "roomy-cuda": claims.NOT_MEASURED,
                   "smoke-cpu": claims.NOT_MEASURABLE}
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_pytorch_500_layers")
    outcomes = {run: outcome for run, _, outcome in claims.evaluate(claim, artifacts)}
    assert outcomes["fits-cuda"].measured.startswith(
        "shared storage: deepest that fitted 496 layers (246.0M parameters); out of memory "
        "from 520 layers; deepest that fitted: checkpoint 520, naive 160, torchvision 520")
    assert "80.0 GiB" in outcomes["roomy-cuda"].reason


def test_densenet_time_overhead_is_a_gpu_claim(artifacts):
    write(artifacts, "densenet_fig5_time", "paper-cuda",
          fig5_frame("cuda", {"shared": 18, "checkpoint": 30, "torchvision": 25}))
    write(artifacts, "densenet_fig5_time", "slow-cuda", fig5_frame("cuda", {"shared": 60}))
    write(artifacts, "densenet_fig5_time", "smoke-cpu", fig5_frame("cpu", {"shared": 18}))
    write(artifacts, "densenet_fig5_time", "other-cuda",
          fig5_frame("cuda", {"shared": 18}, depth=40))
    got = {run: verdict for (claim_id, run), verdict in verdicts(artifacts).items()
           if claim_id == "densenet_shared_time_overhead"}
    assert got == {"paper-cuda": claims.REPRODUCED, "slow-cuda": claims.NOT_REPRODUCED,
                   "smoke-cpu": claims.NOT_MEASURABLE, "other-cuda": claims.NOT_MEASURED}
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_shared_time_overhead")
    outcome = next(o for run, _, o in claims.evaluate(claim, artifacts) if run == "smoke-cpu")
    assert outcome.measured == ("DenseNet-BC-100, batch 64: shared storage +18.0% time over "
                                "naive")


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
                 "iabn_table2_segmentation.csv", "iabn_table2_segmentation_bottom.csv"):
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
                                                   "nearly 500 layers", "20.26%", "15%",
                                                   "from quadratic to linear"),
                "inplace-abn.txt": ("0.8", "up to 50%", "+75%", "77.04", "78.08", "74.42",
                                    "79.16", "79.40", "82.03", "53.12", "53.37")}
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


def with_simulated(frame, deepest):
    """``frame`` plus simulated points: ``deepest[impl] = (depth, capped, first_failing)``."""
    rows = [{"impl": impl, "kind": "simulated_deepest", "memory": "simulated_meta_device",
             "device": "cpu", "env_device_name": "a device", "batch": 64, "depth": depth,
             "capped": capped, "max_depth": 1000, "first_failing_depth": failing,
             "param_count": 1000 * (depth or 0) ** 2, "tensor_peak_bytes": 2 ** 30,
             "memory_budget_gib": 12.0}
            for impl, (depth, capped, failing) in deepest.items()]
    return pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_densenet_500_layers_judged_on_simulated_points_without_a_gpu(artifacts, device):
    deep = (40, 160, 280, 400, 472, 496, 520)
    measured = fig4_frame(device, PAPER_LIKE, deep,
                          out_of_memory={("naive", d) for d in deep if d > 160}
                          | {("shared", 400), ("shared", 472), ("shared", 496), ("shared", 520)})
    write(artifacts, "densenet_fig4_memory", f"fits-{device}", with_simulated(
        measured, {"shared": (1000, True, None), "naive": (268, False, 274)}))
    write(artifacts, "densenet_fig4_memory", f"short-{device}", with_simulated(
        measured, {"shared": (280, False, 286)}))
    got = {run: verdict for (claim_id, run), verdict in verdicts(artifacts).items()
           if claim_id == "densenet_pytorch_500_layers"}
    if device == "cuda":  # real allocation judges: shared ran out of memory from 400 layers
        assert got == {"fits-cuda": claims.NOT_REPRODUCED, "short-cuda": claims.NOT_REPRODUCED}
        return
    assert got == {"fits-cpu": claims.REPRODUCED, "short-cpu": claims.NOT_REPRODUCED}
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_pytorch_500_layers")
    outcome = {run: o for run, _, o in claims.evaluate(claim, artifacts)}["fits-cpu"]
    assert outcome.measured.startswith("simulated tensor memory, batch 64, 12 GiB: shared "
                                       "storage fits at least 1000 layers")
    assert "naive 268 layers" in outcome.measured
    assert "simulated tensor memory" in outcome.reason and "CUDA caching" in outcome.reason


@pytest.mark.parametrize("naive, verdict", [
    ((160, False, 166), claims.REPRODUCED), ((268, False, 274), claims.NOT_REPRODUCED),
    ((1000, True, None), claims.NOT_MEASURED)])
def test_naive_depth_limit_judged_on_simulated_points(artifacts, naive, verdict):
    frame = with_simulated(fig4_frame("cpu", PAPER_LIKE), {"naive": naive})
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", frame)
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_naive_over_12gb_beyond_160_layers")
    [(_, _, outcome)] = claims.evaluate(claim, artifacts)
    assert outcome.verdict == verdict
    assert f"naive fits {naive[0]} layers" in outcome.measured
    assert "LuaTorch" in outcome.reason


def test_naive_depth_limit_on_a_gpu_uses_real_allocation(artifacts):
    deep = (40, 100, 160, 220)
    frame = fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={("naive", 220)})
    write(artifacts, "densenet_fig4_memory", "paper-cuda", frame)
    claim = next(c for c in claims.load_claims(artifacts)
                 if c["id"] == "densenet_naive_over_12gb_beyond_160_layers")
    [(_, _, outcome)] = claims.evaluate(claim, artifacts)
    assert outcome.verdict == claims.REPRODUCED
    assert outcome.measured == "naive: deepest that fitted 160 layers; out of memory from 220 layers"


def test_memory_goal_states_the_ratio_at_each_depth_beside_the_two_storage_method(artifacts):
    ratios = {"shared_inplace": lambda d: 0.1 * d * (1.2 if d == 160 else 1.1),
              "shared": lambda d: 0.1 * d * 1.3}
    frame = fig4_frame("cpu", ratios)
    frame.loc[frame["impl"] == "shared_inplace", "excess_shared_storage_bytes"] = 1.5 * MIB
    frame.loc[frame["impl"] == "shared_inplace", "excess_per_channel_bytes"] = 0.25 * MIB
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", frame)
    lines = claims.memory_goal(artifacts)
    rows = [line for line in lines if line.startswith("| smoke-cpu")]
    assert len(rows) == len(DEPTHS)
    assert rows[0] == ("| smoke-cpu | a device | 40 | 1.100 | 1.300 | storage 1.50 + "
                       "per-channel states 0.25 MiB | <= 1.15 | **yes** |")
    assert rows[-1].startswith("| smoke-cpu | a device | 160 | 1.200 | 1.300 |")
    assert rows[-1].endswith("| **no** |")
    assert "## DenseNet memory goal" in claims.report(artifacts)


def test_memory_goal_without_the_one_storage_points(artifacts):
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE))
    assert claims.memory_goal(artifacts)[-1] == "No `shared_inplace` point yet."
