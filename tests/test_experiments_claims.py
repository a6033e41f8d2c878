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
                     "iabn_fig1_residual_block_buffers",
                     "iabn_ii_faster_than_checkpoint_proposed",
                     "densenet_noncontiguous_overhead")


#: The claims of the method's own accounting: they hold by construction, not by measurement.
BY_CONSTRUCTION_CLAIMS = ("iabn_memory_saving", "iabn_buffers_per_strategy",
                          "iabn_fig1_residual_block_buffers")


def test_gpu_numbers_like_the_papers_are_reproduced(artifacts):
    write(artifacts, "iabn_table1_timing", "paper-cuda", iabn_frame("cuda", GOOD))
    write(artifacts, "densenet_fig2_contiguous", "paper-cuda", fig2_frame("cuda", 40))
    got = verdicts(artifacts)
    for claim_id in PAPER_CUDA_CLAIMS:
        expected = (claims.BY_CONSTRUCTION if claim_id in BY_CONSTRUCTION_CLAIMS
                    else claims.REPRODUCED)
        assert got[(claim_id, "paper-cuda")] == expected, claim_id


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
    for claim_id in BY_CONSTRUCTION_CLAIMS:
        assert got[(claim_id, "smoke-cpu")] == claims.BY_CONSTRUCTION, claim_id


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


def test_report_counts_the_verdicts_of_each_paper_at_the_top(artifacts):
    write(artifacts, "iabn_table1_timing", "smoke-cpu", iabn_frame("cpu", GOOD))
    text = claims.report(artifacts)
    counts = text.split("\n## ")[0]
    assert ("| paper | reproduced | holds by construction | consistent at small scale | not "
            "reproduced | not measurable on this device | not measured at the claimed setting "
            "| not run | not implemented | rows |") in counts
    for paper in ("Pleiss et al. 2017", "Rota Bulò et al. 2018"):
        got = [verdict for (claim_id, _), verdict in verdicts(artifacts).items()
               if next(c for c in claims.load_claims(artifacts)
                       if c["id"] == claim_id)["paper"].startswith(paper)]
        row = " | ".join(str(got.count(v)) for v in claims.VERDICTS)
        assert f"{paper}" in counts and f" | {row} | {len(got)} |" in counts, paper
    # The timing run's three accounting claims hold by construction, three GPU timings are not
    # measurable on its CPU.
    assert "| 0 | 3 | 0 | 0 | 3 |" in counts
    for verdict in claims.VERDICTS:
        assert f"**{verdict}**: " in counts, verdict


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
#: The paper's LuaTorch-only memory figures: never judged on this project's PyTorch runs.
LUATORCH_CLAIMS = ("densenet_memory_160_layers", "densenet_naive_over_12gb_beyond_160_layers")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_densenet_memory_claims_are_judged_from_saved_bytes_on_any_device(artifacts, device):
    write(artifacts, "densenet_fig4_memory", f"like-{device}", fig4_frame(device, PAPER_LIKE))
    write(artifacts, "densenet_fig4_memory", f"unlike-{device}", fig4_frame(device, UNLIKE))
    got = verdicts(artifacts)
    for claim_id in set(FIG4_MEMORY_CLAIMS) - set(LUATORCH_CLAIMS):
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


def _outcomes(artifacts, claim_id):
    """``{run: Outcome}`` of ``claim_id``."""
    claim = next(c for c in claims.load_claims(artifacts) if c["id"] == claim_id)
    return {run: outcome for run, _, outcome in claims.evaluate(claim, artifacts)}


def test_densenet_500_layers_needs_a_gpu_with_the_papers_budget(artifacts):
    deep = (40, 160, 280, 400, 472, 496, 520)
    naive_out = {("naive", d) for d in deep if d > 160}
    write(artifacts, "densenet_fig4_memory", "fits-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={*naive_out, ("shared", 520)}))
    write(artifacts, "densenet_fig4_memory", "short-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={*naive_out, ("shared", 400),
                                                              ("shared", 472), ("shared", 496),
                                                              ("shared", 520)}))
    write(artifacts, "densenet_fig4_memory", "roomy-cuda",
          fig4_frame("cuda", PAPER_LIKE, deep, budget_gib=None, enforced=False))
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", fig4_frame("cpu", PAPER_LIKE, deep))
    outcomes = _outcomes(artifacts, "densenet_pytorch_500_layers")
    assert {run: o.verdict for run, o in outcomes.items()} == {
        "fits-cuda": claims.REPRODUCED, "short-cuda": claims.NOT_REPRODUCED,
        "roomy-cuda": claims.NOT_MEASURED, "smoke-cpu": claims.NOT_MEASURABLE}
    assert outcomes["fits-cuda"].measured.startswith(
        "shared storage: deepest that fitted 496 layers (246.0M parameters); out of memory "
        "from 520 layers; deepest that fitted: checkpoint 520, naive 160, torchvision 520")
    assert "80.0 GiB" in outcomes["roomy-cuda"].reason
    assert outcomes["fits-cuda"].reason.startswith(
        "criterion: the deepest DenseNet-BC with shared storage that fits 12.0 GiB has 450-550 "
        "layers (the paper's limit, 'nearly 500', +/- 10%")


@pytest.mark.parametrize("fits, fails, verdict", [
    (442, 448, claims.NOT_REPRODUCED), (454, 460, claims.REPRODUCED),
    (544, 550, claims.REPRODUCED), (556, 562, claims.NOT_REPRODUCED),
    (568, None, claims.NOT_REPRODUCED)])
def test_densenet_500_layers_is_a_band_around_the_papers_limit_on_a_gpu(artifacts, fits, fails,
                                                                         verdict):
    """The limit between the deepest depth that fitted and the first that did not lies within
    450-550 layers: below or beyond it, the memory is unlike the paper's."""
    depths = (40, 160, fits) + ((fails,) if fails else ())
    write(artifacts, "densenet_fig4_memory", "paper-cuda",
          fig4_frame("cuda", PAPER_LIKE, depths, out_of_memory={("shared", fails)}))
    outcome = _outcomes(artifacts, "densenet_pytorch_500_layers")["paper-cuda"]
    assert outcome.verdict == verdict
    assert "settled by the measured depths" in outcome.reason


@pytest.mark.parametrize("peak_gib_at, verdict", [
    ({40: 0.1, 160: 0.4}, claims.NOT_MEASURED),
    ({40: 0.1, 160: 0.4, 280: 0.7}, claims.NOT_REPRODUCED)])
def test_densenet_500_layers_without_a_bracket_is_judged_by_the_memory_models_fit(
        artifacts, peak_gib_at, verdict):
    """Every measured depth fitted: the fit of the peak over depth (linear here, 2.5 GiB per
    1000 layers) puts the limit far beyond 550, unless there are too few depths to fit."""
    depths = tuple(peak_gib_at)
    frame = fig4_frame("cuda", PAPER_LIKE, depths)
    shared = frame["impl"] == "shared"
    frame.loc[shared, "peak_bytes"] = frame.loc[shared, "depth"].map(peak_gib_at) * 2 ** 30
    write(artifacts, "densenet_fig4_memory", "paper-cuda", frame)
    outcome = _outcomes(artifacts, "densenet_pytorch_500_layers")["paper-cuda"]
    assert outcome.verdict == verdict
    if verdict == claims.NOT_REPRODUCED:
        assert "meets the budget at 4798 layers" in outcome.reason


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
    assert _outcomes(artifacts, "densenet_shared_time_overhead")["paper-cuda"].reason == (
        "criterion: overhead within 15-25% (the paper's 'roughly' 20% on PyTorch +/- 5 pp, the "
        "gap between it and LuaTorch's 15%: a speed-up or a far larger cost is not the paper's)")
    assert _outcomes(artifacts, "densenet_shared_time_overhead")["smoke-cpu"].measured == (
        "DenseNet-BC-100, batch 64: shared storage +18.0% time over naive")


@pytest.mark.parametrize("overhead, verdict", [
    (-5, claims.NOT_REPRODUCED), (14, claims.NOT_REPRODUCED), (16, claims.REPRODUCED),
    (24, claims.REPRODUCED), (26, claims.NOT_REPRODUCED)])
def test_densenet_time_overhead_is_a_band_around_pytorchs_20_percent(artifacts, overhead,
                                                                      verdict):
    write(artifacts, "densenet_fig5_time", "paper-cuda", fig5_frame("cuda", {"shared": overhead}))
    assert _outcomes(artifacts, "densenet_shared_time_overhead")["paper-cuda"].verdict == verdict


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
    expected = {"memory-efficient-densenets.txt": (
                    "4.51", "5.18", "22.27", "24.30", "22%", "nearly 500 layers", "20.26%",
                    "15%", "20% on PyTorch", "from quadratic to linear", "14M parameters",
                    "up from 4M", "340-layer model", "2.5", "as deep and has 6", "1.8M",
                    "160K", "29M", "20M", "55M", "33M", "73M", "roughly 5%",
                    "does not incur any time cost", "nearly 1 percentage point",
                    "6, 32, 64, and 48"),
                "inplace-abn.txt": ("0.8", "up to 50%", "+75%", "77.04", "78.08", "74.42",
                                    "79.16", "79.40", "82.03", "53.12", "53.37", "6 buffers",
                                    "only 3 buffers", "256 images per batch",
                                    "similar accuracy", "noticeable performance increase",
                                    "LEAKY RELU with slope")}
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


def with_simulated_depths(frame, impl, peak_gib):
    """``frame`` plus ``impl``'s simulated depths: ``peak_gib = {depth: simulated peak}``."""
    rows = [{"impl": impl, "kind": "simulated_depth", "memory": "simulated_meta_device",
             "device": "cpu", "env_device_name": "a device", "batch": 64, "depth": depth,
             "param_count": 1000 * depth ** 2, "tensor_peak_bytes": peak * 2 ** 30,
             "fits": peak <= 12, "memory_budget_gib": 12.0} for depth, peak in peak_gib.items()]
    return pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_densenet_500_layers_judged_on_simulated_points_without_a_gpu(artifacts, device):
    deep = (40, 160, 280, 400, 472, 496, 520)
    measured = fig4_frame(device, PAPER_LIKE, deep,
                          out_of_memory={("naive", d) for d in deep if d > 160}
                          | {("shared", 400), ("shared", 472), ("shared", 496), ("shared", 520)})
    write(artifacts, "densenet_fig4_memory", f"fits-{device}", with_simulated(
        measured, {"shared": (496, False, 502), "naive": (268, False, 274)}))
    write(artifacts, "densenet_fig4_memory", f"far-{device}", with_simulated(
        measured, {"shared": (1000, True, None)}))
    write(artifacts, "densenet_fig4_memory", f"short-{device}", with_simulated(
        measured, {"shared": (280, False, 286)}))
    got = {run: o.verdict for run, o in _outcomes(artifacts, "densenet_pytorch_500_layers").items()}
    if device == "cuda":  # real allocation judges: shared ran out of memory from 400 layers
        assert set(got.values()) == {claims.NOT_REPRODUCED}
        return
    assert got == {"fits-cpu": claims.REPRODUCED, "far-cpu": claims.NOT_REPRODUCED,
                   "short-cpu": claims.NOT_REPRODUCED}
    outcomes = _outcomes(artifacts, "densenet_pytorch_500_layers")
    assert outcomes["far-cpu"].measured.startswith("simulated tensor memory, batch 64, 12 GiB: "
                                                   "shared storage fits at least 1000 layers")
    assert "naive 268 layers" in outcomes["fits-cpu"].measured
    assert "simulated tensor memory" in outcomes["fits-cpu"].reason
    assert "CUDA caching" in outcomes["fits-cpu"].reason


@pytest.mark.parametrize("reaches_budget_at, verdict", [
    (420, claims.NOT_REPRODUCED), (500, claims.REPRODUCED), (800, claims.NOT_REPRODUCED)])
def test_a_capped_simulated_search_is_extended_by_the_fit_over_depth(artifacts,
                                                                     reaches_budget_at, verdict):
    """The search stopped at 400 layers, all fitting: the quadratic fit of the simulated peaks
    over depth finds the limit, judged in 450-550 layers."""
    peaks = {d: 12 * (d / reaches_budget_at) ** 2 for d in (40, 100, 160, 250, 400)}
    frame = with_simulated_depths(with_simulated(fig4_frame("cpu", PAPER_LIKE),
                                                 {"shared": (400, True, None)}), "shared", peaks)
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", frame)
    outcome = _outcomes(artifacts, "densenet_pytorch_500_layers")["smoke-cpu"]
    assert outcome.verdict == verdict
    assert "least-squares quadratic" in outcome.reason
    limit = {420: 418, 500: 496, 800: 796}[reaches_budget_at]
    assert outcome.measured.startswith(
        "simulated tensor memory, batch 64, 12 GiB: shared storage fits at least 400 layers "
        f"(160.0M parameters, 1.00 GiB); the fit of its peaks over depth meets the budget at "
        f"{limit} layers")


@pytest.mark.parametrize("naive", [(160, False, 166), (268, False, 274), (1000, True, None)])
def test_luatorch_memory_figures_are_not_judged_on_pytorch(artifacts, naive):
    """One rule for the paper's LuaTorch-only numbers (22% of naive at 160 layers; naive needs
    over 12 GB beyond 160 layers): a PyTorch run shows its numbers beside them, unjudged."""
    frame = with_simulated(fig4_frame("cpu", PAPER_LIKE), {"naive": naive})
    write(artifacts, "densenet_fig4_memory", "smoke-cpu", frame)
    for claim_id in LUATORCH_CLAIMS:
        outcome = _outcomes(artifacts, claim_id)["smoke-cpu"]
        assert outcome.verdict == claims.NOT_MEASURED, claim_id
        assert outcome.reason.startswith(claims.LUATORCH_RULE), claim_id
    limit = _outcomes(artifacts, "densenet_naive_over_12gb_beyond_160_layers")["smoke-cpu"]
    assert f"PyTorch naive fits {'at least ' if naive[1] else ''}{naive[0]} layers" in \
        limit.measured
    share = _outcomes(artifacts, "densenet_memory_160_layers")["smoke-cpu"]
    assert "shared 1.7% of naive" in share.measured


def test_luatorch_memory_figures_on_a_gpu_show_real_allocation(artifacts):
    deep = (40, 100, 160, 220)
    frame = fig4_frame("cuda", PAPER_LIKE, deep, out_of_memory={("naive", 220)})
    write(artifacts, "densenet_fig4_memory", "paper-cuda", frame)
    outcome = _outcomes(artifacts, "densenet_naive_over_12gb_beyond_160_layers")["paper-cuda"]
    assert outcome.verdict == claims.NOT_MEASURED
    assert outcome.measured == ("PyTorch naive: deepest that fitted 160 layers; out of memory "
                                "from 220 layers")


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


# --------------------------------------------------------------------------- InPlace-ABN timing
@pytest.mark.parametrize("inplace, verdict", [
    (-0.5, claims.NOT_REPRODUCED), (-0.1, claims.REPRODUCED), (2.9, claims.REPRODUCED),
    (3.1, claims.NOT_REPRODUCED)])
def test_inplace_abn_overhead_is_a_band_around_the_papers_range(artifacts, inplace, verdict):
    """0.8-2% +/- 1 pp: a 0.5% speed-up is not the paper's small cost either."""
    write(artifacts, "iabn_table1_timing", "paper-cuda",
          iabn_frame("cuda", {**GOOD, "inplace_abn_I": inplace, "checkpoint": 2 * inplace}))
    assert _outcomes(artifacts, "iabn_time_overhead")["paper-cuda"].verdict == verdict


@pytest.mark.parametrize("checkpoint, verdict", [
    (2.25, claims.NOT_REPRODUCED), (2.7, claims.REPRODUCED), (3.6, claims.REPRODUCED),
    (4.5, claims.NOT_REPRODUCED)])
def test_checkpointing_almost_doubles_the_overhead_within_a_band(artifacts, checkpoint, verdict):
    """CHECKPOINTING's overhead over INPLACE-ABN I's 1.5%: 1.5x and 3x are not 'almost twice',
    1.8x and 2.4x are."""
    write(artifacts, "iabn_table1_timing", "paper-cuda",
          iabn_frame("cuda", {**GOOD, "checkpoint": checkpoint}))
    outcome = _outcomes(artifacts, "iabn_checkpoint_doubles_overhead")["paper-cuda"]
    assert outcome.verdict == verdict
    assert outcome.reason.startswith("criterion: the median of CHECKPOINTING's overheads over "
                                     "the modules within 1.60-2.50x INPLACE-ABN I's")
    assert outcome.measured.endswith(f"median ratio {checkpoint / 1.5:.2f}x")


def test_checkpointing_cannot_double_no_overhead(artifacts):
    write(artifacts, "iabn_table1_timing", "paper-cuda",
          iabn_frame("cuda", {**GOOD, "inplace_abn_I": 0.0}))
    outcome = _outcomes(artifacts, "iabn_checkpoint_doubles_overhead")["paper-cuda"]
    assert outcome.verdict == claims.NOT_REPRODUCED
    assert outcome.reason.endswith("INPLACE-ABN I has no overhead to double")


# --------------------------------------------------------------------------- InPlace-ABN Table 2
#: Table 2's brackets, as the capacity claims name their cells.
BRACKETS = {("resnext101", "cityscapes", "fixed_crop"): 75,
            ("resnext101", "cocostuff", "fixed_crop"): 50,
            ("wideresnet38", "cityscapes", "fixed_crop"): 40,
            ("wideresnet38", "cocostuff", "fixed_crop"): 40,
            ("resnext101", "cityscapes", "fixed_batch"): 72,
            ("resnext101", "cocostuff", "fixed_batch"): 56,
            ("wideresnet38", "cityscapes", "fixed_batch"): 56,
            ("wideresnet38", "cocostuff", "fixed_batch"): 35}


def capacity_frame(gain_pct, memory="simulated_meta_device", width=1.0, budget_mib=12288,
                   device="cpu"):
    """An ``iabn_table2_capacity`` CSV: per cell, STD-BN 100 crops and InPlace-ABN
    ``100 + gain_pct[cell]`` (the bracket is their ratio of pixels)."""
    rows = [{"kind": "capacity", "memory": memory, "dataset": dataset, "body": body,
             "mode": mode, "norm": norm, "method": "allocation_search", "crops": crops,
             "crop_size": 512, "pixels": crops * 512 ** 2, "capacity_pixels": None,
             "width": width, "budget_mib": budget_mib, "device": device,
             "env_device_name": "a device"}
            for (body, dataset, mode), gain in gain_pct.items()
            for norm, crops in (("bn", 100), ("iabn", 100 + gain))]
    return pd.DataFrame(rows)


def capacity_verdicts(artifacts):
    """``{cell: verdict}`` of every bracket claim (the headline is ResNeXt-101 FIXED CROP on
    Cityscapes)."""
    return {cell: _outcomes(artifacts, claim_id)
            for claim_id, cell in claims.CAPACITY_CLAIMS.items()}


@pytest.mark.parametrize("offset, verdict", [
    (-6, claims.NOT_REPRODUCED), (-4, claims.REPRODUCED), (0, claims.REPRODUCED),
    (4, claims.REPRODUCED), (6, claims.NOT_REPRODUCED)])
def test_every_bracket_of_table2_is_judged_two_sided(artifacts, offset, verdict):
    """Each simulated bracket within 5 pp of the paper's, either side (the headline's +75%
    included: +81% is as far from it as +69%)."""
    write(artifacts, "iabn_table2_capacity", "smoke-cpu",
          capacity_frame({cell: pct + offset for cell, pct in BRACKETS.items()}))
    got = capacity_verdicts(artifacts)
    assert set(got) == set(BRACKETS)
    for cell, outcomes in got.items():
        outcome = outcomes["smoke-cpu"]
        assert outcome.verdict == verdict, cell
        assert "simulated tensor memory" in outcome.reason
    headline = got[("resnext101", "cityscapes", "fixed_crop")]["smoke-cpu"]
    assert headline.measured.startswith(f"ResNeXt-101 FIXED CROP on Cityscapes: {75 + offset:+d}%")
    assert f"within +70% to +80% (the paper's +75% +/- 5 pp)" in headline.reason


def test_the_headline_bracket_far_above_the_papers_is_not_reproduced(artifacts):
    write(artifacts, "iabn_table2_capacity", "smoke-cpu",
          capacity_frame({**BRACKETS, ("resnext101", "cityscapes", "fixed_crop"): 100}))
    outcome = _outcomes(artifacts, "iabn_segmentation_data_increase")["smoke-cpu"]
    assert outcome.verdict == claims.NOT_REPRODUCED


@pytest.mark.parametrize("width, budget_mib, device, held", [
    (0.0625, 90, "cpu", claims.CONSISTENT_SMALL_SCALE),
    (1.0, 12288, "cuda", claims.REPRODUCED)])
def test_real_brackets_say_at_which_scale_they_hold(artifacts, width, budget_mib, device, held):
    write(artifacts, "iabn_table2_capacity", f"x-{device}",
          capacity_frame(BRACKETS, memory="cpu_tracked_storages", width=width,
                         budget_mib=budget_mib, device=device))
    for cell, outcomes in capacity_verdicts(artifacts).items():
        assert outcomes[f"x-{device}"].verdict == held, cell


# --------------------------------------------------------------------------- InPlace-ABN Table 1
def imagenet_frame(top1, epochs=90, train_images=1_281_167):
    """An ``iabn_table1_imagenet`` CSV: ResNeXt-101 STD-BN and INPLACE-ABN^sync at batch 256,
    ``top1[point]`` at every evaluation."""
    return pd.DataFrame([
        {"point": point, "eval": evaluation, "model": "resnext101", "dataset": "imagenet",
         "model_args": "{}", "epochs": epochs, "train_images": train_images, "batch": 256,
         "world_size": 8, "params": 83_500_000, "top1_error_pct": 100 - accuracy,
         "top5_error_pct": 6.0, "device": "cuda", "env_device_name": "a device"}
        for point, accuracy in top1.items()
        for evaluation in ("center224", "crops10_224", "center320")])


@pytest.mark.parametrize("sync_top1, verdict", [
    (76.4, claims.NOT_REPRODUCED), (76.6, claims.REPRODUCED), (77.7, claims.REPRODUCED)])
def test_on_par_is_judged_on_imagenet_accuracy_at_the_papers_setting(artifacts, sync_top1,
                                                                     verdict):
    """INPLACE-ABN^sync at most 0.5 pp below STD-BN's 77.04% at the same batch."""
    write(artifacts, "iabn_table1_imagenet", "paper-cuda", imagenet_frame(
        {"resnext101_bn_256": 77.04, "resnext101_iabn_sync_256": sync_top1}))
    outcome = _outcomes(artifacts, "iabn_trains_on_par")["paper-cuda"]
    assert outcome.verdict == verdict
    assert outcome.measured == f"77.04% (STD-BN) vs {sync_top1:.2f}% (INPLACE-ABN^sync), batch 256"


def test_on_par_is_not_measured_by_a_small_run_or_by_the_parity_check(artifacts):
    parity = pd.DataFrame([{"point": "parity_resnext101", "model": "resnext101", "step": s,
                            "loss_std_bn": 2.0, "steps_within_rounding_inplace_abn": 100,
                            "max_loss_rel_diff_inplace_abn": 1e-12,
                            "steps_within_rounding_control": 100,
                            "max_loss_rel_diff_control": 1e-12, "device": "cpu",
                            "env_device_name": "a device"} for s in range(100)])
    small = imagenet_frame({"resnext101_bn_256": 40.0, "resnext101_iabn_sync_256": 41.0},
                           epochs=3, train_images=400)
    write(artifacts, "iabn_table1_imagenet", "smoke-cpu", pd.concat([small, parity]))
    alone = imagenet_frame({"resnext101_bn_256": 77.04})
    write(artifacts, "iabn_table1_imagenet", "parity-cpu", pd.concat([alone, parity]))
    on_par = _outcomes(artifacts, "iabn_trains_on_par")
    assert on_par["smoke-cpu"].verdict == claims.NOT_MEASURED
    assert "400 images" in on_par["smoke-cpu"].reason
    assert on_par["parity-cpu"].verdict == claims.NOT_MEASURED
    assert "iabn_float64_parity, is no accuracy" in on_par["parity-cpu"].reason
    exactness = _outcomes(artifacts, "iabn_float64_parity")
    assert {run: o.verdict for run, o in exactness.items()} == {
        "smoke-cpu": claims.BY_CONSTRUCTION, "parity-cpu": claims.BY_CONSTRUCTION}
    assert exactness["smoke-cpu"].reason.startswith("an exactness check of this "
                                                    "implementation, not an accuracy")
    diverged = parity.assign(steps_within_rounding_inplace_abn=3)
    write(artifacts, "iabn_table1_imagenet", "diverged-cpu", pd.concat([alone, diverged]))
    assert _outcomes(artifacts, "iabn_float64_parity")["diverged-cpu"].verdict == (
        claims.NOT_REPRODUCED)
