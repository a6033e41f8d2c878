"""One training point: a model trained on a data set with a recipe, evaluated, and recorded.

The three classification experiments (``densenet_fig2_preact``, ``densenet_fig6_imagenet``,
``iabn_table1_imagenet``) are this command line with their own defaults and descriptions; a
point runs as one process or under ``torchrun --nproc-per-node N`` (the engine detects the
ranks). Its outputs:

- ``--out``: the point's JSON artifact (:mod:`experiments.records.point`): the configuration,
  one result row per evaluation (top-1 / top-5 error in percent, loss, images evaluated,
  parameters, training images, the number of ranks and the per-rank batch), the environment;
- ``--epochs-csv``: one row per epoch (loss, lr, accuracy, images/s, peak memory, evaluations);
- ``--weights``: the trained model's state dict (``torch.load(..., weights_only=True)``), the
  input of later experiments (segmentation bodies start from these);
- ``--work-dir``: the resumable checkpoint of an unfinished run. A killed point resumes from
  it when started again with the same options (a rerun with other options that change the
  results is refused, naming them: :func:`resume_options`); it is removed once the point's
  artifacts are written, so a rerun after a finished run trains from scratch. The point
  creates it and marks it as its own (:mod:`experiments.records.ownership`); an existing
  folder that holds other files is refused before anything is written, and only what the
  point created is removed (an empty folder it was given stays).

``--verify-data`` decodes every image before training. Bad data and an unusable checkpoint
end the command with one line naming the file (:data:`USER_ERRORS`).

Only rank 0 writes files; every file is written to a temporary name and renamed.
"""
import json
import os
import sys
from pathlib import Path

import torch

from ..records import ownership, point
from ..records.atomic import atomic_path
from . import checkpoint, engine
from .data import DatasetLayoutError, cifar, imagenet, transforms
from .models import BUILDERS, build_model, parameter_count

DATASETS = ("cifar10", "cifar100", "imagenet")
NORMS = ("bn", "iabn", "iabn_sync")
SCHEDULES = ("step", "linear", "cosine", "cifar", "poly")
EVAL_MODES = ("center", "ten_crop")


def key_value(text):
    """``"growth_rate=32"`` -> ``("growth_rate", 32)``: values parse as int, float, bool or str."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    for parse in (int, float):
        try:
            return key, parse(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def _evaluation(text):
    """``"center224=center:256:224"`` -> ``("center224", "center", 256, 224)``."""
    name, sep, spec = text.partition("=")
    parts = spec.split(":")
    if not sep or len(parts) != 3 or parts[0] not in EVAL_MODES:
        raise ValueError(f"{text!r}: expected NAME=MODE:RESIZE:CROP with MODE in {EVAL_MODES}")
    return name, parts[0], int(parts[1]), int(parts[2])


def add_model_arg_option(group):
    """``--model-arg KEY=VALUE`` (repeatable) in ``group``: ``args.model_args``, a list of
    ``(key, value)``."""
    group.add_argument("--model-arg", dest="model_args", action="append", type=key_value,
                       default=[], metavar="KEY=VALUE",
                       help="keyword argument of the model's constructor (repeatable), e.g. "
                            "growth_rate=48, width=0.0625, preact=false, impl=shared")


def add_model_options(p, model=None):
    """``--model`` (default ``model``, required if ``None``) and ``--model-arg`` in a "model"
    group of ``p``; returns the group."""
    net = p.add_argument_group("model")
    net.add_argument("--model", choices=sorted(BUILDERS), required=model is None, default=model)
    add_model_arg_option(net)
    return net


def parser(experiment, description, *, model=None, datasets=DATASETS):
    """The training point's argument parser; ``model`` fixes the default ``--model``."""
    p = point.parser(experiment, description, timed=False)
    data = p.add_argument_group("data")
    data.add_argument("--dataset", choices=datasets, required=len(datasets) > 1,
                      default=datasets[0] if len(datasets) == 1 else None)
    data.add_argument("--data", type=Path, required=True,
                      help="the data set's root (CIFAR: the folder holding cifar-10-batches-py "
                           "or cifar-100-python; ImageNet: the folder holding train/ and val/)")
    data.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    data.add_argument("--resize", type=int, default=256,
                      help="ImageNet training: shorter side scaled to this (default: 256)")
    data.add_argument("--crop", type=int, default=224,
                      help="ImageNet training: random crops of this size (default: 224)")
    data.add_argument("--crop-style", choices=transforms.CROP_STYLES, default="resize_crop",
                      help="ImageNet training crops: resize_crop (shorter side to --resize, a "
                           "random --crop crop: InPlace-ABN's text) or random_resized "
                           "(fb.resnet.torch's scale augmentation, 8%%-100%% of the area, "
                           "aspect 3/4-4/3, resized to --crop: DenseNet's ImageNet runs) "
                           "(default: resize_crop)")
    data.add_argument("--eval", dest="evals", action="append", type=_evaluation, default=None,
                      metavar="NAME=MODE:RESIZE:CROP",
                      help="ImageNet evaluations (repeatable; default: Table 1's "
                           "center224=center:256:224 crops10_224=ten_crop:256:224 "
                           "center320=center:320:320)")
    add_verify_option(data)
    net = add_model_options(p, model)
    net.add_argument("--norm", choices=NORMS, default="bn")
    recipe = p.add_argument_group("recipe")
    recipe.add_argument("--epochs", type=int, required=True)
    recipe.add_argument("--batch", type=int, required=True,
                        help="the global batch (the paper's total), split over the ranks")
    recipe.add_argument("--lr", type=float, default=0.1, help="initial learning rate")
    recipe.add_argument("--schedule", choices=SCHEDULES, required=True)
    recipe.add_argument("--schedule-arg", dest="schedule_args", action="append",
                        type=key_value, default=[], metavar="KEY=VALUE",
                        help="schedule parameter (repeatable), e.g. step_epochs=30")
    recipe.add_argument("--momentum", type=float, default=0.9)
    recipe.add_argument("--weight-decay", type=float, default=1e-4)
    recipe.add_argument("--seed", type=int, default=point.SEED)
    add_output_options(p)
    return p


def add_verify_option(group):
    """``--verify-data`` in ``group``: decode the whole data set before training."""
    group.add_argument("--verify-data", action="store_true",
                       help="decode every image (and label map) of the splits the point reads "
                            "before training, so a corrupt file stops it at once (slow for a "
                            "large tree; without it images are decoded when first read)")


def verify_data(datasets):
    """Decode each of ``datasets`` that can be decoded ahead (CIFAR's pickles are decoded
    whole when they are loaded, so they have no ``verify``)."""
    for dataset in datasets:
        if hasattr(dataset, "verify"):
            dataset.verify()


def add_output_options(p):
    """A training point's outputs besides ``--out``: ``--epochs-csv``, ``--weights``,
    ``--work-dir``."""
    out = p.add_argument_group("outputs")
    out.add_argument("--epochs-csv", type=Path, required=True, help="per-epoch metrics (CSV)")
    out.add_argument("--weights", type=Path, required=True, help="trained state dict (.pt)")
    out.add_argument("--work-dir", type=Path, required=True,
                     help="resumable checkpoint of an unfinished run: a new or empty folder, "
                          "or one an earlier run of the point created (removed when the point "
                          "finishes)")


def check_work_dir(p, args):
    """Refuse (exit status 2) a ``--work-dir`` that holds files the point did not create."""
    try:
        ownership.check_claimable(args.work_dir, "--work-dir")
    except ownership.NotOwnedError as error:
        p.error(str(error))


def claim_work_dir(args):
    """Create and mark ``--work-dir`` (rank 0) before training writes into it."""
    if _is_rank_zero():
        ownership.claim(args.work_dir, "experiments.train", "--work-dir")


def release_work_dir(args):
    """Remove ``--work-dir`` once the artifacts are written: what the point created only."""
    ownership.remove(args.work_dir, own=(engine.CHECKPOINT_NAME,))


def check(p, args):
    """Checks beyond argparse's; errors exit with status 2 and name the option."""
    point.check(p, args, positive=("epochs", "batch", "resize", "crop"))
    if args.workers < 0:
        p.error(f"--workers {args.workers}: must be >= 0")
    if args.lr <= 0:
        p.error(f"--lr {args.lr}: must be > 0")
    if args.evals is None:
        args.evals = [("center224", "center", 256, 224), ("crops10_224", "ten_crop", 256, 224),
                      ("center320", "center", 320, 320)]
    names = [name for name, *_ in args.evals]
    if len(set(names)) != len(names):
        p.error(f"--eval: names {names} must be unique")
    if not args.data.exists():
        p.error(f"--data {args.data}: no such directory (see --help for the expected layout)")
    check_work_dir(p, args)
    return args


def datasets(args):
    """``(train_set, {name: engine.EvalSet}, num_classes)`` of ``args.dataset``."""
    if args.dataset == "imagenet":
        train = imagenet.ImageNet(args.data, "train",
                                  transforms.imagenet_train(args.resize, args.crop,
                                                            crop_style=args.crop_style))
        evals = {name: engine.EvalSet(
                     imagenet.ImageNet(args.data, "val",
                                       transforms.imagenet_eval(mode, resize, crop)),
                     ten_crop=mode == "ten_crop")
                 for name, mode, resize, crop in args.evals}
        return train, evals, len(train.classes)
    train = cifar.CIFAR(args.data, args.dataset, True, transforms.cifar_train(args.dataset))
    test = cifar.CIFAR(args.data, args.dataset, False, transforms.cifar_eval(args.dataset))
    return train, {"test": engine.EvalSet(test)}, len(train.classes)


def resume_options(args):
    """The options a resume must match beyond what the engine's fingerprint holds (recipe,
    seed, model layout, data set lengths), by their command-line names: ``--dataset``,
    ``--model``, ``--model-arg`` and ``--norm`` (``bn`` and ``iabn`` share one state-dict
    layout), ``--device``, ``--dtype`` and ``--threads`` (another thread count sums in
    another order, so gradients differ), and ImageNet's ``--resize``, ``--crop``,
    ``--crop-style`` and ``--eval`` (CIFAR ignores them). Paths, ``--workers`` (batches do
    not depend on it) and the outputs change no result and are left out."""
    options = {"--dataset": args.dataset, "--model": args.model,
               "--model-arg": dict(args.model_args), "--norm": args.norm,
               "--device": args.device, "--dtype": args.dtype, "--threads": args.threads}
    if args.dataset == "imagenet":
        options.update({"--resize": args.resize, "--crop": args.crop,
                        "--crop-style": args.crop_style,
                        "--eval": [list(ev) for ev in args.evals]})
    return options


def recipe(args):
    """The :class:`engine.Recipe` of the options."""
    return engine.Recipe(epochs=args.epochs, batch_size=args.batch, lr=args.lr,
                         schedule=args.schedule, schedule_params=dict(args.schedule_args),
                         momentum=args.momentum, weight_decay=args.weight_decay)


def _is_rank_zero():
    return int(os.environ.get("RANK", "0")) == 0


def configuration(args, model_args):
    """The artifact's ``config``: everything that decides what was trained, flat (the
    keyword-argument mappings as JSON text), so it becomes columns of the aggregated CSV."""
    config = {"model": args.model, "model_args": json.dumps(model_args, sort_keys=True),
              "norm": args.norm, "dataset": args.dataset, "epochs": args.epochs,
              "batch": args.batch, "lr": args.lr, "schedule": args.schedule,
              "schedule_args": json.dumps(dict(args.schedule_args), sort_keys=True),
              "momentum": args.momentum, "nesterov": True, "weight_decay": args.weight_decay,
              "workers": args.workers}
    if args.dataset == "imagenet":
        config.update(resize=args.resize, crop=args.crop, crop_style=args.crop_style)
    return config


def evaluations(args):
    """``{name: {"eval_mode", "eval_resize", "eval_crop"}}`` of the point's evaluations (CIFAR:
    its test set, unaugmented at 32x32)."""
    if args.dataset != "imagenet":
        return {"test": {"eval_mode": "center", "eval_resize": 32, "eval_crop": 32}}
    return {name: {"eval_mode": mode, "eval_resize": resize, "eval_crop": crop}
            for name, mode, resize, crop in args.evals}


def run(args, experiment):
    """Train and evaluate the point; on rank 0 write its artifacts and remove the work dir.
    Returns the engine's report."""
    device, dtype = point.setup(args)
    model_args = dict(args.model_args)
    train_set, eval_sets, num_classes = datasets(args)
    if args.verify_data:  # the evaluations share one split's files
        verify_data([train_set, next(iter(eval_sets.values())).dataset])
    model = build_model(args.model, norm=args.norm, num_classes=num_classes, **model_args)
    model = model.to(device=device, dtype=dtype)
    claim_work_dir(args)
    report = engine.train(model=model, train_set=train_set, eval_sets=eval_sets,
                          recipe=recipe(args), run_dir=args.work_dir,
                          metrics_csv=args.epochs_csv, seed=args.seed, workers=args.workers,
                          device=args.device, desc=f"{experiment} {args.out.stem}",
                          options=resume_options(args))
    if not _is_rank_zero():
        return report
    evals = evaluations(args)
    shared = {"params": parameter_count(model), "train_images": len(train_set),
              "world_size": report["world_size"],
              "per_rank_batch": report["per_rank_batch"],
              "train_time_s": report["train_time_s"],
              "final_train_loss": report["epochs"][-1]["train_loss"]}
    results = [{"eval": name, **evals[name], "top1_error_pct": 100 * metrics["top1_error"],
                "top5_error_pct": 100 * metrics["top5_error"], "loss": metrics["loss"],
                "images": metrics["count"], **shared}
               for name, metrics in report["final"].items()]
    with atomic_path(args.weights) as tmp:
        torch.save(model.state_dict(), tmp)
    point.write(args, experiment, configuration(args, model_args), results)
    release_work_dir(args)
    print(f"wrote {args.out}, {args.epochs_csv}, {args.weights}")
    return report


#: What ends a point with its message alone (:func:`exit_with_message`): bad data and an unusable
#: checkpoint are the user's to fix, from a message that names the file; a traceback buries it.
USER_ERRORS = (DatasetLayoutError, checkpoint.CheckpointError)


def exit_with_message(p, error):
    """End the command with ``error``'s message, one line, exit status 1. An error raised in a
    DataLoader worker arrives wrapped in the worker's traceback, its own message on the last
    line after the class's name: that line is the message."""
    message = str(error).strip().splitlines()[-1]
    message = message.removeprefix(f"{type(error).__module__}.{type(error).__qualname__}: ")
    sys.exit(f"{p.prog}: error: {message}")


def main(experiment, description, argv=None, **parser_options):
    """Parse, check and run a training point of ``experiment``."""
    p = parser(experiment, description, **parser_options)
    args = check(p, p.parse_args(argv))
    try:
        run(args, experiment)
    except USER_ERRORS as error:
        exit_with_message(p, error)


__all__ = ["DATASETS", "NORMS", "SCHEDULES", "USER_ERRORS", "key_value", "add_model_arg_option",
           "add_model_options", "add_output_options", "add_verify_option", "check_work_dir",
           "claim_work_dir", "release_work_dir", "verify_data", "exit_with_message", "parser",
           "check", "datasets", "resume_options", "recipe", "configuration", "evaluations",
           "run", "main"]
