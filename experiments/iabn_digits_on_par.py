"""InPlace-ABN paper, "on-par results on ImageNet-1k", checked at small scale: validation
accuracy of one small ResNeXt trained with STD-BN and with InPlace-ABN on real images.

Run as ``python -m experiments.iabn_digits_on_par --seed S [--epochs E] [--batch B] [--lr LR]
[--width W] [--val-fraction F] [--threads T] --out PATH``. One point is one seed; it trains
both normalizations, so the Snakemake rule's points are the seeds and the aggregate CSV holds
one row per (seed, norm).

Why this data set. ImageNet (1.28 M images, 90 epochs on GPUs) is what the claim is about and
what :mod:`experiments.iabn_table1_imagenet` trains at the paper profile. A check that runs
anywhere needs real images that install offline: scikit-learn's bundled
``sklearn.datasets.load_digits`` (1797 scanned handwritten digits, 8x8 grey levels 0..16, ten
classes) is the smallest such set. Its verdict is "consistent at small scale" or not, never a
reproduction of the ImageNet numbers.

What is held equal, so that the normalization is the only difference within a seed:

* the split: stratified by class, ``--val-fraction`` of the images for validation, drawn with
  the fixed :data:`SPLIT_SEED` (the same split for every seed and both norms);
* the network: :class:`layers.ResNeXt` (the class of the paper's ResNeXt-101) with one
  bottleneck block per stage, ``--width`` stem channels and cardinality :data:`GROUPS`, its
  BN + activation layers from the same factory (``norm="bn"`` or ``"iabn"``, leaky ReLU 0.01)
  as every trained model here; the grey digit is repeated over the three input channels;
* the initial weights: the seed's STD-BN network's state dict is loaded into the InPlace-ABN
  network (both have ``nn.BatchNorm2d``'s keys);
* the training: :func:`experiments.train.engine.train` with the same recipe (SGD with Nesterov
  momentum, cosine schedule) and seed, hence the same batches in the same order.

Per norm the record holds ``val_accuracy`` (top-1 on the validation images, in [0, 1]),
``val_loss``, ``train_loss`` (last epoch), the image counts and the training time.
"""
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import TensorDataset

import layers

from .records import point
from .train import engine

EXPERIMENT = "iabn_digits_on_par"
NORMS = ("bn", "iabn")
#: Seed of the stratified train/validation split: one split for every seed and norm.
SPLIT_SEED = 0
#: Cardinality of the small ResNeXt (groups of its 3x3 convolutions).
GROUPS = 4
#: The digits' grey levels run from 0 to this.
MAX_LEVEL = 16.0


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Validation accuracy of a small ResNeXt with STD-BN and with "
                                 "InPlace-ABN on scikit-learn's real 8x8 digits (InPlace-ABN's "
                                 "'on par' claim at small scale).", timed=False)
    p.add_argument("--seed", type=int, required=True,
                   help="seed of the initial weights and the batch order (>= 0)")
    p.add_argument("--epochs", type=int, default=8, help="training epochs (default: 8)")
    p.add_argument("--batch", type=int, default=64, help="training batch (default: 64)")
    p.add_argument("--lr", type=float, default=0.1, help="peak learning rate (default: 0.1)")
    p.add_argument("--width", type=int, default=8,
                   help="stem channels; stage i outputs 4 * width * 2**i (default: 8)")
    p.add_argument("--val-fraction", type=float, default=0.2,
                   help="share of the images held out for validation (default: 0.2)")
    args = p.parse_args(argv)
    point.check(p, args, positive=("epochs", "batch"))
    if args.seed < 0:
        p.error(f"--seed {args.seed}: must be >= 0")
    if not args.lr > 0:
        p.error(f"--lr {args.lr}: must be > 0")
    if args.width < GROUPS or args.width % GROUPS:
        p.error(f"--width {args.width}: must be a multiple of the cardinality {GROUPS}")
    if not 0 < args.val_fraction < 1:
        p.error(f"--val-fraction {args.val_fraction}: must lie strictly between 0 and 1")
    if args.dtype != "float32":
        p.error(f"--dtype {args.dtype}: the trained networks run in float32")
    return args


def digits_split(val_fraction, seed=SPLIT_SEED):
    """``(train, val)`` TensorDatasets of scikit-learn's digits as ``(N, 3, 8, 8)`` float32
    images (grey levels over :data:`MAX_LEVEL`, standardised by the training images' mean and
    standard deviation, repeated over three channels) and int64 labels, split stratified by
    class with ``seed``."""
    from sklearn.datasets import load_digits  # imported here: only this experiment needs it
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32) / MAX_LEVEL
    train_x, val_x, train_y, val_y = train_test_split(
        images, digits.target, test_size=val_fraction, stratify=digits.target,
        random_state=seed)
    mean, std = train_x.mean(), train_x.std()

    def dataset(x, y):
        x = torch.from_numpy((x - mean) / std).unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
        return TensorDataset(x, torch.from_numpy(y).long())

    return dataset(train_x, train_y), dataset(val_x, val_y)


def build(norm, width, num_classes=10):
    """The small ResNeXt of this check: one bottleneck block per stage."""
    return layers.ResNeXt((1, 1, 1, 1), groups=GROUPS, width_per_group=width // GROUPS,
                          base_channels=width, num_classes=num_classes, norm=norm)


def same_init(width, seed):
    """``{norm: model}`` for :data:`NORMS`, every model holding the weights the seed's STD-BN
    network is built with."""
    torch.manual_seed(seed)
    models = {norm: build(norm, width) for norm in NORMS}
    for model in models.values():
        model.load_state_dict(models["bn"].state_dict())
    return models


def train_one(model, norm, train_set, val_set, args):
    """Train ``model`` by the point's recipe; return its record."""
    recipe = engine.Recipe(epochs=args.epochs, batch_size=args.batch, lr=args.lr,
                           schedule="cosine")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:  # the engine's checkpoint: nothing resumes
        result = engine.train(
            model=model, train_set=train_set, eval_sets={"val": engine.EvalSet(val_set)},
            recipe=recipe, run_dir=run_dir, metrics_csv=f"{run_dir}/metrics.csv",
            seed=args.seed, workers=0, device=args.device,
            desc=f"{EXPERIMENT} seed {args.seed} {norm}")
    val = result["final"]["val"]
    return {"norm": norm, "val_accuracy": 1.0 - val["top1_error"], "val_loss": val["loss"],
            "val_images": int(val["count"]), "train_images": len(train_set),
            "train_loss": result["epochs"][-1]["train_loss"], "params": result["params"],
            "train_time_s": time.perf_counter() - started}


def run(args):
    """Train both normalizations from the seed's weights; return ``(config, results)``."""
    point.setup(args)
    train_set, val_set = digits_split(args.val_fraction)
    models = same_init(args.width, args.seed)
    results = [train_one(models[norm], norm, train_set, val_set, args) for norm in NORMS]
    config = {"dataset": "sklearn_digits", "split_seed": SPLIT_SEED,
              "val_fraction": args.val_fraction, "model": "resnext_1111", "groups": GROUPS,
              "width": args.width, "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
              "schedule": "cosine", "activation": "leaky_relu"}
    return config, results


def summarize(config, results):
    """One line per norm: the validation accuracy."""
    return "\n".join(f"{r['norm']:<6}val accuracy {r['val_accuracy']:.4f} "
                     f"({r['val_images']} images), {r['train_time_s']:.1f} s" for r in results)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
