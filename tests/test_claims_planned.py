"""Every claim of ``artifacts/paper/`` is judged by points the paper profile plans, at the
claim's own setting: no orphan claim (one whose experiment or points the pipeline never runs,
unless its entry says ``not_planned`` and what judging it would take), and no claim judged
from another data set's points. Also: the claims report's job counts and GPU-hours per
experiment (:func:`experiments.report.claims.paper_jobs`) are those Snakemake plans.

The plan is ``snakemake -n --config profile=paper`` in a working directory of the test's own
(:func:`snakemake_run.snakemake`, as tests/test_pipeline.py plans it); the points a claim
needs are read here from its entry and from the evaluators' own constants, so a renamed point
or a profile that drops one fails here, not in a run on GPUs.
"""
import re

import pytest
import yaml

from experiments.report import claims, segmentation_claims, training_claims
from experiments.train import plan, seg_plan
from snakemake_run import make_workdir, snakemake

RUN = "paper-cuda"
PROFILE = yaml.safe_load(claims.PAPER_PROFILE.read_text())
TRAINING = {e: plan.point_specs(PROFILE[e]) for e in claims.TRAINING_EXPERIMENTS}
SEGMENTATION = seg_plan.point_specs(PROFILE["iabn_table2_segmentation"],
                                    TRAINING["iabn_table1_imagenet"])
#: The papers' training epochs per experiment (Pleiss et al.: 300 on CIFAR, 100 on ImageNet;
#: Rota Bulò et al.: 90 on ImageNet).
PAPER_EPOCHS = {"densenet_fig2_preact": 300, "densenet_fig6_imagenet": 100,
                "iabn_table1_imagenet": 90}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """``({experiment: {planned point}}, {rule: job count})`` of the paper profile's plan."""
    workdir = make_workdir(tmp_path_factory.mktemp("paper"))
    result = snakemake(workdir, "-n", "--config", "profile=paper")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    points = {}
    for experiment, point in re.findall(rf"artifacts/(\w+)/{RUN}/(\w+)\.json", output):
        points.setdefault(experiment, set()).add(point)
    table = output.split("Job stats:")[1].split("total")[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
    return points, counts


def needed_points(claim):
    """The points of its experiment that ``claim``'s evaluator reads (empty: it reads all)."""
    claim_id, experiment = claim["id"], claim["experiment"]
    points = {claim["point"]} if "point" in claim else set()
    points |= {p for pair in claim.get("pairs", ()) for p in pair} | set(claim.get("similar", ()))
    if claim_id in claims.CAPACITY_CLAIMS:
        body, dataset, mode = claims.CAPACITY_CLAIMS[claim_id]
        points |= {f"{prefix}{dataset}_{body}_{norm}_{mode}" for prefix in ("", "simulated_")
                   for norm in ("bn", "iabn")}
    points |= set({"iabn_trains_on_par": training_claims.ON_PAR_POINTS.values(),
                   "iabn_imagenet_top1": training_claims.IABN_TOP1_POINTS,
                   "densenet_imagenet_top1": (training_claims.DENSENET_TOP1_POINT,),
                   "iabn_segmentation_miou": segmentation_claims.MIOU_POINTS}.get(claim_id, ()))
    depths = claim.get("depths", [claim["depth"]] if "depth" in claim else [])
    if experiment == "densenet_fig4_memory" and "models" not in claim:
        impls = ("naive",) if claim_id == "densenet_naive_memory_160_vs_40" else ("naive", "shared")
        points |= {f"{impl}_d{depth}" for impl in impls for depth in depths}
        if "budget_gib" in claim:  # a limit in the budget: the simulated searches judge it
            impls = claim["value"] if isinstance(claim["value"], dict) else ("shared",)
            points |= {f"simulated_{impl}" for impl in impls}
    if experiment == "densenet_fig5_time":
        points |= {f"d{depth}" for depth in depths}
    return points


def orphans(entries, points):
    """``[(claim id, experiment, missing points)]`` of the claims in ``entries`` that the
    planned ``points`` (``{experiment: {point}}``) do not judge."""
    found = []
    for claim in entries:
        if "not_planned" in claim:
            assert "judging it takes" in claim["not_planned"], claim["id"]
            continue
        have = points.get(claim["experiment"], set())
        missing = needed_points(claim) - have
        if not have or missing:
            found.append((claim["id"], claim["experiment"], sorted(missing)))
    return found


def test_every_claim_is_judged_by_planned_points(planned):
    points, _ = planned
    entries = claims.load_claims(claims.EXPERIMENTS_DIR.parent / "artifacts")
    assert orphans(entries, points) == []
    # A claim whose point, experiment or data set's capacity points are not planned is one.
    by_id = {claim["id"]: claim for claim in entries}
    renamed = {**by_id["iabn_table2_order_sync"], "pairs": [["resnext101_x", "wideresnet38_y"]]}
    elsewhere = {**by_id["densenet_bn_time_share"], "experiment": "densenet_fig9_unheard"}
    del elsewhere["not_planned"]
    cocostuff = {e: p for e, p in points.items()}
    cocostuff["iabn_table2_capacity"] = {p for p in points["iabn_table2_capacity"]
                                         if "cocostuff" not in p}
    assert [o[0] for o in orphans([renamed, elsewhere], points)] == [
        "iabn_table2_order_sync", "densenet_bn_time_share"]
    assert {o[0] for o in orphans(entries, cocostuff)} == {
        claim_id for claim_id, (_, dataset, _) in claims.CAPACITY_CLAIMS.items()
        if dataset == "cocostuff"}


def test_the_judging_points_are_at_their_claims_setting(planned):
    """The training points at the papers' data sets and epochs, each Table 2 cell on its own
    data set (the point's name), the capacity points at full width and 12 GiB per GPU, and the
    pre-activation claims on their own CIFAR."""
    for claim in claims.load_claims(claims.EXPERIMENTS_DIR.parent / "artifacts"):
        experiment = claim["experiment"]
        for point in needed_points(claim):
            if experiment in TRAINING:
                spec = TRAINING[experiment][point]
                assert spec["epochs"] == PAPER_EPOCHS[experiment], (claim["id"], point)
                assert spec["dataset"] == "imagenet", (claim["id"], point)
            elif experiment == "iabn_table2_segmentation":
                spec = SEGMENTATION[point]
                dataset = spec["dataset"]
                assert point.startswith("bottom_") or f"_{dataset}_" in point, point
                assert spec["epochs"] == segmentation_claims.EPOCHS[dataset], point
                assert {k: spec[k] for k in segmentation_claims.BOOTSTRAPPING} == (
                    segmentation_claims.BOOTSTRAPPING), point
            elif experiment == "iabn_table2_capacity":
                _, dataset, _ = claims.CAPACITY_CLAIMS[claim["id"]]
                assert point.removeprefix("simulated_").startswith(f"{dataset}_"), point
    for section in (PROFILE["iabn_table2_capacity"], PROFILE["iabn_table2_capacity"]["simulated"]):
        assert section["width"] == 1.0 and section["budget_mib"] == claims.PAPER_BUDGET_MIB
    preact = {(s["dataset"], s["model_args"]["preact"], s["epochs"])
              for s in TRAINING["densenet_fig2_preact"].values()}
    for dataset in ("cifar10", "cifar100"):
        assert {(dataset, True, 300), (dataset, False, 300)} <= preact, dataset


def test_the_reports_jobs_are_the_planned_jobs(planned):
    _, counts = planned
    jobs = claims.paper_jobs(PROFILE)
    for experiment, entries in jobs.items():
        expected = counts[f"{experiment}_point"] + counts.get(f"{experiment}_parity", 0)
        assert len(entries) == expected, experiment
    # The GPUs of a job: one per measurement point, torchrun's processes for a training one.
    assert {g for g, _, _ in jobs["densenet_fig6_imagenet"]} == {8}
    assert {g for g, _, _ in jobs["iabn_table2_segmentation"]} == {4}
