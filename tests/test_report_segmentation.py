"""InPlace-ABN Table 2 in the report: :func:`experiments.iabn_table2_segmentation.table2` and
the notebook's tables (:mod:`experiments.report.training`) on synthetic aggregated CSVs, the
Table 2 claims of ``artifacts/paper/inplace_abn.yaml`` and their verdicts
(:mod:`experiments.report.segmentation_claims`)."""
import io
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments.iabn_table2_segmentation import BASELINE, ROWS, table2
from experiments.report import claims, segmentation_claims, training

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "artifacts" / "paper"
EXPERIMENT = "iabn_table2_segmentation"
BODIES = {"ResNeXt-101": "resnext101", "WideResNet-38": "wideresnet38"}
DATASETS = {"Cityscapes": "cityscapes", "COCO-Stuff": "cocostuff", "Mapillary Vistas": "vistas"}
CONFIGS = {label: config for config, label in ROWS.items()}
NORMS = {"bn_fixed_crop": "bn", "iabn_fixed_crop": "iabn", "iabn_fixed_batch": "iabn",
         "iabn_sync_fixed_batch": "iabn_sync", "bottom": "iabn_sync"}
DEVICES = 4


@pytest.fixture
def artifacts(tmp_path):
    shutil.copytree(PAPER, tmp_path / "paper")
    return tmp_path


def _row(point, body, dataset, config, crops, crop_size, miou, *, full, evaluation="single",
         scales="1", flip=False, class_uniform=False, width=1 / 16):
    """One aggregated row: ``crops`` over all devices; ``full``: the paper's data set size,
    epochs and a full-width body, else a smoke run's."""
    per_device = max(crops // DEVICES, 1)
    return {
        "experiment": EXPERIMENT, "run": "x", "point": point, "dataset": dataset, "body": body,
        "model_args": json.dumps({} if full else {"width": width}), "norm": NORMS[config],
        "output_stride": 8, "crops_per_device": per_device, "crop_size": crop_size,
        "class_uniform": class_uniform, "coarse": False,
        "epochs": segmentation_claims.EPOCHS[dataset] if full else 8, "lr": 2.5e-3,
        "bootstrap_p": 1.0, "bootstrap_m": 0.25 if full else 1.0,
        "device": "cuda" if full else "cpu", "env_device_name": "a device",
        "eval": evaluation, "scales": scales, "flip": flip, "miou_pct": miou,
        "pixel_accuracy_pct": 90.0, "images": 500, "iou_per_class_pct": json.dumps([miou] * 3),
        "devices": crops // per_device, "crops": crops, "pixels": crops * crop_size ** 2,
        "params": 60e6,
        "train_images": segmentation_claims.FULL_TRAIN_IMAGES[dataset] if full else 12,
        "val_images": 500 if full else 4, "classes": 19, "train_time_s": 1.0,
        "final_train_loss": 0.5}


def seg_frame(full=False, miou_offset=0.0, crops=None, bottom_crops=None, skip=()):
    """A run of every point at the paper's batch compilations and mIoU (plus
    ``miou_offset``); ``crops``: ``{point: (crops, crop size)}`` overrides; the bottom points
    evaluated at single scale and, on Cityscapes, 5 scales + flipping; points in ``skip``
    left out."""
    rows = []
    for r in pd.read_csv(PAPER / "iabn_table2_segmentation.csv").itertuples():
        body, dataset, config = BODIES[r.body], DATASETS[r.dataset], CONFIGS[r.batchnorm]
        point = f"{body}_{dataset}_{config}"
        n, size = (crops or {}).get(point, (r.crops, r.crop_size))
        rows.append(_row(point, body, dataset, config, n, size, r.miou_pct + miou_offset,
                         full=full))
    bottom = pd.read_csv(PAPER / "iabn_table2_segmentation_bottom.csv").dropna(subset=["point"])
    for r in bottom.itertuples():
        dataset = DATASETS[r.dataset]
        n, size = (bottom_crops or {}).get(r.point, (r.crops, r.crop_size))
        args = dict(full=full, class_uniform=bool(r.class_uniform))
        rows.append(_row(r.point, "wideresnet38", dataset, "bottom", n, size,
                         r.miou_pct + miou_offset, **args))
        if dataset == "cityscapes":
            rows.append(_row(r.point, "wideresnet38", dataset, "bottom", n, size,
                             r.miou_pct + miou_offset + 1.5, evaluation="ms_flip",
                             scales="1,1.25,1.5,1.75,2", flip=True, **args))
    frame = pd.DataFrame(rows)
    return frame[~frame["point"].isin(skip)].reset_index(drop=True)


def write(artifacts, run, frame):
    frame.assign(run=run).to_csv(artifacts / f"{EXPERIMENT}.{run}.csv", index=False)


def table2_claims(path=PAPER):
    document = yaml.safe_load((path / "inplace_abn.yaml").read_text(encoding="utf-8"))
    return [c for c in document["claims"] if c["experiment"] == EXPERIMENT]


def outcomes(artifacts):
    """``{(claim id, run): Outcome}`` of every Table 2 claim."""
    return {(c["id"], run): outcome
            for c in claims.load_claims(artifacts) if c["experiment"] == EXPERIMENT
            for run, _, outcome in claims.evaluate(c, artifacts)}


# --------------------------------------------------------------------------- table2()
def test_table2_brackets_are_against_the_body_and_datasets_std_bn_row():
    # An aggregated CSV reads the scales column back as numbers where all are "1".
    frame = pd.read_csv(io.StringIO(seg_frame().to_csv(index=False)))
    table = table2(frame)
    assert len(table) == 16
    cell = table.set_index("point")
    expected = pd.read_csv(PAPER / "iabn_table2_segmentation.csv")
    for r in expected.itertuples():
        row = cell.loc[f"{BODIES[r.body]}_{DATASETS[r.dataset]}_{CONFIGS[r.batchnorm]}"]
        assert (row["crops"], row["crop_size"]) == (r.crops, r.crop_size)
        assert row["miou_pct"] == pytest.approx(r.miou_pct)
        # The paper's brackets are these pixel ratios, rounded (its +72% is 16 x 672^2 over
        # 16 x 512^2, 72.3%).
        assert round(row["increase_pct"]) == r.data_increase_pct, row.name
    assert cell.loc["resnext101_cityscapes_iabn_fixed_crop", "increase_pct"] == pytest.approx(75)
    assert cell.loc["wideresnet38_cocostuff_iabn_fixed_batch", "increase_pct"] == pytest.approx(
        100 * (576 ** 2 / 496 ** 2 - 1))


def test_table2_keeps_the_papers_row_order_and_only_the_top_points():
    frame = seg_frame().sample(frac=1, random_state=0)
    table = table2(frame)
    assert list(table["config"]) == [c for c in ROWS for _ in range(4)]
    assert list(table["batchnorm"][:4]) == [ROWS[BASELINE]] * 4
    assert list(zip(table["body"][:4], table["dataset"][:4])) == [
        ("resnext101", "cityscapes"), ("resnext101", "cocostuff"),
        ("wideresnet38", "cityscapes"), ("wideresnet38", "cocostuff")]
    assert not table["point"].str.startswith("bottom").any()
    assert table2(frame, "ms_flip").empty  # only the bottom points have it


def test_table2_without_a_std_bn_row_has_no_bracket():
    table = table2(seg_frame(skip={"resnext101_cityscapes_bn_fixed_crop"})).set_index("point")
    assert pd.isna(table.loc["resnext101_cityscapes_iabn_fixed_crop", "increase_pct"])
    assert table.loc["resnext101_cocostuff_iabn_fixed_crop", "increase_pct"] == pytest.approx(50)


def test_table2_names_missing_columns():
    with pytest.raises(KeyError, match="pixels"):
        table2(seg_frame().drop(columns=["pixels"]))


# --------------------------------------------------------------------------- notebook tables
def test_compilation_is_printed_as_the_paper_does():
    assert training.compilation(28, 512, 75.2) == "28 x 512^2 [+75%]"
    assert training.compilation(16, 512, 0.0) == "16 x 512^2"
    assert training.compilation(16, 512, float("nan")) == "16 x 512^2"
    assert training.compilation(16, 672, 72.27, " × ", "²") == "16 × 672² [+72%]"
    assert training.compilation(float("nan"), 512) == ""


def test_table2_layout_sets_the_run_beside_the_paper():
    frame = seg_frame(crops={"resnext101_cityscapes_iabn_fixed_crop": (24, 512)},
                      skip={"wideresnet38_cocostuff_iabn_sync_fixed_batch"})
    layout = training.table2_layout(training.table2(frame)).set_index("BATCHNORM")
    assert list(layout.index) == list(ROWS.values())
    assert layout.loc["INPLACE-ABN, FIXED CROP", "ResNeXt-101 Cityscapes"] == "24 × 512² [+50%]"
    assert layout.loc["INPLACE-ABN, FIXED CROP", "ResNeXt-101 Cityscapes paper"] == (
        "28 × 512² [+75%]")
    assert layout.loc["STD-BN + LEAKY RELU", "WideResNet-38 COCO-Stuff"] == "20 × 496²"
    assert layout.loc["INPLACE-ABN, FIXED BATCH", "WideResNet-38 Cityscapes mIoU"] == (
        pytest.approx(78.31))
    assert layout.loc["INPLACE-ABN sync, FIXED BATCH", "WideResNet-38 COCO-Stuff paper mIoU"] == (
        pytest.approx(25.11))
    missing = layout.loc["INPLACE-ABN sync, FIXED BATCH"]
    assert missing["WideResNet-38 COCO-Stuff"] == ""
    assert math.isnan(missing["WideResNet-38 COCO-Stuff mIoU"])
    assert len(layout.columns) == 16


def test_table2_layout_appends_the_bottom_rows_in_their_data_sets_columns():
    frame = seg_frame(full=True, skip={"bottom_cityscapes"})
    layout = training.table2_layout(training.table2(frame), training.table2_bottom(frame))
    assert len(layout) == 4 + 6 and len(layout.columns) == 1 + 5 * 4
    rows = layout.set_index("BATCHNORM")
    assert rows.loc["STD-BN + LEAKY RELU", "WideResNet-38 Mapillary Vistas"] == ""
    vistas = rows.loc["Mapillary Vistas val (single model & scale, no horizontal flipping) + "
                      "CLASS-UNIFORM SAMPLING"]
    assert vistas["WideResNet-38 Mapillary Vistas"] == "12 × 776²"
    assert vistas["WideResNet-38 Mapillary Vistas mIoU"] == pytest.approx(53.12)
    assert vistas["WideResNet-38 Mapillary Vistas paper mIoU"] == pytest.approx(53.12)
    assert vistas["WideResNet-38 Cityscapes"] == "" and vistas["ResNeXt-101 Cityscapes"] == ""
    without = rows.loc["Cityscapes val (single model & scale)"]
    assert without["WideResNet-38 Cityscapes"] == ""
    assert without["WideResNet-38 Cityscapes paper"] == "12 × 872²"
    test = rows.loc[[label for label in rows.index if label.startswith("Cityscapes test")]]
    assert list(test.index) == [
        "Cityscapes test (single Vistas pre-trained model, 5 scales + horizontal flipping, "
        "fine + coarse label data) + CLASS-UNIFORM SAMPLING (test set: benchmark server, "
        "not run)"]
    assert test["WideResNet-38 Cityscapes paper mIoU"].iloc[0] == pytest.approx(82.03)
    assert math.isnan(test["WideResNet-38 Cityscapes mIoU"].iloc[0])


def test_table2_bottom_lists_the_papers_rows_and_the_runs_other_evaluations():
    table = training.table2_bottom(seg_frame(full=True))
    assert list(zip(table["point"].fillna("-"), table["eval"], table["split"])) == [
        ("bottom_cityscapes", "single", "val"), ("bottom_cityscapes", "ms_flip", "val"),
        ("bottom_cityscapes_cus", "single", "val"), ("bottom_cityscapes_cus", "ms_flip", "val"),
        ("-", "ms_flip", "test"), ("bottom_vistas_cus", "single", "val"),
        ("-", "single", "test")]
    assert list(table["paper_miou_pct"].fillna(0)) == [79.16, 0, 79.40, 0, 82.03, 53.12, 53.37]
    assert table.loc[0, "miou_pct"] == pytest.approx(79.16)
    assert table.loc[1, "miou_pct"] == pytest.approx(80.66)
    assert table.loc[1, "row"] == ("Cityscapes val (scales 1,1.25,1.5,1.75,2 + horizontal "
                                   "flipping)")
    assert table.loc[3, "row"].endswith("+ CLASS-UNIFORM SAMPLING")
    assert list(table["data"]) == ["Cityscapes"] * 5 + ["Mapillary Vistas"] * 2
    assert table[table["split"] == "test"]["miou_pct"].isna().all()
    assert (table.loc[[0, 2, 5], "crops"] == table.loc[[0, 2, 5], "paper_crops"]).all()


def test_segmentation_scale_names_each_data_set_and_the_width():
    assert training.segmentation_scale(seg_frame()) == (
        "Cityscapes: 8 epochs on 12 training images; COCO-Stuff: 8 epochs on 12 training "
        "images; Mapillary Vistas: 8 epochs on 12 training images; body width 0.0625")
    assert training.segmentation_scale(seg_frame(full=True)).endswith(
        "Mapillary Vistas: 90 epochs on 18,000 training images; full-width bodies")


# --------------------------------------------------------------------------- claims
def test_every_cell_of_table2_is_a_claim_with_the_papers_numbers():
    entries = {c["id"]: c for c in table2_claims()}
    top = pd.read_csv(PAPER / "iabn_table2_segmentation.csv")
    for r in top.itertuples():
        point = f"{BODIES[r.body]}_{DATASETS[r.dataset]}_{CONFIGS[r.batchnorm]}"
        claim = entries.pop(f"iabn_table2_{point}")
        assert claim["point"] == point
        expected = {"crops": r.crops, "crop_size": r.crop_size, "miou_pct": r.miou_pct}
        if r.data_increase_pct:
            expected["increase_pct"] = r.data_increase_pct
        assert claim["value"] == expected, point
    bottom = pd.read_csv(PAPER / "iabn_table2_segmentation_bottom.csv")
    ids = ["iabn_table2_bottom_cityscapes", "iabn_table2_bottom_cityscapes_cus",
           "iabn_table2_cityscapes_test", "iabn_table2_bottom_vistas_cus",
           "iabn_table2_vistas_test"]
    for claim_id, r in zip(ids, bottom.itertuples()):
        claim = entries.pop(claim_id)
        assert claim["value"] == {"crops": r.crops, "crop_size": r.crop_size,
                                  "miou_pct": r.miou_pct}
        assert claim.get("point") == (r.point if isinstance(r.point, str) else None)
        assert ("benchmark server" in claim["statement"]) == (r.split == "test")
    assert set(entries) == {"iabn_segmentation_miou", *segmentation_claims.ORDERINGS}


def test_every_table2_claim_has_an_evaluator():
    for claim in table2_claims():
        assert claim["id"] in claims.EVALUATORS, claim["id"]
        for field in ("id", "experiment", "statement", "claimed", "value", "unit", "setting",
                      "source", "quote"):
            assert field in claim, (claim["id"], field)


def test_table2_quotes_are_copied_from_the_papers_text():
    text = ROOT.parent / "shared" / "papers" / "inplace-abn.txt"
    if not text.is_file():
        pytest.skip(f"no paper text at {text}")
    body = text.read_text(encoding="utf-8")
    for claim in table2_claims():
        if claim["id"].startswith("iabn_table2_"):
            assert claim["quote"] in body, claim["id"]


# --------------------------------------------------------------------------- verdicts
TEST_ROWS = ("iabn_table2_cityscapes_test", "iabn_table2_vistas_test")


def test_a_smoke_run_is_not_measured_at_the_claimed_setting_and_shows_what_it_measured(
        artifacts):
    write(artifacts, "smoke-cpu", seg_frame(full=False))
    got = outcomes(artifacts)
    for (claim_id, run), outcome in got.items():
        expected = claims.NOT_RUN if claim_id in TEST_ROWS else claims.NOT_MEASURED
        assert outcome.verdict == expected, claim_id
    cell = got[("iabn_table2_resnext101_cityscapes_iabn_fixed_crop", "smoke-cpu")]
    assert cell.measured == ("28 x 512^2 [+75%] (7 per device on 4 device(s), 60.0M "
                             "parameters), 75.80% mIoU")
    assert cell.reason == "trained on 12 cityscapes training images (the paper: 2,975)"
    bottom = got[("iabn_table2_bottom_cityscapes_cus", "smoke-cpu")]
    assert bottom.measured == (
        "12 x 872^2, class-uniform sampling (3 per device on 4 device(s), 60.0M parameters): "
        "79.40% mIoU (single scale); 80.90% mIoU (scales 1,1.25,1.5,1.75,2 + flipping)")
    test = got[("iabn_table2_cityscapes_test", "smoke-cpu")]
    assert test.measured == ("on the validation set, not test: 80.90% mIoU "
                             "(bottom_cityscapes_cus, ms_flip)")
    assert "benchmark server" in test.reason
    headline = got[("iabn_segmentation_miou", "smoke-cpu")]
    assert headline.measured == ("74.42% (STD-BN, 16 x 512^2) -> 77.04% (INPLACE-ABN FIXED "
                                 "BATCH, 16 x 672^2 [+72%])")


def test_the_setting_needs_the_papers_epochs_width_and_bootstrapping(artifacts):
    frame = seg_frame(full=True)
    write(artifacts, "short-cuda", frame.assign(epochs=frame["epochs"] // 2))
    write(artifacts, "narrow-cuda", frame.assign(model_args='{"width": 0.5}'))
    write(artifacts, "wide-cuda", frame.assign(model_args='{"width": 1.0}'))
    write(artifacts, "plain-cuda", frame.assign(bootstrap_m=1.0))
    got = outcomes(artifacts)
    assert got[("iabn_table2_wideresnet38_cocostuff_iabn_fixed_batch", "plain-cuda")].reason \
        == "trained with bootstrap_m=1 (the paper: 0.25)"
    claim_id = "iabn_table2_wideresnet38_cocostuff_iabn_fixed_batch"
    assert got[(claim_id, "short-cuda")].reason == "trained 15 epochs (the paper: 30)"
    assert got[(claim_id, "narrow-cuda")].reason == ("trained a body of width 0.5 (the paper: "
                                                     "full width)")
    assert got[(claim_id, "wide-cuda")].verdict == claims.REPRODUCED


@pytest.mark.parametrize("offset, verdict", [(0.0, claims.REPRODUCED), (0.4, claims.REPRODUCED),
                                             (-0.2, claims.REPRODUCED),
                                             (-0.4, claims.REPRODUCED),
                                             (0.6, claims.NOT_REPRODUCED),
                                             (-0.6, claims.NOT_REPRODUCED)])
def test_a_full_run_is_judged_by_its_miou(artifacts, offset, verdict):
    """Every cell within 0.5 pp of the paper's, either side; the class-uniform row also above
    the paper's 79.16% without it (so not 0.4 below its 79.40%); the orderings hold whatever
    the common offset."""
    write(artifacts, "paper-cuda", seg_frame(full=True, miou_offset=offset))
    got = outcomes(artifacts)
    for (claim_id, _), outcome in got.items():
        expected = (claims.NOT_RUN if claim_id in TEST_ROWS else
                    claims.REPRODUCED if claim_id in segmentation_claims.ORDERINGS else
                    claims.NOT_REPRODUCED if claim_id == "iabn_table2_bottom_cityscapes_cus"
                    and offset <= -0.24 else verdict)
        assert outcome.verdict == expected, claim_id
    cell = got[("iabn_table2_resnext101_cityscapes_iabn_fixed_batch", "paper-cuda")]
    tolerance = segmentation_claims.MIOU_TOLERANCE_PP
    assert cell.reason == (f"criterion: mIoU within {tolerance:g} point(s) of the paper's "
                           f"77.04% and the bracket within "
                           f"{segmentation_claims.BRACKET_TOLERANCE_PP:g} pp of the paper's +72%")


def test_a_full_run_is_judged_by_its_bracket(artifacts):
    # FIXED CROP with 20 instead of 28 crops: +25% instead of +75%, the mIoU as the paper's.
    write(artifacts, "paper-cuda", seg_frame(
        full=True, crops={"resnext101_cityscapes_iabn_fixed_crop": (20, 512),
                          "resnext101_cocostuff_iabn_fixed_crop": (28, 480)}))
    got = outcomes(artifacts)
    few = got[("iabn_table2_resnext101_cityscapes_iabn_fixed_crop", "paper-cuda")]
    assert few.verdict == claims.NOT_REPRODUCED
    assert few.measured.startswith("20 x 512^2 [+25%]")
    assert few.reason.endswith("; the run trained 20 x 512^2 [+25%], the paper 28 x 512^2 [+75%]")
    # 28 instead of 24 crops: +75% instead of +50%, beyond the tolerance too.
    assert got[("iabn_table2_resnext101_cocostuff_iabn_fixed_crop", "paper-cuda")].verdict == (
        claims.NOT_REPRODUCED)
    assert got[("iabn_table2_resnext101_cityscapes_bn_fixed_crop", "paper-cuda")].verdict == (
        claims.REPRODUCED)


def test_a_cell_without_its_point_or_std_bn_row_is_not_measured(artifacts):
    write(artifacts, "paper-cuda", seg_frame(full=True, skip={
        "wideresnet38_cityscapes_bn_fixed_crop", "resnext101_cocostuff_iabn_fixed_batch",
        "bottom_vistas_cus"}))
    got = outcomes(artifacts)
    assert got[("iabn_table2_wideresnet38_cityscapes_iabn_fixed_crop", "paper-cuda")] == (
        claims.Outcome(got[("iabn_table2_wideresnet38_cityscapes_iabn_fixed_crop",
                            "paper-cuda")].measured, claims.NOT_MEASURED,
                       "the run has no STD-BN row of wideresnet38 on cityscapes, so no bracket"))
    missing = got[("iabn_table2_resnext101_cocostuff_iabn_fixed_batch", "paper-cuda")]
    assert (missing.measured, missing.verdict) == ("-", claims.NOT_MEASURED)
    assert got[("iabn_table2_bottom_vistas_cus", "paper-cuda")].verdict == claims.NOT_MEASURED
    vistas_test = got[("iabn_table2_vistas_test", "paper-cuda")]
    assert (vistas_test.measured, vistas_test.verdict) == ("-", claims.NOT_RUN)
    # The STD-BN cell itself has no bracket to compare.
    assert got[("iabn_table2_wideresnet38_cocostuff_bn_fixed_crop", "paper-cuda")].verdict == (
        claims.REPRODUCED)


def test_a_bottom_row_needs_the_papers_crops(artifacts):
    write(artifacts, "paper-cuda", seg_frame(
        full=True, bottom_crops={"bottom_vistas_cus": (8, 776)}))
    outcome = outcomes(artifacts)[("iabn_table2_bottom_vistas_cus", "paper-cuda")]
    assert (outcome.verdict, outcome.reason) == (
        claims.NOT_MEASURED, "trained 8 x 776^2 (the paper: 12 x 776^2)")


def test_the_headline_needs_fixed_batch_above_std_bn(artifacts):
    frame = seg_frame(full=True)
    swap = frame["point"].isin(["resnext101_cityscapes_bn_fixed_crop"])
    write(artifacts, "paper-cuda", frame.assign(
        miou_pct=frame["miou_pct"].where(~swap, 77.5)))
    got = outcomes(artifacts)
    assert got[("iabn_segmentation_miou", "paper-cuda")].verdict == claims.NOT_REPRODUCED


def test_without_a_run_every_table2_claim_is_not_run(artifacts):
    for (claim_id, run), outcome in outcomes(artifacts).items():
        assert (run, outcome.verdict) == ("-", claims.NOT_RUN), claim_id


def _with_miou(frame, miou):
    """``frame`` with the single-scale mIoU of the points in ``miou`` replaced."""
    frame = frame.copy()
    for point, value in miou.items():
        frame.loc[(frame["point"] == point) & (frame["eval"] == "single"), "miou_pct"] = value
    return frame


@pytest.mark.parametrize("miou, verdict", [
    (79.10, claims.NOT_REPRODUCED), (79.20, claims.REPRODUCED), (79.85, claims.REPRODUCED),
    (79.95, claims.NOT_REPRODUCED)])
def test_class_uniform_sampling_must_beat_79_16(artifacts, miou, verdict):
    """79.40 +/- 0.5, and above the 79.16% without class-uniform sampling."""
    write(artifacts, "paper-cuda", _with_miou(seg_frame(full=True),
                                              {"bottom_cityscapes_cus": miou}))
    outcome = outcomes(artifacts)[("iabn_table2_bottom_cityscapes_cus", "paper-cuda")]
    assert outcome.verdict == verdict
    assert outcome.reason == ("criterion: single mIoU within 0.5 point(s) of the paper's 79.40% "
                              "and above the paper's 79.16% without it")


@pytest.mark.parametrize("claim_id, miou", [
    ("iabn_table2_order_sync", {"resnext101_cityscapes_iabn_sync_fixed_batch": 77.03}),
    ("iabn_table2_order_sync", {"wideresnet38_cityscapes_iabn_sync_fixed_batch": 78.32}),
    ("iabn_table2_order_class_uniform", {"bottom_cityscapes_cus": 79.15}),
    ("iabn_table2_order_more_data", {"wideresnet38_cocostuff_iabn_fixed_crop": 22.43}),
    ("iabn_table2_order_resolution_over_crops", {"resnext101_cocostuff_iabn_fixed_batch": 22.62}),
    ("iabn_table2_order_fewer_larger_crops", {"bottom_cityscapes": 78.05})])
def test_each_ordering_of_table2_is_a_claim(artifacts, claim_id, miou):
    """An ordering holds at the paper's numbers and fails when one pair is reversed by 0.01."""
    write(artifacts, "paper-cuda", seg_frame(full=True))
    write(artifacts, "reversed-cuda", _with_miou(seg_frame(full=True), miou))
    got = outcomes(artifacts)
    assert got[(claim_id, "paper-cuda")].verdict == claims.REPRODUCED
    assert got[(claim_id, "reversed-cuda")].verdict == claims.NOT_REPRODUCED
    assert "(-0.01)" in got[(claim_id, "reversed-cuda")].measured


def test_orderings_need_their_points_at_the_papers_setting(artifacts):
    write(artifacts, "paper-cuda", seg_frame(full=True, skip={"bottom_cityscapes"}))
    write(artifacts, "smoke-cpu", seg_frame(full=False))
    got = outcomes(artifacts)
    assert got[("iabn_table2_order_class_uniform", "paper-cuda")] == claims.Outcome(
        "-", claims.NOT_MEASURED, "the run has no bottom_cityscapes point")
    smoke = got[("iabn_table2_order_sync", "smoke-cpu")]
    assert smoke.verdict == claims.NOT_MEASURED
    assert smoke.measured.startswith("resnext101_cityscapes_iabn_sync_fixed_batch 77.58 vs "
                                     "resnext101_cityscapes_iabn_fixed_batch 77.04 (+0.54)")


@pytest.mark.parametrize("crop_size, verdict", [
    (656, claims.NOT_REPRODUCED), (664, claims.REPRODUCED), (680, claims.REPRODUCED),
    (688, claims.NOT_REPRODUCED)])
def test_a_cells_bracket_is_within_5_points_either_side(artifacts, crop_size, verdict):
    """FIXED BATCH 16 x 672^2 is the paper's +72%: 664^2 (+68%) and 680^2 (+76%) are within
    5 pp of it, 656^2 (+64%) and 688^2 (+81%) are not."""
    point = "resnext101_cityscapes_iabn_fixed_batch"
    write(artifacts, "paper-cuda", seg_frame(full=True, crops={point: (16, crop_size)}))
    outcome = outcomes(artifacts)[(f"iabn_table2_{point}", "paper-cuda")]
    assert outcome.verdict == verdict
    assert "the bracket within 5 pp of the paper's +72%" in outcome.reason
