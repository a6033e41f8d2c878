"""InPlace-ABN paper, Table 2 (brackets): how much more data a segmentation network trains on
in the same memory with InPlace-ABN than with STD-BN.

Run as ``python -m experiments.iabn_table2_capacity --body resnext101|wideresnet38 --norm
bn|iabn --mode fixed_crop|fixed_batch --crop C --batch N --budget-mib M [--width W]
[--layout preact|postact] [--method search|fit] [--fit-batches ...] [--fit-crops ...]
[--device cpu|cuda] ... --out PATH``. One point is one (body, norm, mode).

The paper (Sec. 4.2, Table 2) trains DeepLabV3 on ResNeXt-101 and WideResNet-38 bodies on four
12 GB Titan Xp cards, "to maximize GPU memory utilization by i) fixing the training crop size
and therefore pushing the amount of crops per minibatch to the limit (FIXED CROP) or ii) fixing
the number of crops per minibatch and maximizing the training crop resolutions (FIXED BATCH)",
and reports the increase of pixels per minibatch over STD-BN in brackets: on Cityscapes,
ResNeXt-101 16 x 512^2 -> 28 x 512^2 [+75%] (FIXED CROP), 16 x 672^2 [+72%] (FIXED BATCH);
WideResNet-38 20 x 512^2 -> 28 x 512^2 [+40%], 20 x 640^2 [+56%]. Those batches are spread
over four GPUs without synchronised BN, so the per-GPU batch, the quantity one GPU's memory
limits, is a quarter: 4 (ResNeXt-101) and 5 (WideResNet-38) crops in the baseline.

One point finds, for one network (:func:`layers.deeplab.deeplabv3`: ``--body`` at output
stride 8, the DeepLabV3 head, ``--classes`` outputs, ``--norm``), the largest training batch
that fits ``--budget-mib`` of memory:

* ``--mode fixed_crop``: the most crops (>= 2) of ``--crop`` x ``--crop`` pixels;
* ``--mode fixed_batch``: the largest crop, a multiple of ``--crop-step`` (default 8, the output
  stride), for ``--batch`` crops. The paper's FIXED BATCH keeps the STD-BN batch (16 and 20
  crops, the STD-BN rows): ``--batch-from`` takes ``--batch`` from this experiment's STD-BN
  ``fixed_crop`` point of the same body, as the pipeline does.

A *training step* is what one GPU does per iteration: forward of a batch of random crops,
bilinear upsampling of the logits, cross-entropy against random labels, backward, and an SGD
step (momentum 0.9, weight decay 1e-4 as in the paper; learning rate 0, so that every probe
trains the same weights). Its *memory* is the peak of all tensor memory during the step: the
parameters, their gradients and momentum buffers, the batch and labels, everything autograd
keeps, and the transient buffers of the backward pass. The paper's online-bootstrapped loss
is replaced by the plain cross-entropy (bootstrapping adds per-pixel loss buffers, alike under
either norm).

Two methods (``--method``; the artifact's ``method`` says which ran):

* ``search`` (``allocation_search``, the default on CUDA): real allocation. The process's CUDA
  caching allocator is capped at the budget (``torch.cuda.set_per_process_memory_fraction``),
  and the size is bracketed by doubling (or halving) it from ``--batch`` / ``--crop`` until a
  step raises ``torch.cuda.OutOfMemoryError`` (or fits), then bisected; one training step per
  probe (:func:`largest_fitting`). The CUDA context and memory outside torch's allocator are
  not counted: the budget is torch's share of the card. On the CPU the same search runs
  against the budget using the tracked peak (below) instead of an allocator limit.
* ``fit`` (``derived_from_fit``, the default on the CPU): measure the step's memory at a few
  sizes (``--fit-batches`` crops of ``--crop`` in ``fixed_crop``, ``--batch`` crops of each of
  ``--fit-crops`` in ``fixed_batch``), fit ``memory = a + b * pixels`` (pixels = crops x crop^2)
  by least squares and solve ``a + b * pixels = budget`` for the largest batch or crop. It is
  derived, not allocated; ``fit_max_residual_bytes`` says how linear the measurements were.

Memory on CUDA is ``torch.cuda.max_memory_allocated`` over the step (reset before it). On the
CPU it is the peak tensor memory of the step, tracked storage by storage
(:class:`~experiments.measure.tensor_memory.TensorMemoryTracker`): the training state
(parameters, gradients, momentum, batch, labels) and every storage a torch operation creates,
until it is freed. Buffers allocated inside oneDNN or numba kernels are not seen (they are
workspace, not feature maps).

``--simulate`` runs the same search on the meta device (the config's ``memory`` is
``simulated_meta_device``, its ``method`` ``simulated_search``): every step is simulated,
shapes and tensor memory without compute or memory, so the paper's full-width networks, 512^2
crops and 12 GB run on any machine in seconds. It is tensor memory only
(``memory_not_counted``): not the CUDA caching allocator's rounding and fragmentation, not cuDNN
workspaces, not the CUDA context.

Results (flat records, one CSV row each): one ``kind="capacity"`` record (``crops``,
``crop_size``, ``pixels`` = crops x crop^2, ``probes``; for ``fit`` also ``intercept_bytes``,
``bytes_per_pixel``, ``fit_max_residual_bytes`` and the unrounded ``capacity_pixels``) and one
``kind="measurement"`` record per measured step (``crops``, ``crop_size``, ``pixels``,
``memory_bytes`` (empty after an out-of-memory error), ``fits``, ``step_s``, and for ``fit``
``saved_bytes``: what autograd keeps after the forward, from saved-tensor hooks). The config
records the method, the budget, ``param_count`` and ``inplace_abn_layers`` (how many
InPlace-ABN modules the network has). The gain of InPlace-ABN over STD-BN, the paper's
bracket, compares two points of an aggregated CSV: :func:`capacity_gain` (pure pandas).

``--width`` scales every channel count of body and head (1: the paper's networks), for quick
CPU runs. ``--layout`` picks ResNeXt-101's blocks: ``preact`` (default), the pre-activation
blocks of the InPlace-ABN authors' released ResNeXt-101, or ``postact``, torchvision's
post-activation layout (in which InPlace-ABN can drop fewer buffers: :mod:`layers.resnext`).
"""
import gc
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from layers import InPlaceABN
from layers.deeplab import BODIES, deeplabv3
from layers.residual import NORMS

from .records import point
from .measure import tensor_memory
from .measure.saved_tensors import saved_storages
from .measure.tensor_memory import training_state_tracker

EXPERIMENT = "iabn_table2_capacity"
MODES = ("fixed_crop", "fixed_batch")
METHODS = {"search": "allocation_search", "fit": "derived_from_fit"}
LAYOUTS = ("preact", "postact")
MIB = 2 ** 20
#: Training-mode BN in the head's global pooling branch needs two values per channel.
MIN_CROPS = 2
#: Upper limits of the search, far beyond any GPU (a guard against a budget too large).
MAX_CROPS = 4096
MAX_CROP = 16384
MOMENTUM, WEIGHT_DECAY = 0.9, 1e-4
#: The config's ``memory``: how a step's memory was measured, by device type.
MEMORY_METHODS = {"cuda": "cuda_max_memory_allocated", "cpu": "cpu_tracked_storages",
                  "meta": tensor_memory.SIMULATED_METHOD}


# --------------------------------------------------------------------------- arguments
def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Largest batch / crop that fits a memory budget, STD-BN vs "
                                 "InPlace-ABN (InPlace-ABN paper, Table 2 brackets). --warmup: "
                                 "training steps before measuring (at least one runs, to "
                                 "allocate gradients and momentum); --repeats: steps per "
                                 "measured size, the largest peak counts.")
    p.add_argument("--body", choices=tuple(BODIES), required=True)
    p.add_argument("--norm", choices=NORMS, required=True,
                   help="bn (STD-BN + leaky ReLU) or iabn (InPlace-ABN)")
    p.add_argument("--mode", choices=MODES, required=True,
                   help="fixed_crop: most crops of --crop; fixed_batch: largest crop for --batch")
    p.add_argument("--crop", type=int, default=512,
                   help="crop size of fixed_crop (and where fixed_batch's search starts)")
    p.add_argument("--batch", type=int, default=4,
                   help="crops per batch of fixed_batch (and where fixed_crop's search starts)")
    p.add_argument("--batch-from", type=Path,
                   help="fixed_batch: take --batch from this STD-BN fixed_crop point of the same "
                        "body (the paper's FIXED BATCH keeps the STD-BN batch)")
    p.add_argument("--budget-mib", type=float, required=True,
                   help="memory budget in MiB (paper: 12288, a 12 GB Titan Xp)")
    p.add_argument("--width", type=float, default=1.0,
                   help="channel multiplier of body and head (default: 1, the paper's)")
    p.add_argument("--classes", type=int, default=19, help="classes (default: 19, Cityscapes)")
    p.add_argument("--dataset", default=None,
                   help="the data set whose classes and crop size this point takes, a label for "
                        "the tables (e.g. cityscapes, cocostuff; default: none)")
    p.add_argument("--output-stride", type=int, default=8, choices=(8, 16),
                   help="body output stride (default: 8, the paper's)")
    p.add_argument("--layout", choices=LAYOUTS, default="preact",
                   help="ResNeXt-101 blocks: preact (the authors' release, default) or postact "
                        "(torchvision); ignored for wideresnet38 (pre-activation)")
    p.add_argument("--method", choices=tuple(METHODS), default=None,
                   help="search (real allocation; default on cuda) or fit (derived from a "
                        "linear fit; default on cpu)")
    p.add_argument("--simulate", action="store_true",
                   help="simulate the steps on the meta device: tensor memory without compute "
                        "or memory, so the paper's sizes run on any machine (method search; "
                        "not counted: " + tensor_memory.NOT_COUNTED + ")")
    p.add_argument("--crop-step", type=int, default=8,
                   help="fixed_batch crops are multiples of this (default: 8)")
    p.add_argument("--fit-batches", type=int, nargs="+", default=[2, 3, 4],
                   help="fit, fixed_crop: batch sizes measured at --crop (default: 2 3 4)")
    p.add_argument("--fit-crops", type=int, nargs="+", default=None,
                   help="fit, fixed_batch: crop sizes measured at --batch (default: 1/4, 1/2 "
                        "and 3/4 of --crop)")
    args = p.parse_args(argv)
    args.batch_source = None
    if args.batch_from is not None:
        if args.mode != "fixed_batch":
            p.error(f"--batch-from: fixed_batch only (got --mode {args.mode})")
        try:
            args.batch = std_bn_batch(args.batch_from, args.body)
        except ValueError as error:
            p.error(str(error))
        args.batch_source = args.batch_from.stem
    point.check(p, args, positive=("crop", "batch", "classes", "crop_step"))
    if args.simulate and args.device != "cpu":
        p.error(f"--simulate runs on the meta device; --device {args.device} does not apply")
    if args.simulate and args.method == "fit":
        p.error("--simulate: the method is search (a simulated step costs no memory)")
    if args.method is None:
        args.method = "search" if args.device == "cuda" or args.simulate else "fit"
    if args.batch < MIN_CROPS:
        p.error(f"--batch {args.batch}: training-mode BN in the head's pooling branch needs "
                f"at least {MIN_CROPS} crops")
    if not args.budget_mib > 0:
        p.error(f"--budget-mib {args.budget_mib}: must be > 0")
    if not args.width > 0:
        p.error(f"--width {args.width}: must be > 0")
    if args.crop % args.crop_step:
        p.error(f"--crop {args.crop}: must be a multiple of --crop-step {args.crop_step}")
    if args.fit_crops is None:
        args.fit_crops = sorted({max(args.crop_step, args.crop * k // 4 // args.crop_step
                                     * args.crop_step) for k in (1, 2, 3)})
    for name, sizes, minimum in (("fit-batches", args.fit_batches, MIN_CROPS),
                                 ("fit-crops", args.fit_crops, args.crop_step)):
        if len(set(sizes)) < 2 or min(sizes) < minimum:
            p.error(f"--{name} {' '.join(map(str, sizes))}: needs at least two distinct sizes "
                    f">= {minimum} for the linear fit")
    if args.device == "cuda" and args.budget_mib * MIB > torch.cuda.mem_get_info()[1]:
        p.error(f"--budget-mib {args.budget_mib:g}: more than this GPU's "
                f"{torch.cuda.mem_get_info()[1] / MIB:.0f} MiB")
    return args


def capacity_record(path):
    """``(config, capacity record)`` of a point artifact of this experiment; ``ValueError``
    naming ``path`` if it is not one."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        record = next(r for r in report["results"] if r.get("kind") == "capacity")
        config, crops, crop = report["config"], int(record["crops"]), int(record["crop_size"])
    except (OSError, ValueError, KeyError, StopIteration, TypeError) as error:
        raise ValueError(f"{path}: not an {EXPERIMENT} point artifact "
                         f"({type(error).__name__}: {error})") from error
    if report.get("experiment") != EXPERIMENT:
        raise ValueError(f"{path}: an artifact of {report.get('experiment')!r}, expected "
                         f"{EXPERIMENT}")
    return config, {**record, "crops": crops, "crop_size": crop}


def std_bn_batch(path, body):
    """The crops of the STD-BN FIXED CROP point at ``path`` for ``body`` (``ValueError``
    naming the file if it is another point)."""
    config, record = capacity_record(path)
    found = (config.get("body"), config.get("norm"), config.get("mode"))
    if found != (body, "bn", "fixed_crop"):
        raise ValueError(f"--batch-from {path}: a {'/'.join(map(str, found))} point, expected "
                         f"{body}/bn/fixed_crop")
    return record["crops"]


class _Loss(nn.Module):
    """``cross_entropy(model(x), target)``, for :func:`saved_storages`."""

    def __init__(self, model, target):
        super().__init__()
        self.model, self.target = model, target

    def forward(self, x):
        return F.cross_entropy(self.model(x), self.target)


class TrainingStep:
    """A segmentation network, its SGD optimizer, and the memory of one training step."""

    def __init__(self, args, device, dtype):
        kwargs = {"preact": args.layout == "preact"} if args.body == "resnext101" else {}
        self.model = deeplabv3(args.body, num_classes=args.classes,
                               output_stride=args.output_stride, norm=args.norm,
                               width=args.width, **kwargs).to(device=device, dtype=dtype)
        self.model.train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.0, momentum=MOMENTUM,
                                         weight_decay=WEIGHT_DECAY, foreach=False)
        self.device, self.dtype, self.classes = device, dtype, args.classes
        self.cuda = device.type == "cuda"
        self.simulated = device.type == "meta"

    def batch(self, crops, crop):
        """A batch of random crops and labels (seeded: every probe sees the same data)."""
        if self.simulated:  # shapes only
            return (torch.empty((crops, 3, crop, crop), dtype=self.dtype, device="meta"),
                    torch.empty((crops, crop, crop), dtype=torch.long, device="meta"))
        generator = torch.Generator().manual_seed(point.SEED)
        x = torch.randn((crops, 3, crop, crop), generator=generator, dtype=self.dtype)
        target = torch.randint(self.classes, (crops, crop, crop), generator=generator)
        return x.to(self.device), target.to(self.device)

    def step(self, x, target):
        """Forward, loss, backward and SGD step; the gradients stay allocated."""
        self.optimizer.zero_grad(set_to_none=False)
        F.cross_entropy(self.model(x), target).backward()
        self.optimizer.step()

    def measure(self, crops, crop, repeats=1):
        """``{"memory_bytes", "step_s"}`` of ``repeats`` steps on ``crops`` x ``crop``^2
        (the largest peak, the median time). On CUDA this raises
        ``torch.cuda.OutOfMemoryError`` when the step does not fit the allocator's limit."""
        x, target = self.batch(crops, crop)
        peaks, times = [], []
        for _ in range(repeats):
            if self.cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                start = time.perf_counter()
                self.step(x, target)
                torch.cuda.synchronize(self.device)
                times.append(time.perf_counter() - start)
                peaks.append(torch.cuda.max_memory_allocated(self.device))
            else:
                tracker = training_state_tracker(self.model, [x, target], self.optimizer)
                start = time.perf_counter()
                with tracker:
                    self.step(x, target)
                times.append(time.perf_counter() - start)
                peaks.append(tracker.peak)
        return {"memory_bytes": max(peaks),
                "step_s": None if self.simulated else float(np.median(times))}

    def saved_bytes(self, crops, crop):
        """Bytes autograd keeps after the forward (and loss) of ``crops`` x ``crop``^2."""
        x, target = self.batch(crops, crop)
        return sum(saved_storages(_Loss(self.model, target), x))

    def warm_up(self, crops, crop, steps):
        """``max(1, steps)`` steps: allocate gradients and momentum, load kernels."""
        x, target = self.batch(crops, crop)
        for _ in range(max(1, steps)):
            self.step(x, target)

    def release(self):
        """Free what a step left behind (after an out-of-memory error too)."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------- search
def is_out_of_memory(error):
    """Whether ``error`` says the device ran out of memory: ``torch.OutOfMemoryError`` (the
    caching allocator), or a library's failed allocation surfacing as a ``RuntimeError``
    (cuDNN / cuBLAS ``..._ALLOC_FAILED``)."""
    text = str(error)
    return (isinstance(error, torch.OutOfMemoryError) or "out of memory" in text.lower()
            or "ALLOC_FAILED" in text)


def largest_fitting(fits, start, lower, upper):
    """The largest integer ``n`` in ``[lower, upper]`` with ``fits(n)``, assuming ``fits`` is
    monotone (true up to some size, false above); ``lower - 1`` if even ``lower`` does not fit.

    Doubles up from ``start`` (or halves down) until the answer is bracketed, then bisects.
    Returns ``(n, probes)`` with ``probes`` the ``[(size, fits), ...]`` tried, in order.
    """
    if not lower <= start <= upper:
        raise ValueError(f"start={start!r} must lie in [lower={lower!r}, upper={upper!r}]")
    probes = []

    def probe(n):
        ok = bool(fits(n))
        probes.append((n, ok))
        return ok

    if probe(start):
        good, bad = start, None
        while bad is None and good < upper:
            n = min(2 * good, upper)
            if probe(n):
                good = n
            else:
                bad = n
        if bad is None:
            return good, probes
    else:
        good, bad = None, start
        while good is None and bad > lower:
            n = max(bad // 2, lower)
            if probe(n):
                good = n
            else:
                bad = n
        if good is None:
            return lower - 1, probes
    while bad - good > 1:
        n = (good + bad) // 2
        if probe(n):
            good = n
        else:
            bad = n
    return good, probes


def _sizes(mode, fixed, n):
    """``(crops, crop)`` of search index ``n``: ``n`` crops of ``fixed`` pixels (fixed_crop) or
    ``fixed`` crops of ``n * crop_step`` pixels (fixed_batch; ``fixed`` = (batch, step))."""
    if mode == "fixed_crop":
        return n, fixed
    batch, step = fixed
    return batch, n * step


def search_capacity(step, args, budget):
    """The method ``search``: real allocation (CUDA) or the tracked peak (CPU) against
    ``budget`` bytes, one training step per probe. Returns ``(capacity, measurements)``."""
    measurements = []
    fixed = args.crop if args.mode == "fixed_crop" else (args.batch, args.crop_step)

    def fits(n):
        crops, crop = _sizes(args.mode, fixed, n)
        record = {"crops": crops, "crop_size": crop, "pixels": crops * crop * crop,
                  "memory_bytes": None, "step_s": None}
        try:
            record.update(step.measure(crops, crop, args.repeats))
        except RuntimeError as error:  # torch.OutOfMemoryError is one
            if not is_out_of_memory(error):
                raise
        step.release()
        record["fits"] = record["memory_bytes"] is not None and record["memory_bytes"] <= budget
        measurements.append(record)
        return record["fits"]

    if args.mode == "fixed_crop":
        n, probes = largest_fitting(fits, args.batch, MIN_CROPS, MAX_CROPS)
    else:
        n, probes = largest_fitting(fits, args.crop // args.crop_step, 1,
                                    MAX_CROP // args.crop_step)
    crops, crop = _sizes(args.mode, fixed, n)
    capacity = {"crops": crops, "crop_size": crop, "probes": len(probes),
                "intercept_bytes": None, "bytes_per_pixel": None, "fit_max_residual_bytes": None,
                "capacity_pixels": None}
    return capacity, measurements


# --------------------------------------------------------------------------- fit
def fit_line(pixels, memory):
    """Least-squares ``(a, b)`` of ``memory = a + b * pixels`` and the largest residual."""
    pixels, memory = np.asarray(pixels, float), np.asarray(memory, float)
    if len(set(pixels)) < 2:
        raise ValueError(f"pixels={pixels.tolist()} needs two distinct sizes to fit a line")
    b, a = np.polyfit(pixels, memory, 1)
    residual = float(np.max(np.abs(memory - (a + b * pixels))))
    return float(a), float(b), residual


def solve(a, b, budget, mode, crop=None, batch=None, crop_step=8):
    """``(crops, crop_size, capacity_pixels)`` that ``memory = a + b * pixels`` allows within
    ``budget``: the most crops of ``crop`` (fixed_crop) or the largest crop, a multiple of
    ``crop_step``, for ``batch`` crops (fixed_batch). ``capacity_pixels = (budget - a) / b``
    is the unrounded pixel capacity; a negative one gives 0 crops or crop size 0."""
    if not b > 0:
        raise ValueError(f"b={b!r}: memory does not grow with the pixels; the fit is unusable")
    pixels = (budget - a) / b
    room = max(pixels, 0.0)
    if mode == "fixed_crop":
        return int(math.floor(room / crop ** 2 + 1e-9)), crop, pixels
    if mode == "fixed_batch":
        size = int(math.floor(math.sqrt(room / batch) / crop_step + 1e-9)) * crop_step
        return batch, size, pixels
    raise ValueError(f"mode={mode!r} must be one of {MODES}")


def fit_capacity(step, args, budget):
    """The method ``fit``: memory at a few sizes, a line through it, solved for ``budget``."""
    if args.mode == "fixed_crop":
        sizes = [(n, args.crop) for n in sorted(set(args.fit_batches))]
    else:
        sizes = [(args.batch, c) for c in sorted(set(args.fit_crops))]
    measurements = []
    for crops, crop in sizes:
        record = {"crops": crops, "crop_size": crop, "pixels": crops * crop * crop,
                  **step.measure(crops, crop, args.repeats),
                  "saved_bytes": step.saved_bytes(crops, crop)}
        record["fits"] = record["memory_bytes"] <= budget
        measurements.append(record)
        step.release()
    a, b, residual = fit_line([m["pixels"] for m in measurements],
                              [m["memory_bytes"] for m in measurements])
    crops, crop, pixels = solve(a, b, budget, args.mode, args.crop, args.batch, args.crop_step)
    capacity = {"crops": crops, "crop_size": crop, "probes": len(measurements),
                "intercept_bytes": a, "bytes_per_pixel": b, "fit_max_residual_bytes": residual,
                "capacity_pixels": pixels}
    return capacity, measurements


# --------------------------------------------------------------------------- analysis
def capacity_gain(frame, baseline="bn"):
    """The paper's brackets from an aggregated CSV of this experiment (pure pandas).

    One row per capacity record, in the frame's order: ``memory`` (how memory was measured:
    real points and ``simulated_meta_device`` ones are compared only among themselves; empty
    if the frame has no such column), ``dataset`` (the label of ``--dataset``, empty if none),
    ``body``, ``mode``, ``norm``, ``method``, ``crops``, ``crop_size``, ``pixels`` (crops x
    crop^2), ``gain_pct`` (pixels per batch over ``baseline``'s with the same memory, data set,
    body and mode, minus 1, in percent: the bracket) and
    ``fit_gain_pct`` (the same from the fit's unrounded ``capacity_pixels``; NaN for
    ``allocation_search``).
    """
    needed = ("kind", "body", "norm", "mode", "method", "crops", "crop_size", "pixels",
              "capacity_pixels")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks the columns {missing}; has {list(frame.columns)}")
    rows = frame[frame["kind"] == "capacity"].reset_index(drop=True)
    rows = rows.assign(**{column: (rows[column].astype(object).fillna("") if column in rows
                                   else "") for column in ("memory", "dataset")})
    if baseline not in set(rows["norm"]):
        raise ValueError(f"baseline={baseline!r} is not among the norms "
                         f"{sorted(set(rows['norm']))}")
    group = ["memory", "dataset", "body", "mode"]
    base = rows[rows["norm"] == baseline].set_index(group)
    keys = pd.MultiIndex.from_frame(rows[group])
    base_pixels = base["pixels"].reindex(keys).to_numpy(dtype=float)
    base_fit = base["capacity_pixels"].reindex(keys).to_numpy(dtype=float)
    table = rows[["memory", "dataset", "body", "mode", "norm", "method", "crops", "crop_size",
                  "pixels"]].copy()
    table["gain_pct"] = 100 * (rows["pixels"].to_numpy(dtype=float) / base_pixels - 1)
    table["fit_gain_pct"] = 100 * (rows["capacity_pixels"].to_numpy(dtype=float) / base_fit - 1)
    return table


# --------------------------------------------------------------------------- the point
def run(args):
    """Find the capacity; return the artifact's ``(config, results)``."""
    device, dtype = point.setup(args)
    if args.simulate:
        device = torch.device("meta")
    budget = int(args.budget_mib * MIB)
    step = TrainingStep(args, device, dtype)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
        total = torch.cuda.get_device_properties(device).total_memory
        tensor_memory.cap_cuda_memory(min(1.0, budget / total), device)
    warm_crop = 2 * args.crop_step  # small: the warm-up only allocates the training state
    try:
        step.warm_up(MIN_CROPS, warm_crop, args.warmup)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        raise SystemExit(f"--budget-mib {args.budget_mib:g}: even the model and a batch of "
                         f"{MIN_CROPS} crops of {warm_crop} pixels do not fit") from None
    step.release()
    find = search_capacity if args.method == "search" else fit_capacity
    capacity, measurements = find(step, args, budget)
    capacity["pixels"] = capacity["crops"] * capacity["crop_size"] ** 2
    params = list(step.model.parameters())
    config = {"body": args.body, "norm": args.norm, "mode": args.mode,
              "layout": args.layout if args.body == "resnext101" else "preact",
              "method": "simulated_search" if args.simulate else METHODS[args.method],
              "fixed_crop": args.crop,
              "fixed_batch": args.batch, "fixed_batch_from": args.batch_source,
              "budget_mib": args.budget_mib, "budget_bytes": budget, "dataset": args.dataset,
              "width": args.width, "classes": args.classes, "output_stride": args.output_stride,
              "crop_step": args.crop_step, "param_count": sum(p.numel() for p in params),
              "inplace_abn_layers": sum(isinstance(m, InPlaceABN)  # InPlaceABNSync too
                                        for m in step.model.modules()),
              "optimizer": f"SGD(momentum={MOMENTUM}, weight_decay={WEIGHT_DECAY})",
              "memory": MEMORY_METHODS[device.type],
              "memory_not_counted": (tensor_memory.NOT_COUNTED if device.type != "cuda"
                                     else None)}
    results = [{"kind": "capacity", **capacity}]
    results += [{"kind": "measurement", **m} for m in measurements]
    return config, results


def summarize(config, results):
    """The capacity found: crops of which size within the budget."""
    capacity = results[0]
    return (f"{config['body']} {config['norm']} {config['mode']} ({config['method']}): "
            f"{capacity['crops']} x {capacity['crop_size']}^2 within {config['budget_mib']:g} MiB")


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
