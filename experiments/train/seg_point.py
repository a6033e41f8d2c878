"""One segmentation training point: DeepLabV3 on a ResNeXt-101 or WideResNet-38 body trained on
Cityscapes, COCO-Stuff or Mapillary Vistas, evaluated by mIoU, and recorded (InPlace-ABN
Sec. 4.2, Table 2).

The recipe is the paper's: the body starts from an ImageNet classification checkpoint
(``--pretrained``, the weights a classification point wrote; or, with ``--init``, the whole
network starts from a segmentation point's weights, the paper's Vistas pre-training of its
Cityscapes test model, a classifier of other classes excepted), output stride 8, the DeepLabV3
head with the body's normalisation (``--norm bn|iabn|iabn_sync``), logits upsampled bilinearly,
the online bootstrapped cross-entropy (p = 1.0, m = 25%), SGD with momentum 0.9 (not Nesterov:
the paper says momentum only) and weight decay 1e-4, learning rate 2.5e-3 with the poly 0.9
decay per iteration, random horizontal flips, random scaling in [0.7, 2.0] and crops padded
with void. ``--class-uniform`` compiles each epoch's batches by CLASS-UNIFORM SAMPLING instead
of shuffling.

**Batch compilation.** ``--crops`` is the number of crops per device (the paper's per-GPU batch:
its 16 crops over four GPUs are 4 per GPU) and ``--crop`` their size. ``--capacity`` reads both
from an ``iabn_table2_capacity`` point (FIXED CROP: the most crops of the crop size; FIXED
BATCH: the largest crop for the batch; see :mod:`experiments.iabn_table2_capacity`), so the
brackets of Table 2 and its mIoU come from one chain. The global batch is ``crops`` times the
number of ranks: under ``torchrun --nproc-per-node N`` each rank holds one device's crops,
and with ``--norm iabn`` / ``bn`` each normalises its own crops, as on the paper's four GPUs;
``iabn_sync`` synchronises the statistics over the ranks.

**Evaluation** (``--eval NAME=SCALES:FLIP``, repeatable): the confusion matrix over the
validation split (void ignored, summed over the ranks), one image at a time at full
resolution, at each scale of ``SCALES`` (comma-separated) with or without horizontal flipping,
the class probabilities averaged (:mod:`experiments.train.segmentation`); images larger than
``--eval-window`` are evaluated in overlapping sliding windows. Table 2 top is
``single=1:noflip``; its bottom's test-set protocol is ``ms_flip=1,1.25,1.5,1.75,2:flip``.

**Data checks** before training: every image's and label map's header (a label map of
another size than its image, or not an 8-bit map, stops the point before its first epoch, not
when the first evaluation reads it), and with ``--verify-data`` every file decoded and every
label value checked against the release's table. Bad data and an unusable checkpoint end the
command with one line naming the file.

Outputs as for a classification point (:mod:`experiments.train.point`): ``--out`` (the JSON
artifact: one result row per evaluation with mIoU and pixel accuracy in percent, per-class IoU,
the batch compilation and what was trained), ``--epochs-csv``, ``--weights`` and the resumable
``--work-dir``, all written by :func:`experiments.train.engine.train`'s machinery.
"""
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from layers.deeplab import BODIES, deeplabv3

from ..records import point
from ..records.atomic import atomic_path
from . import engine
from .data import cityscapes, class_uniform, cocostuff, seg_transforms, vistas
from .point import (USER_ERRORS, add_model_arg_option, add_output_options, add_verify_option,
                    check_work_dir, claim_work_dir, exit_with_message, release_work_dir,
                    verify_data)
from .segmentation import OnlineBootstrappedCrossEntropy, evaluate_segmentation

#: dataset -> (class, training split, validation split).
DATASETS = {
    "cityscapes": (cityscapes.Cityscapes, "train", "val"),
    "cocostuff": (cocostuff.COCOStuff, "train", "val"),
    "vistas": (vistas.Vistas, "training", "validation"),
}
NORMS = ("bn", "iabn", "iabn_sync")
METRICS = ("miou", "pixel_accuracy")


@dataclass(frozen=True)
class SegmentationEvaluator:
    """An :class:`engine.EvalSet`'s ``evaluate``: mIoU and pixel accuracy at ``scales``, with
    ``flip``, in sliding windows of ``window`` where an image is larger."""

    num_classes: int
    scales: tuple = (1.0,)
    flip: bool = False
    window: int = None

    def __call__(self, model, loader, device, non_blocking=False):
        return evaluate_segmentation(model, loader, device, num_classes=self.num_classes,
                                     scales=self.scales, flip=self.flip, window=self.window,
                                     non_blocking=non_blocking)


def _evaluation(text):
    """``"ms_flip=1,1.25,2:flip"`` -> ``("ms_flip", (1.0, 1.25, 2.0), True)``."""
    name, sep, spec = text.partition("=")
    scales, sep2, flip = spec.partition(":")
    try:
        values = tuple(float(v) for v in scales.split(","))
    except ValueError:
        values = ()
    if (not sep or not sep2 or not name or not values or flip not in ("flip", "noflip")
            or not all(math.isfinite(v) and v > 0 for v in values)):
        raise ValueError(f"{text!r}: expected NAME=SCALES:flip|noflip with SCALES positive "
                         "numbers separated by commas, e.g. single=1:noflip")
    return name, values, flip == "flip"


def parser(experiment, description):
    """The segmentation point's argument parser."""
    p = point.parser(experiment, description, timed=False)
    data = p.add_argument_group("data")
    data.add_argument("--dataset", choices=sorted(DATASETS), required=True)
    data.add_argument("--data", type=Path, required=True,
                      help="the data set's root in its released layout (Cityscapes: holding "
                           "leftImg8bit/ and gtFine/; COCO-Stuff: images/ and annotations/; "
                           "Vistas: config.json, training/, validation/, or the v2.0 "
                           "download's config_v1.2.json and <split>/v1.2/labels/)")
    data.add_argument("--coarse", action="store_true",
                      help="Cityscapes: also train on train_extra with the coarse labels")
    data.add_argument("--train-val", action="store_true",
                      help="train on the training and validation splits together (the paper's "
                           "Vistas test model); the evaluations then score trained images")
    data.add_argument("--class-uniform", action="store_true",
                      help="CLASS-UNIFORM SAMPLING: each epoch shows all classes uniformly")
    data.add_argument("--scale", type=float, nargs=2, default=(0.7, 2.0),
                      metavar=("MIN", "MAX"), help="random scaling range (default 0.7 2.0)")
    data.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    add_verify_option(data)
    net = p.add_argument_group("model")
    net.add_argument("--body", choices=sorted(BODIES), required=True)
    add_model_arg_option(net)
    net.add_argument("--norm", choices=NORMS, required=True)
    net.add_argument("--output-stride", type=int, default=8)
    net.add_argument("--pretrained", type=Path,
                     help="the body's ImageNet weights: a classification point's --weights "
                          "(default: none, random initialisation)")
    net.add_argument("--init", type=Path,
                     help="start the whole network from a segmentation point's --weights "
                          "(its body, head and, for the same classes, its classifier; the "
                          "paper's Cityscapes test model is Vistas pre-trained), instead of "
                          "--pretrained")
    batch = p.add_argument_group("batch compilation")
    batch.add_argument("--capacity", type=Path,
                       help="an iabn_table2_capacity point's JSON: crops per device and crop "
                            "size (instead of --crops and --crop)")
    batch.add_argument("--crops", type=int, help="crops per device (rank)")
    batch.add_argument("--crop", type=int, help="crop size in pixels (square crops)")
    recipe = p.add_argument_group("recipe")
    recipe.add_argument("--epochs", type=int, required=True)
    recipe.add_argument("--lr", type=float, default=2.5e-3, help="initial learning rate")
    recipe.add_argument("--poly-power", type=float, default=0.9)
    recipe.add_argument("--momentum", type=float, default=0.9)
    recipe.add_argument("--weight-decay", type=float, default=1e-4)
    recipe.add_argument("--bootstrap-p", type=float, default=1.0)
    recipe.add_argument("--bootstrap-m", type=float, default=0.25)
    recipe.add_argument("--seed", type=int, default=point.SEED)
    evaluation = p.add_argument_group("evaluation")
    evaluation.add_argument("--eval", dest="evals", action="append", type=_evaluation,
                            default=None, metavar="NAME=SCALES:flip|noflip",
                            help="an evaluation of the validation split (repeatable; default "
                                 "single=1:noflip)")
    evaluation.add_argument("--eval-window", type=int,
                            help="sliding-window size for images larger than it (default: "
                                 "whole images)")
    evaluation.add_argument("--eval-every", type=int, default=1,
                            help="evaluate every N epochs (and after the last)")
    add_output_options(p)
    return p


def read_capacity(path, dataset):
    """``(crops, crop_size, config)`` of an ``iabn_table2_capacity`` point's JSON artifact;
    raises ``ValueError`` naming the file if it is not one, or if it was searched for another
    data set than ``dataset`` (its classes and crop: a data set's brackets are its own). A
    point without a data set label is taken as it is."""
    from ..iabn_table2_capacity import capacity_record
    try:
        config, record = capacity_record(path)
    except ValueError as error:
        raise ValueError(f"--capacity {error}") from error
    if config.get("dataset") not in (None, dataset):
        raise ValueError(f"--capacity {path}: a point of data set {config['dataset']!r}, "
                         f"not of --dataset {dataset}")
    return record["crops"], record["crop_size"], {
        "capacity_point": Path(path).stem, "capacity_mode": config.get("mode"),
        "capacity_norm": config.get("norm"), "capacity_method": config.get("method"),
        "capacity_budget_mib": config.get("budget_mib")}


def check(p, args):
    """Checks beyond argparse's; errors exit with status 2 and name the option."""
    point.check(p, args, positive=("epochs", "crops", "crop", "output_stride", "eval_window",
                                   "eval_every"))
    for name in ("lr", "momentum", "weight_decay", "poly_power"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
            p.error(f"--{name.replace('_', '-')} {value}: must be a finite number "
                    f"{'> 0' if name == 'lr' else '>= 0'}")
    if args.workers < 0:
        p.error(f"--workers {args.workers}: must be >= 0")
    if not 0 < args.scale[0] <= args.scale[1]:
        p.error(f"--scale {args.scale[0]} {args.scale[1]}: expected 0 < MIN <= MAX")
    if args.coarse and args.dataset != "cityscapes":
        p.error(f"--coarse: Cityscapes only (got --dataset {args.dataset})")
    if args.capacity is not None:
        if args.crops is not None or args.crop is not None:
            p.error("--capacity sets the crops and the crop size: give it or --crops and "
                    "--crop, not both")
        try:
            args.crops, args.crop, args.capacity_config = read_capacity(args.capacity,
                                                                        args.dataset)
        except ValueError as error:
            p.error(str(error))
    elif args.crops is None or args.crop is None:
        p.error("--crops and --crop (or --capacity) are required")
    else:
        args.capacity_config = {}
    if args.evals is None:
        args.evals = [("single", (1.0,), False)]
    names = [name for name, *_ in args.evals]
    if len(set(names)) != len(names):
        p.error(f"--eval: names {names} must be unique")
    if not args.data.exists():
        p.error(f"--data {args.data}: no such directory (see --help for the expected layout)")
    for option in ("pretrained", "init"):
        path = getattr(args, option)
        if path is not None and not path.is_file():
            p.error(f"--{option} {path}: no such file")
    if args.pretrained is not None and args.init is not None:
        p.error("--init starts the whole network, its body too: give it or --pretrained, "
                "not both")
    check_work_dir(p, args)
    return args


def datasets(args):
    """``(train_set, val_set)`` of ``args.dataset`` with the training and evaluation
    transforms; with ``--train-val`` the training set holds the validation images too."""
    cls, train_split, val_split = DATASETS[args.dataset]
    extra = {"coarse": True} if args.coarse else {}
    train = cls(args.data, train_split,
                seg_transforms.SegmentationTrain(args.crop, scale=tuple(args.scale)), **extra)
    val = cls(args.data, val_split, seg_transforms.SegmentationEval())
    if args.train_val:
        train.extend(val)
    return train, val


def check_data(args, *splits):
    """Before training: every sample's headers (a label map of the wrong size or mode fails now,
    not when the first evaluation reads it, an epoch later), or with ``--verify-data`` every
    file decoded and every label value checked."""
    if args.verify_data:
        verify_data(splits)
    else:
        for split in splits:
            split.check_headers()


def eval_sets(args, val_set, num_classes):
    """``{name: engine.EvalSet}``: each ``--eval`` of the validation split, one image per rank
    per step (images differ in size)."""
    return {name: engine.EvalSet(val_set, metrics=METRICS, batch_size=1,
                                 evaluate=SegmentationEvaluator(num_classes, scales, flip,
                                                                args.eval_window))
            for name, scales, flip in args.evals}


def class_uniform_sampler(train_set):
    """The engine's ``train_sampler`` for CLASS-UNIFORM SAMPLING over ``train_set``."""
    presence = train_set.class_presence()
    num_classes = train_set.num_classes

    def make(num_replicas, rank, seed):
        return class_uniform.ClassUniformSampler(presence, num_classes,
                                                 num_replicas=num_replicas, rank=rank,
                                                 seed=seed)
    make.__qualname__ = "class_uniform_sampler"
    return make


def load_init(model, path):
    """Load the segmentation weights at ``path`` into ``model`` (a network of the same body,
    width, normalisation and head): every tensor, except a classifier of another number of
    classes (another data set's), which keeps its initialisation. Any other difference is a
    ``ValueError`` naming the file."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    own = model.state_dict()
    foreign, missing = sorted(set(state) - set(own)), sorted(set(own) - set(state))
    if foreign or missing:
        raise ValueError(f"--init {path}: not a segmentation network of this body and head "
                         f"({len(foreign)} tensors of no part of it, first {foreign[:3]}; "
                         f"{len(missing)} missing, first {missing[:3]})")
    other = [k for k in own if state[k].shape != own[k].shape]
    wrong = [k for k in other if not k.startswith("classifier.")]
    if wrong:
        raise ValueError(f"--init {path}: {len(wrong)} tensors have another shape (first: "
                         f"{wrong[0]} {tuple(state[wrong[0]].shape)} vs "
                         f"{tuple(own[wrong[0]].shape)}); another width or body?")
    model.load_state_dict({k: v for k, v in state.items() if k not in other}, strict=False)
    return other


def build(args, num_classes):
    """The DeepLabV3 network of the options, its body loaded from ``--pretrained`` or the
    whole network from ``--init``."""
    model_args = dict(args.model_args)
    try:
        model = deeplabv3(args.body, num_classes=num_classes, output_stride=args.output_stride,
                          norm=args.norm, **model_args)
    except TypeError as error:
        raise ValueError(f"--model-arg {model_args}: {error}") from error
    if args.pretrained is not None:
        state = torch.load(args.pretrained, map_location="cpu", weights_only=True)
        try:
            model.load_body(state)
        except ValueError as error:
            raise ValueError(f"--pretrained {args.pretrained}: {error}") from error
    if args.init is not None:
        load_init(model, args.init)
    return model


def file_digest(path):
    """The SHA-256 of the file at ``path`` (hex), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resume_options(args):
    """The options a resume must match beyond what the engine's fingerprint holds (recipe with
    the crops per rank, seed, model layout, data set lengths, sampler), by their command-line
    names: the data (``--dataset``, ``--coarse``, ``--train-val``, ``--scale``, ``--crop``), the
    model (``--body``, ``--model-arg``, ``--norm``, ``--output-stride``, ``--pretrained`` and
    ``--init`` by their content: the weights it starts from, wherever the file lies), the loss
    (``--bootstrap-p``, ``--bootstrap-m``), the evaluations (``--eval``, ``--eval-window``),
    and ``--device``, ``--dtype``, ``--threads`` (another thread count sums in another order,
    so gradients differ). Paths, ``--workers`` and the outputs change no result."""
    return {"--dataset": args.dataset, "--coarse": args.coarse, "--train-val": args.train_val,
            "--scale": list(args.scale),
            "--crop": args.crop, "--body": args.body, "--model-arg": dict(args.model_args),
            "--norm": args.norm, "--output-stride": args.output_stride,
            "--pretrained": None if args.pretrained is None else file_digest(args.pretrained),
            "--init": None if args.init is None else file_digest(args.init),
            "--bootstrap-p": args.bootstrap_p, "--bootstrap-m": args.bootstrap_m,
            "--eval": [[name, list(scales), flip] for name, scales, flip in args.evals],
            "--eval-window": args.eval_window, "--device": args.device, "--dtype": args.dtype,
            "--threads": args.threads}


def world_size():
    """The ranks of a ``torchrun`` launch (1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def recipe(args, ranks):
    """The :class:`engine.Recipe`: ``--crops`` per rank, poly decay, plain momentum."""
    return engine.Recipe(epochs=args.epochs, batch_size=args.crops * ranks, lr=args.lr,
                         schedule="poly", schedule_params={"power": args.poly_power},
                         momentum=args.momentum, nesterov=False,
                         weight_decay=args.weight_decay)


def configuration(args):
    """The artifact's ``config``: what was trained and how, flat."""
    return {"dataset": args.dataset, "body": args.body,
            "model_args": json.dumps(dict(args.model_args), sort_keys=True),
            "norm": args.norm, "output_stride": args.output_stride,
            "pretrained": None if args.pretrained is None else str(args.pretrained),
            "init": None if args.init is None else str(args.init),
            "crops_per_device": args.crops, "crop_size": args.crop, **args.capacity_config,
            "class_uniform": args.class_uniform, "coarse": args.coarse,
            "train_val": args.train_val,
            "scale_min": args.scale[0], "scale_max": args.scale[1], "epochs": args.epochs,
            "lr": args.lr, "schedule": "poly", "poly_power": args.poly_power,
            "momentum": args.momentum, "nesterov": False, "weight_decay": args.weight_decay,
            "bootstrap_p": args.bootstrap_p, "bootstrap_m": args.bootstrap_m,
            "eval_window": args.eval_window, "workers": args.workers}


def _percent(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else 100 * value


def metric_columns(metrics):
    """An evaluation's result columns from :func:`~.segmentation.evaluate_segmentation`'s
    metrics: mIoU, pixel accuracy and per-class IoU (a JSON list) in percent, ``None`` where
    undefined, and the images."""
    return {"miou_pct": _percent(metrics["miou"]),
            "pixel_accuracy_pct": _percent(metrics["pixel_accuracy"]),
            "images": metrics["count"],
            "iou_per_class_pct": json.dumps([_percent(v) for v in metrics["iou_per_class"]])}


def run(args, experiment):
    """Train and evaluate the point; on rank 0 write its artifacts and remove the work dir.
    Returns the engine's report."""
    device, dtype = point.setup(args)
    train_set, val_set = datasets(args)
    check_data(args, train_set, val_set)
    model = build(args, train_set.num_classes).to(device=device, dtype=dtype)
    criterion = OnlineBootstrappedCrossEntropy(p=args.bootstrap_p, m=args.bootstrap_m)
    sampler = class_uniform_sampler(train_set) if args.class_uniform else None
    claim_work_dir(args)
    report = engine.train(model=model, train_set=train_set,
                          eval_sets=eval_sets(args, val_set, train_set.num_classes),
                          recipe=recipe(args, world_size()), run_dir=args.work_dir,
                          metrics_csv=args.epochs_csv, seed=args.seed, workers=args.workers,
                          device=args.device, desc=f"{experiment} {args.out.stem}",
                          criterion=criterion, eval_every=args.eval_every,
                          train_sampler=sampler, options=resume_options(args))
    if int(os.environ.get("RANK", "0")) != 0:
        return report
    evals = {name: (scales, flip) for name, scales, flip in args.evals}
    ranks = report["world_size"]
    shared = {"crops_per_device": args.crops, "crop_size": args.crop, "devices": ranks,
              "crops": args.crops * ranks, "pixels": args.crops * ranks * args.crop ** 2,
              "params": sum(p.numel() for p in model.parameters()),
              "train_images": len(train_set), "val_images": len(val_set),
              "classes": train_set.num_classes, "train_time_s": report["train_time_s"],
              "final_train_loss": report["epochs"][-1]["train_loss"]}
    results = [{"eval": name, "scales": ",".join(f"{s:g}" for s in evals[name][0]),
                "flip": evals[name][1], **metric_columns(m), **shared}
               for name, m in report["final"].items()]
    with atomic_path(args.weights) as tmp:
        torch.save(model.state_dict(), tmp)
    config = {**configuration(args), "class_names": json.dumps(list(train_set.classes))}
    point.write(args, experiment, config, results)
    release_work_dir(args)
    print(f"wrote {args.out}, {args.epochs_csv}, {args.weights}")
    return report


def main(experiment, description, argv=None):
    """Parse, check and run a segmentation point of ``experiment``."""
    p = parser(experiment, description)
    args = check(p, p.parse_args(argv))
    try:
        run(args, experiment)
    except USER_ERRORS as error:
        exit_with_message(p, error)
    except ValueError as error:
        if str(error).startswith(("--pretrained", "--init", "--model-arg")):
            p.error(str(error))
        raise


__all__ = ["DATASETS", "METRICS", "NORMS", "SegmentationEvaluator", "build", "check",
           "check_data", "class_uniform_sampler", "configuration", "datasets", "eval_sets",
           "file_digest", "load_init", "main", "metric_columns", "parser", "read_capacity",
           "recipe", "resume_options", "run"]
