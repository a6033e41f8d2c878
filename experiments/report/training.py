"""Tables of the training experiments, shared by their notebooks and the claims report:
DenseNet Fig. 2 left (:func:`preact_errors`), Fig. 6 (:func:`imagenet_densenets`), InPlace-ABN
Table 1 left (:func:`table1`), the STD-BN / InPlace-ABN parity check (:func:`parity`) and
InPlace-ABN Table 2 (:func:`table2`, :func:`table2_layout`, :func:`table2_bottom`).

Each takes a run's aggregated CSV (one row per point and evaluation) and returns a
:class:`pandas.DataFrame`. Errors are in percent; Table 1 reports accuracies (100 - error), as
the paper does. The papers' own numbers come from ``artifacts/paper/`` (:func:`paper_table`).
"""
import json

import pandas as pd

from ..records import paths

#: Table 1's network and BN labels, as the paper writes them.
NETWORKS = {"resnext101": "ResNeXt-101", "resnext152": "ResNeXt-152",
            "wideresnet38": "WideResNet-38", "densenet264": "DenseNet-264",
            "densenet232": "DenseNet-232", "densenet_bc": "DenseNet-BC"}
BATCHNORMS = {"bn": "STD-BN", "iabn": "INPLACE-ABN", "iabn_sync": "INPLACE-ABN sync"}
#: Table 1's evaluations, in its column order.
EVALUATIONS = ("center224", "crops10_224", "center320")
#: Table 2's data sets, as the paper writes them.
SEG_DATASETS = {"cityscapes": "Cityscapes", "cocostuff": "COCO-Stuff",
                "vistas": "Mapillary Vistas"}


def _missing(frame, columns):
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise ValueError(f"frame: missing columns {absent}; is it a training experiment's "
                         "aggregated CSV?")


def paper_table(name):
    """``artifacts/paper/<name>.csv``, the paper's numbers for an experiment."""
    return pd.read_csv(paths.artifacts_dir() / "paper" / f"{name}.csv")


def model_arguments(frame):
    """The ``model_args`` column (JSON text) as dicts."""
    return [json.loads(text) for text in frame["model_args"]]


def scale(frame):
    """What a run trained, for the figures' titles: ``"90 epochs on 1,281,167 training
    images"``, or the range of epochs where the points differ."""
    _missing(frame, ["epochs", "train_images"])
    epochs = sorted({int(e) for e in frame["epochs"].dropna()})
    images = sorted({int(n) for n in frame["train_images"].dropna()})
    span = str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
    return f"{span} epochs on {', '.join(f'{n:,}' for n in images)} training images"


def segmentation_scale(frame):
    """What a segmentation run trained, per data set, for the figures' titles:
    ``"Cityscapes: 8 epochs on 12 training images; COCO-Stuff: ...; body width 0.0625"``
    (``full-width bodies`` when no point narrowed its body)."""
    _missing(frame, ["dataset", "epochs", "train_images", "model_args"])
    parts = [f"{SEG_DATASETS.get(d, d)}: {scale(rows)}"
             for d, rows in frame.groupby("dataset", sort=False)]
    widths = sorted({float(a.get("width", 1.0)) for a in model_arguments(frame)})
    parts.append("full-width bodies" if widths == [1.0] else
                 f"body width {', '.join(f'{w:g}' for w in widths)}")
    return "; ".join(parts)


def preact_errors(frame):
    """DenseNet Fig. 2 left: one row per data set and activation order, with the measured test
    error and the paper's."""
    _missing(frame, ["dataset", "model_args", "top1_error_pct", "epochs"])
    preact = [args.get("preact", True) for args in model_arguments(frame)]
    table = frame.assign(activation_order=["pre-activation" if p else "post-activation"
                                           for p in preact])
    table = table[["dataset", "activation_order", "top1_error_pct", "epochs", "model_args"]]
    paper = paper_table("densenet_fig2_preact").assign(
        dataset=lambda t: t["dataset"].str.lower().str.replace("-", ""))
    paper = paper.rename(columns={"error_pct": "paper_error_pct"})
    merged = table.merge(paper[["dataset", "activation_order", "paper_error_pct"]],
                         on=["dataset", "activation_order"], how="left")
    return merged.rename(columns={"top1_error_pct": "error_pct"}).sort_values(
        ["dataset", "activation_order"], ascending=[True, False]).reset_index(drop=True)


def imagenet_densenets(frame):
    """DenseNet Fig. 6: one row per network and schedule, with parameters (millions) and the
    top-1 error of the single centre crop."""
    _missing(frame, ["point", "model", "model_args", "schedule", "params", "top1_error_pct"])
    args = model_arguments(frame)
    table = frame.assign(growth_rate=[a.get("growth_rate") for a in args],
                         params_m=frame["params"] / 1e6,
                         network=[NETWORKS.get(m, m) for m in frame["model"]])
    return table[["point", "network", "growth_rate", "schedule", "params_m", "top1_error_pct",
                  "top5_error_pct", "epochs"]].sort_values("params_m").reset_index(drop=True)


def row_key(point):
    """``"resnext101_iabn_sync_256"`` -> ``("resnext101", "iabn_sync", 256)``."""
    name, batch = point.rsplit("_", 1)
    model, norm = name.split("_", 1)
    return model, norm, int(batch)


def table1(frame):
    """InPlace-ABN Table 1 left in the paper's layout: one row per trained network (its point,
    network, batch norm, the paper's batch and the batch trained), top-1 / top-5 accuracy per
    evaluation; the paper's numbers beside, as ``paper_<column>``."""
    rows = frame[frame["point"].map(lambda p: not p.startswith("parity"))]
    _missing(rows, ["point", "eval", "top1_error_pct", "top5_error_pct", "batch", "params"])
    records = []
    for point, group in rows.groupby("point", sort=False):
        model, norm, paper_batch = row_key(point)
        record = {"point": point, "network": NETWORKS.get(model, model),
                  "batchnorm": BATCHNORMS[norm],
                  "paper_batch": paper_batch, "batch": int(group["batch"].iloc[0]),
                  "ranks": int(group["world_size"].iloc[0]),
                  "params_m": group["params"].iloc[0] / 1e6}
        for ev in group.itertuples():
            record[f"{ev.eval}_top1"] = 100.0 - ev.top1_error_pct
            record[f"{ev.eval}_top5"] = 100.0 - ev.top5_error_pct
        records.append(record)
    table = pd.DataFrame(records)
    paper = paper_table("iabn_table1_imagenet").rename(
        columns={"batch_size": "paper_batch",
                 **{f"{e}_{k}": f"paper_{e}_{k}" for e in EVALUATIONS for k in ("top1", "top5")}})
    return table.merge(paper.drop(columns=["source"]), on=["network", "batchnorm", "paper_batch"],
                       how="left")


def parity(frame):
    """The parity points: per model, the steps, the first and final STD-BN loss, and for
    InPlace-ABN and the rounding control the steps their loss stayed within rounding of
    STD-BN's and the largest relative difference."""
    rows = frame[frame["point"].map(lambda p: p.startswith("parity"))]
    columns = ["model", "step", "loss_std_bn"] + [
        f"{key}_{network}" for network in ("inplace_abn", "control")
        for key in ("steps_within_rounding", "max_loss_rel_diff")]
    _missing(rows, columns)
    ordered = rows.sort_values("step")
    first = ordered.groupby("model").head(1).set_index("model")["loss_std_bn"]
    last = ordered.groupby("model").tail(1).set_index("model")
    table = last[columns[3:]].assign(steps=last["step"] + 1, first_loss=first,
                                     final_loss=last["loss_std_bn"])
    return table.reset_index()[["model", "steps", "first_loss", "final_loss", *columns[3:]]]


def compilation(crops, crop_size, increase_pct=None, times=" x ", square="^2"):
    """A Table 2 batch compilation as the paper prints it: ``"28 x 512^2 [+75%]"`` (no bracket
    where ``increase_pct`` is ``None`` or NaN, or rounds to 0, as on the paper's STD-BN row;
    ``""`` without crops). The notebook passes ``times=" × ", square="²"``."""
    if crops is None or pd.isna(crops):
        return ""
    text = f"{int(crops)}{times}{int(crop_size)}{square}"
    if increase_pct is None or pd.isna(increase_pct) or round(increase_pct) == 0:
        return text
    return f"{text} [{increase_pct:+.0f}%]"


def table2(frame, evaluation="single"):
    """InPlace-ABN Table 2 (top), one row per (batch compilation, body, data set) the run
    trained: :func:`experiments.iabn_table2_segmentation.table2` (``crops`` over all devices,
    ``crop_size``, ``increase_pct`` the bracket, ``miou_pct``) with the paper's labels
    (``network``, ``data``) and the paper's numbers beside (``paper_crops``,
    ``paper_crop_size``, ``paper_increase_pct``, ``paper_miou_pct``)."""
    from ..iabn_table2_segmentation import table2 as measured  # imports torch (seg_point)

    table = measured(frame, evaluation).assign(
        network=lambda t: t["body"].map(lambda b: NETWORKS.get(b, b)),
        data=lambda t: t["dataset"].map(lambda d: SEG_DATASETS.get(d, d)))
    paper = paper_table("iabn_table2_segmentation").rename(columns={
        "body": "network", "dataset": "data", "crops": "paper_crops",
        "crop_size": "paper_crop_size", "data_increase_pct": "paper_increase_pct",
        "miou_pct": "paper_miou_pct"}).drop(columns=["source"])
    return table.merge(paper, on=["network", "batchnorm", "data"], how="left")


#: The network of Table 2 (bottom)'s rows.
BOTTOM_NETWORK = "WideResNet-38"


def _cell_columns(record, key, ours, theirs):
    """Set ``key``'s four columns of a Table 2 layout row: the run's batch compilation and
    mIoU, the paper's (``(crops, crop_size, increase_pct, miou_pct)`` tuples or ``None``)."""
    for prefix, cell in ((key, ours), (f"{key} paper", theirs)):
        record[prefix] = "" if cell is None else compilation(*cell[:3], " × ", "²")
        record[f"{prefix} mIoU"] = float("nan") if cell is None else cell[3]


def table2_layout(table, bottom=None):
    """:func:`table2` in the paper's layout: one row per batch compilation (the paper's order
    and labels, column ``BATCHNORM``), and per body and data set of the paper's table the run's
    batch compilation (``"16 × 512² [+75%]"``) and mIoU, then the paper's (``... paper``
    columns); empty where the run or the paper lacks the cell. Given ``bottom``
    (:func:`table2_bottom`), its rows follow, their numbers in the WideResNet-38 columns of
    their data set (Mapillary Vistas' added), test-set rows marked as such."""
    from ..iabn_table2_segmentation import ROWS  # imports torch (seg_point)

    paper = paper_table("iabn_table2_segmentation")
    cells = table.set_index(["batchnorm", "network", "data"])
    theirs = paper.set_index(["batchnorm", "body", "dataset"])
    groups = list(dict.fromkeys(zip(paper["body"], paper["dataset"])))
    if bottom is not None:
        groups += [(BOTTOM_NETWORK, d) for d in dict.fromkeys(bottom["data"])
                   if (BOTTOM_NETWORK, d) not in groups]
    records = []
    for label in ROWS.values():
        record = {"BATCHNORM": label}
        for network, data in groups:
            key = (label, network, data)
            ours = (tuple(cells.loc[key, ["crops", "crop_size", "increase_pct", "miou_pct"]])
                    if key in cells.index else None)
            paper_cell = (tuple(theirs.loc[key, ["crops", "crop_size", "data_increase_pct",
                                                 "miou_pct"]])
                          if key in theirs.index else None)
            _cell_columns(record, f"{network} {data}", ours, paper_cell)
        records.append(record)
    for row in ([] if bottom is None else bottom.itertuples()):
        test = " (test set: benchmark server, not run)" if row.split == "test" else ""
        record = {"BATCHNORM": f"{row.row}{test}"}
        for network, data in groups:
            here = (network, data) == (BOTTOM_NETWORK, row.data)
            ours = ((row.crops, row.crop_size, None, row.miou_pct)
                    if here and not pd.isna(row.crops) else None)
            paper_cell = ((row.paper_crops, row.paper_crop_size, None, row.paper_miou_pct)
                          if here and not pd.isna(row.paper_crops) else None)
            _cell_columns(record, f"{network} {data}", ours, paper_cell)
        records.append(record)
    return pd.DataFrame(records)


def table2_bottom(frame):
    """InPlace-ABN Table 2 (bottom): each of the paper's rows with the run's numbers beside,
    and each evaluation the run made of its bottom points (``bottom_*``; e.g. the test rows'
    5 scales + flipping, on the validation set) below its point's row. Columns: ``row`` (the
    paper's label, or the run's evaluation), ``data``, ``point``, ``eval``, ``split``, ``scales``,
    ``flip``, ``class_uniform``, ``crops`` (over all devices), ``crop_size``, ``miou_pct`` and
    ``paper_crops``, ``paper_crop_size``, ``paper_miou_pct``; the test-set rows have no point
    (the benchmark servers score them)."""
    _missing(frame, ["point", "eval", "dataset", "scales", "flip", "class_uniform", "crops",
                     "crop_size", "miou_pct"])
    paper = paper_table("iabn_table2_segmentation_bottom")
    ours = frame[frame["point"].str.startswith("bottom_")]
    records = []
    for rank, theirs in enumerate(paper.itertuples()):
        records.append({"order": (rank, 0), "row": theirs.row, "data": theirs.dataset,
                        "point": theirs.point,
                        "eval": theirs.eval, "split": theirs.split, "scales": theirs.scales,
                        "flip": theirs.flip, "class_uniform": theirs.class_uniform,
                        "paper_crops": theirs.crops, "paper_crop_size": theirs.crop_size,
                        "paper_miou_pct": theirs.miou_pct})
    rank_of = {r["point"]: r["order"][0] for r in records if isinstance(r["point"], str)}
    for row in ours.itertuples():
        measured = {"crops": row.crops, "crop_size": row.crop_size, "miou_pct": row.miou_pct}
        match = next((r for r in records if (r["point"], r["eval"]) == (row.point, row.eval)),
                     None)
        if match is not None:
            match.update(measured)
            continue
        flip = " + horizontal flipping" if row.flip else ""
        uniform = " + CLASS-UNIFORM SAMPLING" if row.class_uniform else ""
        records.append({
            "order": (rank_of.get(row.point, len(paper)), 1),
            "row": (f"{SEG_DATASETS.get(row.dataset, row.dataset)} val (scales "
                    f"{row.scales}{flip}){uniform}"),
            "data": SEG_DATASETS.get(row.dataset, row.dataset), "point": row.point,
            "eval": row.eval, "split": "val", "scales": str(row.scales),
            "flip": bool(row.flip), "class_uniform": bool(row.class_uniform), **measured})
    table = pd.DataFrame(records).sort_values("order", kind="stable")
    columns = ["row", "data", "point", "eval", "split", "scales", "flip", "class_uniform",
               "crops", "crop_size", "miou_pct", "paper_crops", "paper_crop_size",
               "paper_miou_pct"]
    return table.reindex(columns=columns).reset_index(drop=True)


__all__ = ["NETWORKS", "BATCHNORMS", "EVALUATIONS", "SEG_DATASETS", "paper_table",
           "model_arguments", "scale", "segmentation_scale", "preact_errors",
           "imagenet_densenets", "row_key", "table1", "parity", "BOTTOM_NETWORK", "compilation",
           "table2", "table2_layout", "table2_bottom"]
