"""Worker processes of ``tests/test_train_engine.py``, and the tiny runs both sides share.

Three modes:

* ``python -m torch.distributed.run --nproc-per-node 2 ... train_worker.py ddp OUT_DIR``: each
  rank trains :func:`ddp_model` on :func:`ddp_data` with :data:`DDP_RECIPE` through
  ``engine.train`` (which joins the gloo group from torchrun's environment) and saves its final
  state dict and the engine's report to ``OUT_DIR/rank{RANK}.pt``; the test compares them with
  one process on the whole batch.
* ``... train_worker.py seg_ddp OUT_DIR``: the same for :func:`seg_ddp_run`, a DeepLabV3
  segmentation run with InPlace-ABN sync and the bootstrapped loss.
* ``python train_worker.py resume RUN_DIR [HANG_AT MARKER]``: one process trains
  :func:`resume_run`; with ``HANG_AT`` the loss writes ``MARKER`` at its ``HANG_AT``-th call and
  sleeps, so that the test can kill the process by a signal mid-epoch, then run it again
  without ``HANG_AT`` to resume.

Both pin torch and numba to one thread (as the test's in-process reference runs do), so the
floating-point operations are the same in every process.
"""
import os
import sys
import time
from pathlib import Path

import numba
import torch
from torch import nn
from torch.utils.data import Dataset

import layers
from experiments.train import engine

CLASSES = 4
DTYPE = torch.float64
#: The DDP comparison: one step per epoch whose batch is the whole training set, so two ranks
#: with half of it each see exactly the samples one process sees, whatever the shuffling.
DDP_RECIPE = engine.Recipe(epochs=3, batch_size=8, lr=0.2, schedule="step",
                           schedule_params={"step_epochs": 2, "gamma": 0.5})
#: The resume runs: 4 steps per epoch, 2 epochs, dropout and random flips (both draw from the
#: process RNG, so a resume must restore it), a per-iteration schedule.
RESUME_RECIPE = engine.Recipe(epochs=2, batch_size=8, lr=0.1, schedule="linear",
                              schedule_params={"final_lr": 1e-3})
RESUME_STEPS_PER_EPOCH = 4


def pin_threads():
    torch.set_num_threads(1)
    numba.set_num_threads(1)


class Images(Dataset):
    """Seeded float64 ``(3, 8, 8)`` images whose class shifts their mean; random horizontal
    flips (from the process RNG) if ``augment``."""

    def __init__(self, n, seed, augment=False):
        g = torch.Generator().manual_seed(seed)
        self.targets = torch.arange(n) % CLASSES
        shift = self.targets.to(DTYPE).view(-1, 1, 1, 1) * 0.5
        self.images = torch.randn(n, 3, 8, 8, generator=g, dtype=DTYPE) + shift
        self.images[:, :, :, :4] += 1.0  # left-right asymmetry, so a flip changes the input
        self.augment = augment

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        image = self.images[i]
        if self.augment and torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image, int(self.targets[i])


class TenCrops(Dataset):
    """Ten-crop samples ``(10, 3, 8, 8)``: an image of :class:`Images` plus per-crop noise."""

    def __init__(self, n, seed):
        self.base = Images(n, seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.noise = torch.randn(n, 10, 3, 8, 8, generator=g, dtype=DTYPE) * 0.3

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        image, target = self.base[i]
        return image.unsqueeze(0) + self.noise[i], target


class TrapLoss(nn.CrossEntropyLoss):
    """Cross-entropy that, at its ``hang_at``-th call, writes ``marker`` and sleeps (to be
    killed there), or at its ``crash_at``-th call raises :class:`Crash`."""

    def __init__(self, hang_at=None, marker=None, crash_at=None):
        super().__init__()
        self.hang_at, self.marker, self.crash_at = hang_at, marker, crash_at
        self.calls = 0

    def forward(self, output, target):
        self.calls += 1
        if self.calls == self.hang_at:
            Path(self.marker).write_text(str(self.calls))
            time.sleep(600)
        if self.calls == self.crash_at:
            raise Crash(f"crash at loss call {self.calls}")
        return super().forward(output, target)


class Crash(RuntimeError):
    pass


def net(dropout, width=8):
    """conv -> InPlaceABNSync -> conv (stride 2) -> InPlaceABNSync -> pool -> [dropout] ->
    linear, float64, initialised from seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        layers.InPlaceABNSync(width),
        nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False),
        layers.InPlaceABNSync(width),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Dropout(0.3 if dropout else 0.0),
        nn.Linear(width, CLASSES),
    ).to(DTYPE)


def ddp_data():
    """``(train_set, eval_sets)`` of the DDP comparison: 8 training images (one global batch),
    8 centre-crop and 6 ten-crop evaluation samples."""
    return Images(8, seed=1), {"val": engine.EvalSet(Images(8, seed=2)),
                               "crops": engine.EvalSet(TenCrops(6, seed=3), ten_crop=True)}


def ddp_run(run_dir):
    train_set, eval_sets = ddp_data()
    model = net(dropout=False)
    report = engine.train(model=model, train_set=train_set, eval_sets=eval_sets,
                          recipe=DDP_RECIPE, run_dir=run_dir, metrics_csv=run_dir / "metrics.csv",
                          seed=5, workers=0, device="cpu", desc="ddp")
    return model, report


class Scenes(Dataset):
    """Seeded float64 ``(3, 16, 16)`` images and ``(16, 16)`` label maps of 3 classes, no void
    pixels (so every crop bootstraps the same number of pixels)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 3, (n, 4, 4), generator=g).repeat_interleave(
            4, 1).repeat_interleave(4, 2)
        self.images = (torch.randn(n, 3, 16, 16, generator=g, dtype=DTYPE)
                       + self.labels.unsqueeze(1).to(DTYPE))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def seg_ddp_run(run_dir):
    """DeepLabV3 (ResNeXt-101 body at 1/16 width, InPlace-ABN sync) trained for 2 steps of
    the whole 4-crop batch with the bootstrapped loss, evaluated by mIoU."""
    from experiments.train.seg_point import SegmentationEvaluator
    from experiments.train.segmentation import OnlineBootstrappedCrossEntropy
    from layers.deeplab import deeplabv3
    torch.manual_seed(0)
    model = deeplabv3("resnext101", num_classes=3, norm="iabn_sync", width=0.0625,
                      preact=True).to(DTYPE)
    recipe = engine.Recipe(epochs=2, batch_size=4, lr=0.05, schedule="poly", nesterov=False)
    evaluation = engine.EvalSet(Scenes(6, seed=2), evaluate=SegmentationEvaluator(3),
                                metrics=("miou", "pixel_accuracy"), batch_size=1)
    report = engine.train(model=model, train_set=Scenes(4, seed=1), eval_sets={"val": evaluation},
                          recipe=recipe, run_dir=run_dir, metrics_csv=run_dir / "metrics.csv",
                          seed=5, workers=0, device="cpu", desc="seg ddp",
                          criterion=OnlineBootstrappedCrossEntropy())
    return model, report


def resume_run(run_dir, criterion=None, workers=0, recipe=RESUME_RECIPE, width=8):
    """The run the resume tests interrupt: 32 augmented images, 2 epochs of 4 steps."""
    model = net(dropout=True, width=width)
    report = engine.train(
        model=model, train_set=Images(32, seed=7, augment=True),
        eval_sets={"val": engine.EvalSet(Images(12, seed=8))}, recipe=recipe,
        run_dir=run_dir, metrics_csv=Path(run_dir) / "metrics.csv", seed=11, workers=workers,
        device="cpu", desc="resume", criterion=criterion or TrapLoss())
    return model, report


def main(argv):
    pin_threads()
    mode, directory = argv[0], Path(argv[1])
    if mode == "ddp":
        rank = int(os.environ["RANK"])
        model, report = ddp_run(directory / "run")
        torch.save({"state": model.state_dict(), "report": report}, directory / f"rank{rank}.pt")
    elif mode == "seg_ddp":
        rank = int(os.environ["RANK"])
        model, report = seg_ddp_run(directory / "run")
        torch.save({"state": model.state_dict(), "report": report}, directory / f"rank{rank}.pt")
    elif mode == "resume":
        criterion = TrapLoss(int(argv[2]), argv[3]) if len(argv) > 2 else TrapLoss()
        resume_run(directory, criterion=criterion)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
