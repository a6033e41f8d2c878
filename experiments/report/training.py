"""Tables of the training experiments, shared by their notebooks and the claims report:
DenseNet Fig. 2 left (:func:`preact_errors`), Fig. 6 (:func:`imagenet_densenets`), InPlace-ABN
Table 1 left (:func:`table1`) and the STD-BN / InPlace-ABN parity check (:func:`parity`).

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


__all__ = ["NETWORKS", "BATCHNORMS", "EVALUATIONS", "paper_table", "model_arguments",
           "scale", "preact_errors", "imagenet_densenets", "row_key", "table1", "parity"]
