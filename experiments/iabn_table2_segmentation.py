"""InPlace-ABN paper, Table 2: semantic segmentation with DeepLabV3 on ResNeXt-101 and
WideResNet-38 bodies, mIoU on Cityscapes, COCO-Stuff and Mapillary Vistas validation data, under
STD-BN and InPlace-ABN batch compilations.

One point trains one network::

    python -m experiments.iabn_table2_segmentation --dataset cityscapes --data ROOT
        --body resnext101 --norm iabn --pretrained IMAGENET_WEIGHTS.pt
        --capacity artifacts/iabn_table2_capacity/<run>/cityscapes_resnext101_iabn_fixed_crop.json
        --epochs 360 --out ... --epochs-csv ... --weights ... --work-dir ...

under ``torchrun --nproc-per-node N`` for N devices (every option:
:mod:`experiments.train.seg_point`). The pipeline's points (:mod:`experiments.train.seg_plan`):

- Table 2 top, for each body and data set (Cityscapes, COCO-Stuff), the four batch
  compilations: STD-BN + leaky ReLU at the most crops of the crop size that fit (FIXED CROP);
  InPlace-ABN at its most crops (FIXED CROP); InPlace-ABN at the STD-BN batch with the largest
  crops that fit (FIXED BATCH); the same with InPlace-ABN sync. Crops and crop size come from the
  capacity experiment's points of the same data set, body and budget (``iabn_table2_capacity``:
  each data set its own classes and FIXED CROP crop), single scale evaluation without flipping;
- Table 2 bottom: WideResNet-38 + InPlace-ABN sync with the profile's tuned crops, on Cityscapes
  with and without CLASS-UNIFORM SAMPLING (single scale, and the test rows' 5 scales +
  flipping on the validation set), and on Mapillary Vistas with CLASS-UNIFORM SAMPLING; the
  test-set rows' own models (Vistas on training + validation; Cityscapes started from it and
  trained on fine + coarse labels), whose test-set predictions
  :mod:`experiments.train.seg_predict` writes in the benchmarks' formats (the scores are the
  servers').

:func:`table2` arranges an aggregated CSV as the paper's table: each row's crops x crop size,
the pixels per minibatch relative to the body's STD-BN row (the bracket) and the mIoU.
"""
import sys

from .train import seg_point

EXPERIMENT = "iabn_table2_segmentation"
#: Table 2 top's rows in the paper's order, with the paper's labels.
ROWS = {
    "bn_fixed_crop": "STD-BN + LEAKY RELU",
    "iabn_fixed_crop": "INPLACE-ABN, FIXED CROP",
    "iabn_fixed_batch": "INPLACE-ABN, FIXED BATCH",
    "iabn_sync_fixed_batch": "INPLACE-ABN sync, FIXED BATCH",
}
BASELINE = "bn_fixed_crop"


def table2(frame, evaluation="single"):
    """Table 2 (top) from an aggregated CSV of this experiment: one row per (body, dataset,
    batch compilation) with ``crops`` (the total over devices), ``crop_size``, ``pixels``,
    ``increase_pct`` (pixels per minibatch over the body's and data set's STD-BN row, the
    paper's bracket; ``None`` where there is no STD-BN row), ``miou_pct`` of ``evaluation``,
    and the point. Pure pandas; raises ``KeyError`` naming missing columns."""
    needed = ("point", "eval", "body", "dataset", "norm", "crops", "crop_size", "pixels",
              "miou_pct")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise KeyError(f"{EXPERIMENT} CSV lacks columns {missing}")
    rows = frame[frame["eval"] == evaluation].copy()
    rows["config"] = [_config(p, body, ds) for p, body, ds in
                      zip(rows["point"], rows["body"], rows["dataset"])]
    rows = rows[rows["config"].isin(list(ROWS))]
    base = rows[rows["config"] == BASELINE].set_index(["body", "dataset"])["pixels"]
    rows["increase_pct"] = [
        100 * (pixels / base[(body, ds)] - 1) if (body, ds) in base.index else None
        for pixels, body, ds in zip(rows["pixels"], rows["body"], rows["dataset"])]
    rows["batchnorm"] = rows["config"].map(ROWS)
    rows["order"] = rows["config"].map(list(ROWS).index)
    rows = rows.sort_values(["order", "body", "dataset"])
    return rows[["batchnorm", "config", "body", "dataset", "crops", "crop_size", "pixels",
                 "increase_pct", "miou_pct", "point"]].reset_index(drop=True)


def _config(point, body, dataset):
    prefix = f"{body}_{dataset}_"
    return point[len(prefix):] if point.startswith(prefix) else None


def main(argv=None):
    seg_point.main(EXPERIMENT, "Train DeepLabV3 (InPlace-ABN Table 2) on a segmentation data "
                   "set and record its validation mIoU.", argv)


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["BASELINE", "EXPERIMENT", "ROWS", "main", "table2"]
