"""Evaluators of InPlace-ABN Table 2's claims (``iabn_table2_segmentation``), registered with
:func:`experiments.report.verdicts.evaluates` when :mod:`experiments.report.claims` imports
this module.

Every cell of Table 2 is a claim: a top cell (``iabn_table2_<body>_<dataset>_<config>``) is its
batch compilation (crops x crop size over all GPUs and, beside STD-BN, the bracket: pixels per
minibatch over the STD-BN row of the same body and data set) and its mIoU; a bottom row
(``iabn_table2_bottom_<point>``) a tuned WideResNet-38 + INPLACE-ABN sync network's mIoU; the
two test-set rows (``iabn_table2_cityscapes_test``, ``iabn_table2_vistas_test``) are scored by
the benchmark servers and are "not run"; the orderings the paper concludes from (more data,
resolution over crops, sync, class-uniform sampling, fewer but larger crops:
``iabn_table2_order_*``, :data:`ORDERINGS`) are claims of their own. ``iabn_segmentation_miou`` is the headline (ResNeXt-101
on Cityscapes, STD-BN -> INPLACE-ABN FIXED BATCH).

As for the other training claims (:mod:`.training_claims`), a run is at the claimed setting
only if its points trained on the full training set (:data:`FULL_TRAIN_IMAGES`) for the
paper's epochs (:data:`EPOCHS`) with full-width bodies and the paper's bootstrapping
(:data:`BOOTSTRAPPING`), and a bottom row only at the paper's
crops and crop size; otherwise the verdict is "not measured at the claimed setting" and what
the run measured is still shown.
"""
import json

import pandas as pd

from . import training
from .verdicts import NOT_MEASURED, NOT_RUN, Outcome, evaluates, verdict

#: Training images of the released data sets (the paper: Cityscapes 2975 fine, COCO-Stuff
#: "40k", Mapillary Vistas 18k).
FULL_TRAIN_IMAGES = {"cityscapes": 2975, "cocostuff": 40_000, "vistas": 18_000}
#: A run is on the full set if it has at least this share of the paper's count (its 40k and
#: 18k are rounded; a generated smoke set has a few dozen images).
FULL_SHARE = 0.95
#: The paper's epochs per data set (Sec. 4.2: 360 on Cityscapes, 30 on COCO-Stuff, 90 on
#: Vistas).
EPOCHS = {"cityscapes": 360, "cocostuff": 30, "vistas": 90}
#: The online bootstrapping of the paper's loss ("setting p = 1.0 and m = 25%").
BOOTSTRAPPING = {"bootstrap_p": 1.0, "bootstrap_m": 0.25}
#: mIoU points a measured mIoU may differ from the paper's, either side: the classification
#: trainings' tolerance (:data:`.training_claims.TOLERANCE_PP`, their run-to-run spread). The
#: paper's conclusions rest on finer differences (class-uniform sampling +0.24, sync +0.54):
#: those are judged as orderings (:data:`ORDERINGS`), not by a cell's tolerance.
MIOU_TOLERANCE_PP = 0.5
#: Percentage points a measured bracket may differ from the paper's, either side (here and in
#: the capacity experiment's brackets, :data:`.claims.CAPACITY_CLAIMS`): half the smallest gap
#: between two of Table 2's brackets of one mode (FIXED CROP +50% vs +40%), so a bracket within
#: it is nearer its own cell's number than any other cell's.
BRACKET_TOLERANCE_PP = 5.0
#: Table 2 top's bodies, data sets and batch compilations, in the paper's order.
TOP_BODIES = ("resnext101", "wideresnet38")
TOP_DATASETS = ("cityscapes", "cocostuff")
TOP_CONFIGS = ("bn_fixed_crop", "iabn_fixed_crop", "iabn_fixed_batch", "iabn_sync_fixed_batch")
#: Table 2 bottom's validation rows: point -> the evaluation the paper reports.
BOTTOM_POINTS = {"bottom_cityscapes": "single", "bottom_cityscapes_cus": "single",
                 "bottom_vistas_cus": "single"}
#: The test-set rows: claim id -> (benchmark, the run's point and evaluation shown beside,
#: what else the paper's model had).
TEST_ROWS = {
    "iabn_table2_cityscapes_test": (
        "Cityscapes", "bottom_cityscapes_cus", "ms_flip",
        "the paper's model, Mapillary Vistas pre-trained and trained on fine + coarse labels, "
        "is the paper profile's cityscapes_test_model"),
    "iabn_table2_vistas_test": (
        "Mapillary Vistas", "bottom_vistas_cus", "single",
        "the paper's model, trained on training + validation, is the paper profile's "
        "vistas_test_model"),
}


def _table2(frame):
    from ..iabn_table2_segmentation import table2  # imports torch (seg_point)

    return table2(frame)


def _at_setting(row):
    """Whether one point's row trained at the paper's setting: the full training set, the
    paper's epochs for its data set, a full-width body; ``(ok, why_not)``."""
    dataset = row["dataset"]
    full = FULL_TRAIN_IMAGES[dataset]
    if row["train_images"] < FULL_SHARE * full:
        return False, (f"trained on {int(row['train_images']):,} {dataset} training images "
                       f"(the paper: {full:,})")
    if row["epochs"] != EPOCHS[dataset]:
        return False, f"trained {int(row['epochs'])} epochs (the paper: {EPOCHS[dataset]})"
    width = float(json.loads(row["model_args"]).get("width", 1.0))
    if width != 1.0:
        return False, f"trained a body of width {width:g} (the paper: full width)"
    for key, paper in BOOTSTRAPPING.items():
        if key in row and float(row[key]) != paper:
            return False, f"trained with {key}={row[key]:g} (the paper: {paper:g})"
    return True, ""


def _point_row(frame, point, evaluation="single"):
    """The CSV row of ``point``'s ``evaluation``, or ``None``."""
    rows = frame[(frame["point"] == point) & (frame["eval"] == evaluation)]
    return None if rows.empty else rows.iloc[0]


def _per_device(row):
    return (f"{int(row['crops_per_device'])} per device on {int(row['devices'])} "
            f"device(s), {row['params'] / 1e6:.1f}M parameters")


def _top_evaluator(point):
    def evaluate(claim, frame):
        table = _table2(frame)
        cells = table[table["point"] == point]
        row = _point_row(frame, point)
        if cells.empty or row is None:
            return Outcome("-", NOT_MEASURED, f"the run has no {point} point")
        cell = cells.iloc[0]
        value = claim["value"]
        batch = training.compilation(cell["crops"], cell["crop_size"], cell["increase_pct"])
        measured = f"{batch} ({_per_device(row)}), {cell['miou_pct']:.2f}% mIoU"
        ok, why = _at_setting(row)
        if not ok:
            return Outcome(measured, NOT_MEASURED, why)
        paper = training.compilation(value["crops"], value["crop_size"],
                                     value.get("increase_pct"))
        same = (cell["crops"], cell["crop_size"]) == (value["crops"], value["crop_size"])
        differs = "" if same else f"; the run trained {batch}, the paper {paper}"
        criterion = (f"criterion: mIoU within {MIOU_TOLERANCE_PP:g} point(s) of the paper's "
                     f"{value['miou_pct']:.2f}%")
        good = abs(cell["miou_pct"] - value["miou_pct"]) <= MIOU_TOLERANCE_PP
        if "increase_pct" in value:
            if pd.isna(cell["increase_pct"]):
                return Outcome(measured, NOT_MEASURED, f"the run has no STD-BN row of "
                               f"{cell['body']} on {cell['dataset']}, so no bracket")
            criterion += (f" and the bracket within {BRACKET_TOLERANCE_PP:g} pp of the paper's "
                          f"+{value['increase_pct']}%")
            good = good and (abs(cell["increase_pct"] - value["increase_pct"])
                             <= BRACKET_TOLERANCE_PP)
        return Outcome(measured, verdict(good), criterion + differs)
    return evaluate


for _body in TOP_BODIES:
    for _dataset in TOP_DATASETS:
        for _config in TOP_CONFIGS:
            _point = f"{_body}_{_dataset}_{_config}"
            evaluates(f"iabn_table2_{_point}")(_top_evaluator(_point))


def _scales(scales):
    """``"single scale"`` or ``"scales 1,1.25,1.5"`` (a CSV column of ``1`` reads as numbers)."""
    text = str(scales)
    return "single scale" if text in ("1", "1.0") else f"scales {text}"


def _bottom_measured(frame, point):
    """``"2 x 176^2, class-uniform sampling: 1.23% mIoU (single scale); 1.10% (1,1.25,...
    + flipping)"``, or ``None`` without the point."""
    rows = frame[frame["point"] == point]
    if rows.empty:
        return None
    first = rows.iloc[0]
    evaluations = "; ".join(
        f"{r.miou_pct:.2f}% mIoU ({_scales(r.scales)}{' + flipping' if r.flip else ''})"
        for r in rows.itertuples())
    uniform = ", class-uniform sampling" if first["class_uniform"] else ""
    return (f"{training.compilation(first['crops'], first['crop_size'])}{uniform} "
            f"({_per_device(first)}): {evaluations}")


def _bottom_evaluator(point, evaluation):
    def evaluate(claim, frame):
        row = _point_row(frame, point, evaluation)
        if row is None:
            return Outcome("-", NOT_MEASURED, f"the run has no {point} point with the "
                           f"{evaluation} evaluation")
        measured = _bottom_measured(frame, point)
        value = claim["value"]
        ok, why = _at_setting(row)
        if ok and (row["crops"], row["crop_size"]) != (value["crops"], value["crop_size"]):
            ours = training.compilation(row["crops"], row["crop_size"])
            paper = training.compilation(value["crops"], value["crop_size"])
            ok, why = False, f"trained {ours} (the paper: {paper})"
        if not ok:
            return Outcome(measured, NOT_MEASURED, why)
        good = abs(row["miou_pct"] - value["miou_pct"]) <= MIOU_TOLERANCE_PP
        criterion = (f"criterion: {evaluation} mIoU within {MIOU_TOLERANCE_PP:g} point(s) of "
                     f"the paper's {value['miou_pct']:.2f}%")
        if "above_miou_pct" in claim:
            good = good and row["miou_pct"] > claim["above_miou_pct"]
            criterion += f" and above the paper's {claim['above_miou_pct']:.2f}% without it"
        return Outcome(measured, verdict(good), criterion)
    return evaluate


for _point, _evaluation in BOTTOM_POINTS.items():
    evaluates(f"iabn_table2_{_point}")(_bottom_evaluator(_point, _evaluation))


#: The orderings of Table 2 that the paper draws conclusions from, each a claim of its own
#: whose ``pairs`` are ``[higher point, lower point]`` in mIoU as the paper's table has them.
ORDERINGS = ("iabn_table2_order_more_data", "iabn_table2_order_resolution_over_crops",
             "iabn_table2_order_sync", "iabn_table2_order_class_uniform",
             "iabn_table2_order_fewer_larger_crops")


def _ordering(claim, frame):
    """An ordering of Table 2: in every pair the first point's single-scale mIoU above the
    second's, every point trained at the paper's setting."""
    rows = {point: _point_row(frame, point) for pair in claim["pairs"] for point in pair}
    missing = sorted(point for point, row in rows.items() if row is None)
    if missing:
        return Outcome("-", NOT_MEASURED, f"the run has no {', '.join(missing)} point")
    gaps = [(high, low, rows[high]["miou_pct"] - rows[low]["miou_pct"])
            for high, low in claim["pairs"]]
    measured = "; ".join(f"{high} {rows[high]['miou_pct']:.2f} vs {low} "
                         f"{rows[low]['miou_pct']:.2f} ({gap:+.2f})" for high, low, gap in gaps)
    for row in rows.values():
        ok, why = _at_setting(row)
        if not ok:
            return Outcome(measured, NOT_MEASURED, why)
    return Outcome(measured, verdict(all(gap > 0 for _, _, gap in gaps)),
                   f"criterion: in each of the {len(gaps)} pair(s), the first point's "
                   "single-scale mIoU above the second's, as in the paper's table (an order "
                   "is a bound: how far above is the cells' own criterion)")


for _claim_id in ORDERINGS:
    evaluates(_claim_id)(_ordering)


def _test_evaluator(claim_id):
    benchmark, point, evaluation, more = TEST_ROWS[claim_id]

    def evaluate(claim, frame):
        row = _point_row(frame, point, evaluation)
        measured = ("-" if row is None else
                    f"on the validation set, not test: {row['miou_pct']:.2f}% mIoU ({point}, "
                    f"{evaluation})")
        return Outcome(measured, NOT_RUN, (
            f"a test-set row: the {benchmark} test labels are withheld and only the "
            f"benchmark server scores test predictions; `snakemake iabn_table2_submissions "
            f"--config profile=paper` writes them for upload; {more}"))
    return evaluate


for _claim_id in TEST_ROWS:
    evaluates(_claim_id)(_test_evaluator(_claim_id))


#: The headline's points: ResNeXt-101 on Cityscapes, STD-BN and INPLACE-ABN FIXED BATCH.
MIOU_POINTS = ("resnext101_cityscapes_bn_fixed_crop", "resnext101_cityscapes_iabn_fixed_batch")


@evaluates("iabn_segmentation_miou")
def _segmentation_miou(claim, frame):
    base, batch = MIOU_POINTS
    table = _table2(frame).set_index("point")
    if base not in table.index or batch not in table.index:
        return Outcome("-", NOT_MEASURED, f"the run lacks {base} or {batch}")
    low, high = table.loc[base], table.loc[batch]
    measured = (f"{low['miou_pct']:.2f}% (STD-BN, "
                f"{training.compilation(low['crops'], low['crop_size'])}) -> "
                f"{high['miou_pct']:.2f}% (INPLACE-ABN FIXED BATCH, "
                f"{training.compilation(high['crops'], high['crop_size'], high['increase_pct'])})")
    for point in (base, batch):
        ok, why = _at_setting(_point_row(frame, point))
        if not ok:
            return Outcome(measured, NOT_MEASURED, why)
    value = claim["value"]
    good = (high["miou_pct"] > low["miou_pct"]
            and abs(low["miou_pct"] - value["std_bn"]) <= MIOU_TOLERANCE_PP
            and abs(high["miou_pct"] - value["inplace_abn_fixed_batch"]) <= MIOU_TOLERANCE_PP)
    return Outcome(measured, verdict(good), f"criterion: INPLACE-ABN FIXED BATCH above STD-BN, "
                   f"each within {MIOU_TOLERANCE_PP:g} point(s) of the paper's")


__all__ = ["BOOTSTRAPPING", "FULL_TRAIN_IMAGES", "MIOU_POINTS", "FULL_SHARE", "EPOCHS",
           "MIOU_TOLERANCE_PP", "BRACKET_TOLERANCE_PP", "ORDERINGS", "TOP_BODIES",
           "TOP_DATASETS", "TOP_CONFIGS", "BOTTOM_POINTS", "TEST_ROWS"]
