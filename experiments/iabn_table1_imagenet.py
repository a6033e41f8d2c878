"""InPlace-ABN paper, Table 1 (left): ImageNet top-1 / top-5 of STD-BN and InPlace-ABN
networks, at 224 centre crop, 224 10-crop and 320 centre crop; and the exact form of "InPlace-ABN
trains on par with STD-BN".

Two kinds of point:

- a row of the table: ``python -m experiments.iabn_table1_imagenet --data ROOT --model
  resnext101 --norm iabn --batch 512 --epochs 90 --schedule step --out ... --epochs-csv ...
  --weights ... --work-dir ...`` (every option: :mod:`experiments.train.point`), under
  ``torchrun --nproc-per-node N`` for N ranks (``--norm iabn_sync`` synchronises the BN
  statistics over them);
- ``python -m experiments.iabn_table1_imagenet parity --data ROOT --model resnext101
  [--model-arg width=0.0625] --steps 300 --batch 8 --crop 32 --out ...``: the network with
  STD-BN + leaky ReLU and with InPlace-ABN (``scale_mode="bn"``) trained side by side in float64
  from the same weights on the same batches, with a rounding control (STD-BN from weights
  perturbed by a few units in the last place; :mod:`experiments.train.parity`); one result row
  per step with the three losses.

The paper (Sec. 4.1): ResNeXt-101/152 (cardinality 64), SGD with Nesterov momentum 0.9, initial
learning rate 0.1, weight decay 1e-4, 90 epochs, learning rate divided by 10 every 30 epochs;
DenseNet-264 and WideResNet-38 the same, the latter with a linear decay from 0.1 to 1e-6; images
scaled to a shorter side of 256, random 224 crops, per-channel normalisation and the colour
augmentation of ResNeXt; leaky ReLU (slope 0.01) everywhere.
"""
import functools
import json
import sys
from pathlib import Path

from .records import point as record
from .train import parity, point
from .train.data import imagenet, loaders, transforms

EXPERIMENT = "iabn_table1_imagenet"
PARITY = "parity"


def parity_parser():
    """The parity command's argument parser."""
    p = record.parser(f"{EXPERIMENT} {PARITY}", "Train a network with STD-BN + leaky ReLU and "
                      "with InPlace-ABN side by side in float64 and record both loss curves.",
                      timed=False)
    p.set_defaults(dtype="float64")
    p.add_argument("--data", type=Path, required=True, help="ImageNet-layout root (train/)")
    point.add_model_options(p)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--resize", type=int, default=256)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=record.SEED)
    return p


def parse_parity_args(p, argv):
    """Parse and check the parity command's ``argv`` with its parser ``p``."""
    args = p.parse_args(argv)
    record.check(p, args, positive=("steps", "batch", "resize", "crop"))
    if args.dtype != "float64":
        p.error(f"--dtype {args.dtype}: the parity check runs in float64 only, where the two "
                "networks must agree to rounding")
    return args


def run_parity(args):
    """Train the twins; return the artifact's ``(config, results)``."""
    device, dtype = record.setup(args)
    train = imagenet.ImageNet(args.data, "train",
                              transforms.imagenet_train(args.resize, args.crop))
    loader = loaders.make_loader(train, args.batch, train=True, workers=0, seed=args.seed,
                                 device=args.device)
    batches = [(x.to(device, dtype), y.to(device)) for x, y in loader]
    model_args = dict(args.model_args)
    models = parity.twin_models(args.model, model_args, len(train.classes), dtype)
    for model in models:
        model.to(device)
    records = parity.train_side_by_side(models, batches, args.steps, args.lr,
                                        desc=f"{EXPERIMENT} parity {args.model}")
    comparison = parity.summary(records)
    results = [{**r, "model": args.model, **comparison} for r in records]
    config = {"kind": PARITY, "model": args.model, "model_args": json.dumps(model_args),
              "steps": args.steps, "batch": args.batch, "resize": args.resize,
              "crop": args.crop, "lr": args.lr, "activation": parity.ACTIVATION,
              "control_perturbation": parity.CONTROL_PERTURBATION,
              "rounding": parity.ROUNDING, "batches_per_cycle": len(batches)}
    return config, results


def summarize_parity(config, results):
    last = results[-1]
    return (f"{config['model']}: {config['steps']} steps, final loss STD-BN "
            f"{last['loss_std_bn']:.12g}, InPlace-ABN {last['loss_inplace_abn']:.12g}, control "
            f"{last['loss_control']:.12g}; within rounding of STD-BN for "
            f"{last['steps_within_rounding_inplace_abn']} steps (InPlace-ABN) and "
            f"{last['steps_within_rounding_control']} (control)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [PARITY]:
        p = parity_parser()
        try:
            record.main(EXPERIMENT, functools.partial(parse_parity_args, p), run_parity,
                        summarize_parity, argv[1:])
        except point.USER_ERRORS as error:  # bad data: its message, not a traceback
            point.exit_with_message(p, error)
        return
    point.main(EXPERIMENT, "Train an ImageNet network with STD-BN or InPlace-ABN (InPlace-ABN "
                           "paper, Table 1 left).", argv, datasets=("imagenet",))


if __name__ == "__main__":
    main()
