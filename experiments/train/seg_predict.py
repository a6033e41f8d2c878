"""Predict a split with a trained segmentation point and write a submission-ready folder (the
test-set rows of InPlace-ABN Table 2 are scored by the benchmark servers, on files in their
formats)::

    python -m experiments.train.seg_predict --point artifacts/iabn_table2_segmentation/<run>/P.json
        --weights artifacts/iabn_table2_segmentation/<run>/P.weights.pt --data ROOT
        --split test --eval ms_flip --predictions FOLDER --out REPORT.json

The network is the point's (``--point``, its artifact: body, normalisation, architecture
arguments, output stride, classes; ``--weights``, the state dict it wrote), and so is the test
protocol: ``--eval NAME`` takes the scales and flipping of the point's evaluation of that name
(e.g. ``single``: one scale, no flip; ``ms_flip``: scales 1 to 2 with flipping) and its
sliding window, and runs the same code as the point's evaluation
(:func:`~.segmentation.evaluate_segmentation`). ``--predictions`` receives one file per image
in the data set's benchmark format (:mod:`.segmentation.submission`: Cityscapes labelIds PNGs
named after the images; Vistas label-index PNGs ``<key>.png``; COCO-Stuff the challenge's RLE
result JSON with the label maps it encodes); it is written under ``FOLDER.partial`` and renamed
when complete, so an existing ``FOLDER`` is always whole.

``--out`` is the run's JSON record (:mod:`experiments.records.point`): one row with the mIoU,
pixel accuracy and per-class IoU of the written predictions where the split has labels (the
validation splits; ``None`` on a test split, whose labels are the server's), the images, and
the point's own mIoU of the same evaluation (``point_miou_pct``) for comparison.
"""
import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import torch

from ..records import point
from .data import cityscapes, cocostuff, seg_transforms, vistas
from .point import USER_ERRORS, exit_with_message
from .seg_point import DATASETS, build, metric_columns
from .segmentation import evaluate_segmentation
from .segmentation.submission import SubmissionWriter

EXPERIMENT = "iabn_table2_submission"
#: The experiment whose points this command reads.
SOURCE = "iabn_table2_segmentation"
#: Each data set's splits (the test splits' labels are the benchmark servers').
SPLITS = {"cityscapes": cityscapes.SPLITS, "cocostuff": cocostuff.SPLITS,
          "vistas": vistas.SPLITS}


def parser():
    """The command's argument parser."""
    p = point.parser(EXPERIMENT, "Predict a split with a trained segmentation point and write "
                     "the predictions in the data set's benchmark format.", timed=False)
    p.add_argument("--point", type=Path, required=True,
                   help=f"the {SOURCE} point's JSON artifact (the network and its evaluations)")
    p.add_argument("--weights", type=Path, required=True, help="the point's --weights file")
    p.add_argument("--data", type=Path, required=True, help="the data set's root")
    p.add_argument("--split", required=True,
                   help="the split to predict (Cityscapes: val, test; COCO-Stuff: val; Vistas: "
                        "validation, testing)")
    p.add_argument("--eval", dest="evaluation", default="single",
                   help="the point's evaluation whose scales and flipping to use "
                        "(default single)")
    p.add_argument("--predictions", type=Path, required=True,
                   help="the folder to write (must not exist)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    return p


def read_point(path, evaluation):
    """``(config, row)`` of the segmentation point at ``path``: its configuration and the result
    row of ``evaluation``. ``ValueError`` naming the file if it is not such a point or has no
    such evaluation."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--point {path}: cannot read the JSON ({error})") from error
    if not isinstance(record, dict) or record.get("experiment") != SOURCE:
        got = record.get("experiment") if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"--point {path}: expected a {SOURCE} point, got {got!r}")
    rows = {row.get("eval"): row for row in record.get("results", [])}
    if evaluation not in rows:
        raise ValueError(f"--eval {evaluation}: the point {path} has the evaluations "
                         f"{sorted(rows)}")
    return record["config"], rows[evaluation]


def check(p, args):
    """Argument checks beyond argparse's; errors exit with status 2 and name the option."""
    point.check(p, args)
    if args.workers < 0:
        p.error(f"--workers {args.workers}: must be >= 0")
    try:
        args.config, args.row = read_point(args.point, args.evaluation)
    except ValueError as error:
        p.error(str(error))
    dataset = args.config["dataset"]
    if args.split not in SPLITS[dataset]:
        p.error(f"--split {args.split}: {dataset} has the splits {list(SPLITS[dataset])}")
    for option in ("weights", "data"):
        if not getattr(args, option).exists():
            p.error(f"--{option} {getattr(args, option)}: no such file or folder")
    partial = _partial(args.predictions)
    for folder in (args.predictions, partial):
        if folder.exists():
            p.error(f"--predictions {args.predictions}: {folder} exists; remove it or name "
                    "another folder")
    return args


def _partial(folder):
    return folder.with_name(folder.name + ".partial")


def model_options(config):
    """The :func:`.seg_point.build` options of the point's network (no ImageNet weights: the
    point's own replace them)."""
    return argparse.Namespace(body=config["body"], norm=config["norm"],
                              output_stride=config["output_stride"],
                              model_args=json.loads(config["model_args"]),
                              pretrained=None, init=None)


def predict(args):
    """Predict ``args.split``, write the folder, return the result row."""
    device, dtype = point.setup(args)
    config, row = args.config, args.row
    dataset = config["dataset"]
    split_set = DATASETS[dataset][0](args.data, args.split, seg_transforms.SegmentationEval())
    classes = json.loads(config["class_names"])
    if list(split_set.classes) != classes:
        raise ValueError(f"--data {args.data}: its {dataset} classes ({split_set.num_classes}) "
                         f"are not the {len(classes)} classes the point {args.point} trained on")
    split_set.check_headers()
    model = build(model_options(config), len(classes))
    state = torch.load(args.weights, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"--weights {args.weights}: not the weights of the point {args.point} "
                         f"({str(error).splitlines()[0]})") from error
    model = model.to(device=device, dtype=dtype)
    loader = torch.utils.data.DataLoader(split_set, batch_size=1, shuffle=False,
                                         num_workers=args.workers)
    scales = tuple(float(s) for s in str(row["scales"]).split(","))
    partial = _partial(args.predictions)
    partial.mkdir(parents=True)
    try:
        writer = SubmissionWriter(dataset, split_set, partial)
        metrics = evaluate_segmentation(model, loader, device, num_classes=len(classes),
                                        scales=scales, flip=bool(row["flip"]),
                                        window=config.get("eval_window"), sink=writer)
        files = writer.finish()
    except BaseException:
        shutil.rmtree(partial)
        raise
    partial.rename(args.predictions)
    return {"point": args.point.stem, "dataset": dataset, "split": args.split,
            "eval": args.evaluation, "scales": row["scales"], "flip": row["flip"],
            "eval_window": config.get("eval_window"), "files": len(files),
            **metric_columns(metrics), "point_miou_pct": row.get("miou_pct")}


def main(argv=None):
    p = parser()
    args = check(p, p.parse_args(argv))
    try:
        row = predict(args)
    except USER_ERRORS as error:
        exit_with_message(p, error)
    except ValueError as error:
        if str(error).startswith(("--weights", "--data", "--model-arg")):
            p.error(str(error))
        raise
    config = {"point": str(args.point), "weights": str(args.weights), "data": str(args.data),
              "predictions": str(args.predictions)}
    point.write(args, EXPERIMENT, config, [row])
    miou = row["miou_pct"]
    score = "" if miou is None or math.isnan(miou) else f", mIoU {miou:.2f}%"
    print(f"wrote {row['files']} files to {args.predictions}{score}; {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["EXPERIMENT", "SOURCE", "SPLITS", "check", "main", "model_options", "parser", "predict",
           "read_point"]
