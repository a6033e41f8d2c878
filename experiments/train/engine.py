"""The training loop every training experiment shares: SGD with Nesterov momentum, a schedule
stepped every iteration, one process or ``torchrun`` ranks under DistributedDataParallel,
evaluation, a checkpoint and a metrics row per epoch, and resumption from the last checkpoint.

:func:`train` is the whole API; a :class:`Recipe` says what the paper says (epochs, the total
batch, learning rate and schedule, momentum, weight decay) and :class:`EvalSet` names a data set
to evaluate on (centre crop or ten-crop).

Distributed runs. Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) :func:`train` joins
the process group (NCCL on CUDA, gloo on CPU), gives each rank ``batch_size / world_size``
images per step (the recipe's batch is the paper's *total* batch) and wraps the model in
``DistributedDataParallel``, which averages the gradients, so a step equals one process's step
on the whole batch (exactly so when the norm layers are synchronised). ``broadcast_buffers`` is
off when every norm layer synchronises its statistics itself (``layers.InPlaceABNSync``,
``nn.SyncBatchNorm``): their running statistics come out identical on every rank of their group
already, and DDP's broadcast of rank 0's buffers before each forward would overwrite the
statistics of layers synchronised over a subgroup with another group's. With unsynchronised
norm layers it stays on (DDP's default), so all ranks use rank 0's running statistics and the
checkpoint holds the statistics every rank evaluates with. Evaluation runs the unwrapped model,
each rank on its own shard, and the metrics are summed over the ranks.

Resumption. Each epoch ends by writing ``run_dir/last.pt`` atomically (see
:mod:`.checkpoint`): model, optimizer, scheduler, every rank's random states, the number of
epochs done (the next sampler epoch), the metrics so far and the run's fingerprint. A call of
:func:`train` whose ``run_dir`` holds a checkpoint resumes from it after checking the
fingerprint; a corrupt or mismatched checkpoint raises, it never restarts silently. Resumed runs
are bit-identical to uninterrupted ones on a CPU with a fixed seed because (1) each epoch's loader
is built afresh from ``seed + epoch`` (and the sampler's ``set_epoch``), so its order and worker
seeds depend on ``(seed, epoch)`` only; (2) the random states captured at the end of an epoch are
those the next epoch starts from, and they are restored on resume; (3) the optimizer's momentum
buffers and the scheduler's step count are restored exactly; (4) nothing between the capture and
the next epoch draws random numbers. (On GPUs, nondeterministic kernels make runs differ anyway.)

The metrics CSV (``metrics_csv``, written by rank 0) is rewritten atomically from the rows kept
in the checkpoint after every epoch, so after a resume it holds each epoch exactly once.
Columns: ``epoch`` (1-based count of epochs done), ``lr`` (the rate of the epoch's first
iteration), ``train_loss`` and ``train_top1_error`` (over the epoch's training batches, all
ranks), ``images_per_s`` (all ranks' training images over the epoch's training wall time),
``peak_memory_bytes`` (CUDA: ``max_memory_allocated`` during the epoch, maximum over ranks;
CPU: the process's peak resident set size since it started, ``getrusage``, maximum over ranks;
a rank forked by :mod:`.launch` (or a job forked by :mod:`experiments.records.forkserver`)
counts its parent's file mappings, torch's libraries, only as it touches them, so it reads
lower than the same rank under ``torchrun``: 0.64 against 0.96 GB for a smoke segmentation
point),
``epoch_time_s`` (training and evaluation), and per evaluation set ``<name>_<metric>`` for
each of its metrics (classification: ``top1_error``, ``top5_error``, ``loss``; segmentation:
``miou``, ``pixel_accuracy``), empty in epochs without evaluation. ``train_top1_error`` is
empty when the outputs are not ``(N, classes)`` logits (segmentation).
"""
import csv
import dataclasses
import hashlib
import math
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

import layers

from ..records.atomic import atomic_path
from . import checkpoint, distributed, metrics, schedules

CHECKPOINT_NAME = "last.pt"
#: Ten-crop evaluation batches hold this many times fewer images (each image is 10 crops), as
#: fb.resnet.torch divides its batch by the number of crops.
TEN_CROPS = 10
#: Norm layers whose statistics are synchronised by the layer itself.
SYNC_NORMS = (layers.InPlaceABNSync, layers.ABNSync, nn.SyncBatchNorm)
NORMS = layers.NORM_TYPES


@dataclass(frozen=True)
class Recipe:
    """A paper's optimisation recipe. ``batch_size`` is the GLOBAL batch (the paper's total),
    split evenly over the ranks; ``schedule`` and ``schedule_params`` are those of
    :func:`.schedules.make_schedule`."""

    epochs: int
    batch_size: int
    lr: float
    schedule: str
    schedule_params: dict = field(default_factory=dict)
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    no_weight_decay_on_norms: bool = False

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"Recipe.{name}={value!r}: expected an integer >= 1")
        for name in ("lr", "momentum", "weight_decay"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Recipe.{name}={value!r}: expected a finite number >= 0")
        if self.lr <= 0:
            raise ValueError(f"Recipe.lr={self.lr!r}: expected a number > 0")
        if self.nesterov and self.momentum <= 0:
            raise ValueError(f"Recipe.nesterov=True needs momentum > 0, got {self.momentum!r}")
        if self.schedule not in schedules.SCHEDULES:
            raise ValueError(f"Recipe.schedule={self.schedule!r}: expected one of "
                             f"{list(schedules.SCHEDULES)}")
        if not isinstance(self.schedule_params, dict):
            raise ValueError(f"Recipe.schedule_params={self.schedule_params!r}: expected a dict")
        # Validate the parameters now, not after the first epoch's data is loaded.
        schedules.make_schedule(self.schedule, self.lr, self.epochs, 1, **self.schedule_params)


#: The metrics of the default (classification) evaluation, as :func:`.metrics.evaluate` names
#: them.
CLASSIFICATION_METRICS = ("top1_error", "top5_error", "loss")


@dataclass(frozen=True)
class EvalSet:
    """A data set to evaluate on, and how.

    By default a classification set (:func:`.metrics.evaluate`; ten-crop data sets yield
    ``(10, C, H, W)`` samples). Another task passes ``evaluate``, a callable
    ``evaluate(model, loader, device, non_blocking=...)`` returning a dict that holds (at
    least) the ``metrics`` it names and ``"count"``, the samples evaluated over all ranks
    (e.g. :class:`..segmentation.SegmentationEvaluator`); ``metrics`` become the metrics CSV's
    ``<name>_<metric>`` columns, the first is the one printed per epoch. ``batch_size`` is the
    per-rank evaluation batch (default: the training batch, a tenth of it for ten-crop sets).
    """

    dataset: object
    ten_crop: bool = False
    evaluate: object = None
    metrics: tuple = CLASSIFICATION_METRICS
    batch_size: int = None

    def __post_init__(self):
        if self.evaluate is not None and not callable(self.evaluate):
            raise ValueError(f"EvalSet.evaluate={self.evaluate!r}: expected a callable")
        if self.evaluate is None and tuple(self.metrics) != CLASSIFICATION_METRICS:
            raise ValueError(f"EvalSet.metrics={self.metrics!r}: the classification evaluation "
                             f"gives {CLASSIFICATION_METRICS}; pass evaluate for others")
        if not self.metrics or not all(isinstance(m, str) and m for m in self.metrics):
            raise ValueError(f"EvalSet.metrics={self.metrics!r}: expected metric names")
        if self.batch_size is not None and not (isinstance(self.batch_size, int)
                                                and self.batch_size >= 1):
            raise ValueError(f"EvalSet.batch_size={self.batch_size!r}: expected None or an "
                             "integer >= 1")


def _make_loader(dataset, batch_size, *, train, workers, seed, device, train_sampler=None):
    # Imported here: the data package is independent of the loop (and heavier to import).
    from .data.loaders import make_loader
    return make_loader(dataset, batch_size, train=train, workers=workers, seed=seed,
                       device=device, train_sampler=train_sampler)


def _name(value):
    """A stable name of a callable for the fingerprint (``functools.partial``: its function's);
    ``None`` stays ``None``."""
    if value is None:
        return None
    value = getattr(value, "func", value)
    return getattr(value, "__qualname__", type(value).__qualname__)


def _jsonable(value):
    """Fingerprint values as plain, comparable data (tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _model_summary(model):
    lines = [f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in model.state_dict().items()]
    return {"class": type(model).__qualname__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "state_digest": hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]}


def _dataset_summary(dataset):
    return {"class": type(dataset).__qualname__, "length": len(dataset)}


def fingerprint(*, model, train_set, eval_sets, recipe, seed, world_size, criterion, eval_every,
                train_sampler=None, options=None):
    """The configuration a checkpoint must match to be resumed: the recipe, seed, world size,
    the model's class and state-dict layout, the criterion's class, the data sets' classes and
    lengths, the training sampler's name, the evaluations (kind, metrics, schedule), and the
    caller's ``options`` (``{name: value}``, kept at the top level under their own names: what
    changes the results and the engine cannot see, such as a data set's transforms, the norm
    layers, the thread count; see the training points). Worker counts and paths are not part
    of it: they change no result, and a run may resume from another folder."""
    return _jsonable({
        **(options or {}),
        "recipe": dataclasses.asdict(recipe),
        "seed": seed,
        "world_size": world_size,
        "model": _model_summary(model),
        "criterion": type(criterion).__qualname__,
        "train_set": _dataset_summary(train_set),
        "train_sampler": _name(train_sampler),
        "eval_sets": {name: {**_dataset_summary(e.dataset), "ten_crop": e.ten_crop,
                             "evaluate": _name(e.evaluate), "metrics": list(e.metrics)}
                      for name, e in eval_sets.items()},
        "eval_every": eval_every,
    })


def _process_seed(seed, rank):
    """A well-mixed 32-bit seed for ``rank``'s process RNGs (different ranks draw different
    augmentation/dropout streams)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def _seed_process(seed, rank):
    s = _process_seed(seed, rank)
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def _param_groups(model, recipe):
    if not recipe.no_weight_decay_on_norms:
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    norm_params = {id(p) for m in model.modules() if isinstance(m, NORMS)
                   for p in m.parameters(recurse=False)}
    decay = [p for p in model.parameters() if p.requires_grad and id(p) not in norm_params]
    no_decay = [p for p in model.parameters() if p.requires_grad and id(p) in norm_params]
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def _wrap(model, ctx):
    if not ctx.distributed:
        return model
    norms = [m for m in model.modules() if isinstance(m, NORMS)]
    all_synced = bool(norms) and all(isinstance(m, SYNC_NORMS) for m in norms)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids,
                                   broadcast_buffers=not all_synced)


def _peak_memory(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def _columns(eval_sets):
    base = ["epoch", "lr", "train_loss", "train_top1_error", "images_per_s",
            "peak_memory_bytes", "epoch_time_s"]
    return base + [f"{n}_{m}" for n, e in eval_sets.items() for m in e.metrics]


def _write_csv(path, rows, eval_sets):
    columns = _columns(eval_sets)
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})


def _check_arguments(model, train_set, eval_sets, recipe, seed, workers, eval_every, criterion,
                     train_sampler):
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
    if not isinstance(recipe, Recipe):
        raise ValueError(f"recipe: expected an engine.Recipe, got {type(recipe).__name__}")
    if not isinstance(eval_sets, dict) or not all(
            isinstance(k, str) and k and isinstance(v, EvalSet) for k, v in eval_sets.items()):
        raise ValueError("eval_sets: expected a dict of non-empty names to engine.EvalSet")
    if not (isinstance(seed, int) and seed >= 0):
        raise ValueError(f"seed={seed!r}: expected an integer >= 0")
    if not (isinstance(workers, int) and workers >= 0):
        raise ValueError(f"workers={workers!r}: expected an integer >= 0")
    if not (isinstance(eval_every, int) and eval_every >= 1):
        raise ValueError(f"eval_every={eval_every!r}: expected an integer >= 1")
    if not callable(criterion):
        raise ValueError(f"criterion={criterion!r}: expected a callable loss")
    if len(train_set) == 0:
        raise ValueError("train_set: the training set is empty")
    if train_sampler is not None and not callable(train_sampler):
        raise ValueError(f"train_sampler={train_sampler!r}: expected None or a callable "
                         "(num_replicas, rank, seed) -> Sampler")


def train(*, model, train_set, eval_sets, recipe, run_dir, metrics_csv, seed, workers, device,
          desc, criterion=None, eval_every=1, train_sampler=None, options=None):
    """Train ``model`` on ``train_set`` by ``recipe``, evaluating on ``eval_sets``; see the
    module docstring for distribution, checkpoints, resumption and the metrics CSV.

    One process or ``torchrun`` ranks (detected from the environment; a process group this call
    creates is destroyed before it returns). ``device`` is ``"cpu"`` or ``"cuda"`` (each rank uses
    its ``LOCAL_RANK`` GPU); the model is moved there, its dtype kept. ``criterion`` defaults to
    ``nn.CrossEntropyLoss()``; it is called as ``criterion(output, target)``, so any task's
    loss fits (segmentation: per-pixel targets). ``train_sampler`` replaces the shuffling
    ``DistributedSampler`` of the training loader: a callable ``(num_replicas, rank, seed) ->
    Sampler`` with ``set_epoch`` (e.g. class-uniform sampling; :func:`.data.loaders.make_loader`).
    Evaluation runs every ``eval_every`` epochs and after the last. ``options`` (``{name:
    value}``) join the checkpoint's fingerprint (:func:`fingerprint`): a resume with another
    value of one is refused, naming it.
    A fresh run seeds the process RNGs from ``(seed, rank)``; build the model under a fixed seed
    before calling for a reproducible initialisation (DDP copies rank 0's weights to every rank).

    Returns ``{"epochs": [the CSV rows as dicts], "final": {eval name: the evaluation's dict
    (classification: "top1_error", "top5_error", "loss", "count")}, "world_size",
    "per_rank_batch", "params", "train_time_s"}`` (on every rank); ``train_time_s`` sums the
    epochs' times, across resumes.
    """
    criterion = nn.CrossEntropyLoss() if criterion is None else criterion
    _check_arguments(model, train_set, eval_sets, recipe, seed, workers, eval_every, criterion,
                     train_sampler)
    distributed.per_rank_batch(recipe.batch_size, distributed.world_size())  # fail early
    ctx = distributed.init(device)
    try:
        return _train(ctx, model=model, train_set=train_set, eval_sets=eval_sets, recipe=recipe,
                      run_dir=Path(run_dir), metrics_csv=Path(metrics_csv), seed=seed,
                      workers=workers, desc=desc, criterion=criterion, eval_every=eval_every,
                      train_sampler=train_sampler, options=options)
    finally:
        distributed.teardown(ctx)


def _train(ctx, *, model, train_set, eval_sets, recipe, run_dir, metrics_csv, seed, workers,
           desc, criterion, eval_every, train_sampler, options):
    device = ctx.device
    per_rank = distributed.per_rank_batch(recipe.batch_size, ctx.world_size)
    model.to(device)
    if isinstance(criterion, nn.Module):
        criterion.to(device)
    _seed_process(seed, ctx.rank)

    steps = len(_make_loader(train_set, per_rank, train=True, workers=0, seed=seed,
                             device=str(device), train_sampler=train_sampler))
    if steps == 0:
        raise ValueError(f"train_set: {len(train_set)} samples make no full batch of {per_rank} "
                         f"per rank (batch_size={recipe.batch_size}, world size "
                         f"{ctx.world_size})")
    schedule = schedules.make_schedule(recipe.schedule, recipe.lr, recipe.epochs, steps,
                                       **recipe.schedule_params)
    optimizer = torch.optim.SGD(_param_groups(model, recipe), lr=recipe.lr,
                                momentum=recipe.momentum, nesterov=recipe.nesterov,
                                weight_decay=recipe.weight_decay)
    scheduler = schedules.make_scheduler(optimizer, schedule)

    fp = fingerprint(model=model, train_set=train_set, eval_sets=eval_sets, recipe=recipe,
                     seed=seed, world_size=ctx.world_size, criterion=criterion,
                     eval_every=eval_every, train_sampler=train_sampler, options=options)
    ckpt_path = run_dir / CHECKPOINT_NAME
    rows, final, start_epoch = [], {}, 0
    if distributed.broadcast_object(ckpt_path.exists()):
        state = checkpoint.load(ckpt_path, fingerprint=fp)
        checkpoint.load_model(ckpt_path, model, state["model"])
        try:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, RuntimeError) as error:
            raise checkpoint.CheckpointMismatchError(
                f"checkpoint {ckpt_path}: optimizer/scheduler state does not fit this run: "
                f"{error}") from error
        if len(state["rng"]) != ctx.world_size:
            raise checkpoint.CheckpointMismatchError(
                f"checkpoint {ckpt_path}: holds random states of {len(state['rng'])} ranks, "
                f"this run has {ctx.world_size}")
        checkpoint.restore_rng(state["rng"][ctx.rank], device)
        rows, final, start_epoch = list(state["metrics"]), dict(state["final"]), state["epoch"]
        if ctx.is_main:
            print(f"{desc}: resuming from {ckpt_path} after epoch {start_epoch}/{recipe.epochs}",
                  file=sys.stderr)

    net = _wrap(model, ctx)
    eval_names = list(eval_sets)
    for epoch in range(start_epoch, recipe.epochs):
        started = time.perf_counter()
        row = {"epoch": epoch + 1,
               **_train_epoch(ctx, net, optimizer, scheduler, criterion, train_set, per_rank,
                              epoch, recipe.epochs, steps, seed, workers, desc, train_sampler)}
        if not math.isfinite(row["train_loss"]):
            # Stop before a diverged model overwrites the last good checkpoint.
            raise FloatingPointError(
                f"{desc}: the training loss of epoch {epoch + 1} is {row['train_loss']} "
                f"(diverged at lr {recipe.lr}); the checkpoint of epoch {epoch} in {run_dir} "
                "is kept")
        if (epoch + 1) % eval_every == 0 or epoch + 1 == recipe.epochs:
            final = {}
            for name in eval_names:
                final[name] = _evaluate(ctx, model, eval_sets[name], per_rank, seed, workers,
                                        f"{desc} {name}")
                for key in eval_sets[name].metrics:
                    row[f"{name}_{key}"] = final[name][key]
        row["epoch_time_s"] = time.perf_counter() - started
        rows.append(row)
        if ctx.is_main:
            tqdm.write(_summary(desc, row, recipe.epochs, eval_sets), file=sys.stderr)
        rng = distributed.all_gather_object(checkpoint.capture_rng(device))
        if ctx.is_main:
            checkpoint.save(ckpt_path, {
                "fingerprint": fp, "epoch": epoch + 1, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": rng, "metrics": rows, "final": final})
            _write_csv(metrics_csv, rows, eval_sets)
        distributed.barrier()
    if ctx.is_main:
        _write_csv(metrics_csv, rows, eval_sets)
    return {"epochs": rows, "final": final, "world_size": ctx.world_size,
            "per_rank_batch": per_rank, "params": sum(p.numel() for p in model.parameters()),
            "train_time_s": sum(r["epoch_time_s"] for r in rows)}


def _summary(desc, row, epochs, eval_sets):
    parts = [f"{desc} epoch {row['epoch']}/{epochs}: lr {row['lr']:.4g}",
             f"train loss {row['train_loss']:.4f}"]
    if row["train_top1_error"] is not None:
        parts.append(f"train top-1 error {row['train_top1_error']:.4f}")
    for name, eval_set in eval_sets.items():
        metric = eval_set.metrics[0]
        if f"{name}_{metric}" in row:
            parts.append(f"{name} {metric.replace('_', ' ')} {row[f'{name}_{metric}']:.4f}")
    parts.append(f"{row['images_per_s']:.1f} images/s")
    return ", ".join(parts)


def _train_epoch(ctx, net, optimizer, scheduler, criterion, train_set, per_rank, epoch, epochs,
                 steps, seed, workers, desc, train_sampler):
    device = ctx.device
    loader = _make_loader(train_set, per_rank, train=True, workers=workers, seed=seed + epoch,
                          device=str(device), train_sampler=train_sampler)
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if len(loader) != steps:
        raise RuntimeError(f"train loader: {len(loader)} batches in epoch {epoch + 1}, "
                           f"{steps} in the first (the loader's length must not change)")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    net.train()
    lr = optimizer.param_groups[0]["lr"]
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen, scored = 0, 0
    non_blocking = device.type == "cuda"
    started = time.perf_counter()
    bar = tqdm(loader, total=steps, desc=f"{desc} epoch {epoch + 1}/{epochs}",
               disable=not ctx.is_main, leave=True, dynamic_ncols=True, file=sys.stderr)
    for images, target in bar:
        images = images.to(device, non_blocking=non_blocking)
        target = target.to(device, non_blocking=non_blocking)
        output = net(images)
        loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        n = target.shape[0]
        loss_sum += loss.detach().to(torch.float64) * n
        seen += n
        if output.dim() == 2 and target.dim() == 1:
            correct += (output.detach().argmax(dim=1) == target).sum()
            scored += n
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_time = time.perf_counter() - started
    loss_total, seen_total, correct_total, scored_total = distributed.all_reduce(
        [loss_sum.item(), seen, correct.item(), scored], device=device)
    train_time_max, peak = distributed.all_reduce([train_time, _peak_memory(device)], op="max",
                                                  device=device)
    row = {"lr": lr, "train_loss": loss_total / seen_total,
           "train_top1_error": (1.0 - correct_total / scored_total) if scored_total else None,
           "images_per_s": seen_total / train_time_max, "peak_memory_bytes": int(peak)}
    return row


def _evaluate(ctx, model, eval_set, per_rank, seed, workers, desc):
    batch = eval_set.batch_size or (max(1, per_rank // TEN_CROPS) if eval_set.ten_crop
                                    else per_rank)
    loader = _make_loader(eval_set.dataset, batch, train=False, workers=workers, seed=seed,
                          device=str(ctx.device))
    bar = tqdm(loader, desc=desc, disable=not ctx.is_main, leave=False, dynamic_ncols=True,
               file=sys.stderr)
    non_blocking = ctx.device.type == "cuda"
    try:
        if eval_set.evaluate is None:
            return metrics.evaluate(model, bar, ctx.device, ten_crop=eval_set.ten_crop,
                                    non_blocking=non_blocking)
        result = eval_set.evaluate(model, bar, ctx.device, non_blocking=non_blocking)
        missing = [m for m in (*eval_set.metrics, "count") if m not in result]
        if missing:
            raise KeyError(f"{desc}: the evaluation returned no {missing} (it gave "
                           f"{sorted(result)})")
        return result
    finally:
        bar.close()


__all__ = ["CHECKPOINT_NAME", "CLASSIFICATION_METRICS", "EvalSet", "Recipe", "fingerprint", "train"]
