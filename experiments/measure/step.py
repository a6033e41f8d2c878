"""Memory and time of one model's training step (forward + backward), for the DenseNet figures.

Run as ``python -m experiments.measure --model densenet_bc --depth 40 --growth-rate 12
--impl shared --batch 8 --device cpu [--json out.json]``, or call :func:`measure`. Models
(:class:`ModelSpec`): ``densenet_bc`` (``--depth``, ``--growth-rate``), ``densenet121`` ...
``densenet264`` (ImageNet), all with ``--impl``, ``--norm``, ``--postact``; and
``torchvision_densenet``, torchvision's ``DenseNet(memory_efficient=True)`` with the CIFAR
stem of ``densenet_bc`` (same ``--depth`` and ``--growth-rate``), the outside reference.

A step is ``model(x).backward(g)`` in training mode with a fixed random input ``x`` and output
gradient ``g``; parameter gradients are zeroed (kept allocated) before each step. Reported:

* ``saved_tensor_bytes``: the bytes autograd holds for backward after one forward, from
  ``torch.autograd.graph.saved_tensors_hooks``: every saved tensor's storage counted once,
  parameters and buffers excluded (they are resident anyway). ``shared_storage_bytes``: the
  shared storages of ``impl="shared"`` (0 otherwise). ``saved_bytes``: their sum.
* ``lower_bound_bytes`` (:func:`lower_bound_bytes`): what must persist for backward, from the
  architecture; ``saved_over_lower_bound = saved_bytes / lower_bound_bytes``; the
  ``excess_*`` fields (:func:`excess_over_lower_bound`) say where the difference goes.
* ``peak_bytes``: the peak memory of one step above the memory before it (model, input,
  gradients and, after warm-up, the shared storages). On the CPU the peak tensor memory,
  tracked storage by storage (:class:`~experiments.measure.tensor_memory.TensorMemoryTracker`,
  ``peak_method = tensor_tracker``): deterministic, unlike the process's resident set. On CUDA
  ``torch.cuda.max_memory_allocated`` after a reset, with the tracked tensor peak of the same
  step beside it (``tensor_peak_bytes``) and their relative difference.
* :func:`simulated_step_memory`: a training step (with an SGD step) of any size simulated on the
  meta device, the tensor memory by kind, without compute or memory (the paper-scale points).
* ``time``: median, min and max seconds per step after warm-up (CUDA events on GPU).
* ``param_count`` and ``param_bytes`` (:func:`architecture`: from the architecture alone, as is
  the lower bound, so both are known for a configuration that does not fit the device).

:class:`TrainingStep` is the step itself (also timed side by side by the Fig. 5 experiment);
:data:`IMPLEMENTATIONS` and :func:`cifar_spec` / :func:`cifar_configuration` name the
DenseNet-BC implementations the Fig. 4 and Fig. 5 experiments compare.
"""
import argparse
import dataclasses
import math
from collections import Counter
from pathlib import Path

import numba
import torch
import torch.nn as nn

from layers import NORM_TYPES, densenet

from ..records.atomic import write_json_atomic
from ..records.environment import describe_environment
from ..records.point import DTYPES, SEED
from . import tensor_memory
from .fast_meta import FastMeta
from .saved_tensors import saved_storage_records
from .tensor_memory import step_memory, training_state_tracker
from .timing import time_callable

IMAGENET_MODELS = ("densenet121", "densenet169", "densenet201", "densenet161", "densenet232",
                   "densenet264")
MODELS = ("densenet_bc", *IMAGENET_MODELS, "torchvision_densenet")
#: Models that take a growth rate (the others fix it).
GROWTH_RATE_MODELS = ("densenet_bc", "densenet264", "torchvision_densenet")
#: Models built from a depth (CIFAR layout, 32x32 inputs by default).
DEPTH_MODELS = ("densenet_bc", "torchvision_densenet")
DEFAULT_CIFAR_GROWTH_RATE = 12


# --------------------------------------------------------------------------- models
@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model by name and options: builds it (on any device, the meta device included).

    ``impl``, ``norm`` and ``preact`` are those of :mod:`layers.densenet` (``None``: its
    defaults ``"shared"``, ``"bn"``, ``True``); the ``torchvision_densenet`` reference has none.
    """

    model: str
    depth: int = None
    growth_rate: int = None
    impl: str = None
    norm: str = None
    preact: bool = None
    num_classes: int = None

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is not supported; allowed: "
                             f"{', '.join(MODELS)}")
        if (self.depth is None) == (self.model in DEPTH_MODELS):
            raise ValueError(f"depth={self.depth!r}: a depth is required by, and only "
                             f"accepted by, {' and '.join(DEPTH_MODELS)}")
        if self.growth_rate is not None and self.model not in GROWTH_RATE_MODELS:
            raise ValueError(f"growth_rate={self.growth_rate!r}: {self.model} has a fixed "
                             f"growth rate (only {', '.join(GROWTH_RATE_MODELS)} take one)")
        if self.model == "torchvision_densenet":
            if (self.impl, self.norm, self.preact) != (None, None, None):
                raise ValueError("impl, norm and preact do not apply to torchvision_densenet "
                                 "(torchvision's checkpointed BN-ReLU pre-activation model)")
        else:
            for name, default in (("impl", "shared"), ("norm", "bn"), ("preact", True)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
        if self.model in DEPTH_MODELS and self.growth_rate is None:
            object.__setattr__(self, "growth_rate", DEFAULT_CIFAR_GROWTH_RATE)

    @property
    def default_size(self):
        """The input's height and width by default: 32 (CIFAR) or 224 (ImageNet)."""
        return 32 if self.model in DEPTH_MODELS else 224

    def _options(self):
        options = {"num_classes": self.num_classes}
        if self.growth_rate is not None:
            options["growth_rate"] = self.growth_rate
        return {k: v for k, v in options.items() if v is not None}

    def build(self):
        """A new model (in training mode, on the CPU or the current default device)."""
        if self.model == "torchvision_densenet":
            return _torchvision_cifar_densenet(self.depth, **self._options())
        options = dict(impl=self.impl, norm=self.norm, preact=self.preact, **self._options())
        if self.model == "densenet_bc":
            return densenet.densenet_bc(self.depth, **options)
        return getattr(densenet, self.model)(**options)


#: The DenseNet-BC implementations the Fig. 4 and Fig. 5 experiments compare: this project's
#: three (``layers.densenet`` ``impl``) and torchvision's memory-efficient model.
IMPLEMENTATIONS = (*densenet.IMPLS, "torchvision")


def cifar_spec(implementation, depth, growth_rate=DEFAULT_CIFAR_GROWTH_RATE):
    """The :class:`ModelSpec` of DenseNet-BC-``depth`` (32x32 inputs) in ``implementation``
    (one of :data:`IMPLEMENTATIONS`: ``torchvision`` is ``torchvision_densenet``).

    The paper's networks (``nn.BatchNorm2d`` + ReLU), but ``shared_inplace``, which needs an
    in-place norm: InPlace-ABN (leaky ReLU), the same architecture and lower bound."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} must be one of {IMPLEMENTATIONS}")
    if implementation == "torchvision":
        return ModelSpec("torchvision_densenet", depth, growth_rate)
    norm = "iabn" if implementation in densenet.INPLACE_IMPLS else None
    return ModelSpec("densenet_bc", depth, growth_rate, impl=implementation, norm=norm)


def cifar_configuration(implementation, depth, growth_rate, batch, size):
    """``(spec, input_shape)`` of a DenseNet-BC point of the Fig. 4/5 experiments, checked.

    Raises ``ValueError`` naming the argument: an unknown implementation, a depth not of the
    form ``6n + 4``, or inputs too small for the network (two 2x2 poolings; training-mode batch
    norm needs more than one value per channel in the last block).
    """
    spec = cifar_spec(implementation, depth, growth_rate)
    _reference_model(spec)  # the model's own argument checks, on the meta device
    if batch < 1:
        raise ValueError(f"batch={batch!r} must be >= 1")
    last = size // 4  # the last block's maps, after two 2x2 average poolings
    if last < 1 or batch * last * last < 2:
        raise ValueError(f"size={size!r} with batch={batch!r}: the last dense block sees "
                         f"{last}x{last} maps; training-mode batch norm needs batch * "
                         "(size // 4)^2 >= 2 (e.g. size >= 8, or batch >= 2 with size >= 4)")
    return spec, (batch, 3, size, size)


def _torchvision_cifar_densenet(depth, growth_rate, num_classes=10):
    """torchvision's DenseNet (``memory_efficient=True``) with ``densenet_bc``'s 32x32 stem.

    Same layers, names and parameters as :func:`layers.densenet.densenet_bc`: the ImageNet
    stem's ``norm0``, ``relu0`` and ``pool0`` become identities and ``conv0`` a 3x3 one.
    """
    # Imported here: importing torchvision imports torch._dynamo, seconds of every process that
    # measures only this project's models, which do not need it.
    import torchvision

    reference = densenet.densenet_bc(depth, growth_rate, num_classes, impl="naive")
    n = len(reference.features.denseblock1)
    model = torchvision.models.DenseNet(growth_rate, (n, n, n), 2 * growth_rate, bn_size=4,
                                        num_classes=num_classes, memory_efficient=True)
    model.features.conv0 = nn.Conv2d(3, 2 * growth_rate, kernel_size=3, padding=1, bias=False)
    for name in ("norm0", "relu0", "pool0"):
        setattr(model.features, name, nn.Identity())
    model.load_state_dict(reference.state_dict())
    return model


# --------------------------------------------------------------------------- memory
def saved_tensor_bytes(model, x):
    """``(bytes, count)`` of the distinct storages autograd saves in one forward of ``model``
    (:func:`experiments.measure.saved_tensors.saved_storages`: parameters and buffers left out).

    Tensors saved inside a checkpointed region go to the checkpoint's own hooks, which drop
    them, so they are not counted: they are not kept.
    """
    records = saved_storage_records(model, x)
    return sum(nbytes for nbytes, _, _ in records), len(records)


def lower_bound_bytes(model, input_shape, dtype=torch.float32):
    """The bytes that must persist for backward of ``model``, from its architecture: the sum
    of :func:`lower_bound_parts`."""
    return sum(nbytes for _, _, nbytes in lower_bound_parts(model, input_shape, dtype))


def lower_bound_parts(model, input_shape, dtype=torch.float32):
    """What must persist for backward of ``model``, one ``(kind, shape, nbytes)`` per tensor:
    kind ``"feature_map"`` or ``"per_channel"``.

    Counted: the input (conv0's weight gradient reads it); the output of every ``nn.Conv2d``
    (the paper's "convolution feature maps": features, bottlenecks, transitions); the output
    of every pooling module (max/avg pool: the first features of a block); the input of every
    ``nn.Linear`` (its weight gradient reads it); and two per-channel vectors (batch mean and
    inverse standard deviation) per normalization channel. Not counted: concatenations and
    normalization/activation outputs, which can be recomputed from the above. Dropout masks are
    not counted (use ``drop_rate=0``).

    Shapes come from one forward of ``model``, moved to the meta device (no data, no memory),
    so ``model`` must run its convolutions as modules and on meta tensors: pass a ``naive``,
    ``norm="bn"`` DenseNet of the architecture, or torchvision's.
    """
    itemsize = dtype.itemsize
    parts = []

    def feature_map(shape):
        parts.append(("feature_map", tuple(shape), math.prod(shape) * itemsize))

    def count(module, inputs, output):
        if isinstance(module, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)):
            feature_map(output.shape)
        elif isinstance(module, nn.Linear):
            feature_map(inputs[0].shape)
        elif isinstance(module, NORM_TYPES):  # torch's BNs and the ABN layers
            channels = module.num_features
            parts.append(("per_channel", (2, channels), 2 * channels * itemsize))

    feature_map(input_shape)

    model = model.to(device="meta", dtype=dtype).train()
    handles = [m.register_forward_hook(count) for m in model.modules()]
    try:
        with torch.no_grad(), FastMeta():
            model(torch.empty(input_shape, device="meta", dtype=dtype))
    finally:
        for handle in handles:
            handle.remove()
    return parts


def excess_over_lower_bound(saved, bound, shared_bytes):
    """Where ``saved_bytes - lower_bound_bytes`` goes, field by field (bytes; they sum to it).

    ``saved``: :func:`~experiments.measure.saved_tensors.saved_storage_records` of one forward;
    ``bound``: :func:`lower_bound_parts` of the architecture; ``shared_bytes``: the shared
    storages. A saved storage shaped like one of the bound's feature maps is matched to it
    (each once); the others are the excess, by kind:

    * ``excess_shared_storage_bytes``: the shared storages;
    * ``excess_feature_map_bytes``: saved tensors of 3 or more dimensions the bound does not
      count (concatenations, normalized copies), and any matched storage larger than its map;
    * ``excess_per_channel_bytes``: saved tensors of 1 or 2 dimensions the bound does not
      count (per-channel states), less the bound's two vectors per normalization channel;
    * ``excess_not_saved_bytes`` (zero or negative): the bound's feature maps nothing saved
      (recomputed from others, or not needed).

    ``excess_tensors`` lists the unmatched saved tensors, grouped by shape (per-channel
    tensors by their leading dimension, ``(6, C)``) and dtype, largest first.
    """
    unmatched = Counter(shape for kind, shape, _ in bound if kind == "feature_map")
    map_bytes = {shape: nbytes for kind, shape, nbytes in bound if kind == "feature_map"}
    fields = dict.fromkeys(("excess_shared_storage_bytes", "excess_feature_map_bytes",
                            "excess_per_channel_bytes", "excess_not_saved_bytes"), 0)
    fields["excess_shared_storage_bytes"] = shared_bytes
    groups = {}
    for nbytes, shape, dtype in saved:
        if unmatched[shape] > 0:
            unmatched[shape] -= 1
            fields["excess_feature_map_bytes"] += nbytes - map_bytes[shape]
            continue
        per_channel = len(shape) <= 2
        fields["excess_per_channel_bytes" if per_channel else "excess_feature_map_bytes"] += nbytes
        label = str(shape[:1] + ("C",) if per_channel and len(shape) == 2 else
                    ("C",) if per_channel else shape).replace("'", "")
        group = groups.setdefault((label, str(dtype).removeprefix("torch.")), [0, 0])
        group[0] += 1
        group[1] += nbytes
    fields["excess_per_channel_bytes"] -= sum(n for kind, _, n in bound if kind == "per_channel")
    fields["excess_not_saved_bytes"] = -sum(map_bytes[shape] * count
                                            for shape, count in unmatched.items())
    fields["excess_tensors"] = [
        {"shape": label, "dtype": dtype, "count": count, "bytes": nbytes}
        for (label, dtype), (count, nbytes) in sorted(groups.items(), key=lambda g: -g[1][1])]
    return fields


def _reference_model(spec):
    """``spec``'s architecture as a naive BN DenseNet on the meta device (shapes only)."""
    model = "densenet_bc" if spec.model == "torchvision_densenet" else spec.model
    reference = dataclasses.replace(spec, model=model, impl="naive", norm="bn")
    with torch.device("meta"), FastMeta():
        return reference.build()


def architecture(spec, input_shape, dtype=torch.float32):
    """``{param_count, param_bytes, lower_bound_bytes}`` of ``spec`` on ``input_shape``, from
    the architecture alone (built on the meta device: no data, no memory), so they are known
    even for a configuration that does not fit the device."""
    reference = _reference_model(spec)
    params = list(reference.parameters())
    return {"param_count": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() for p in params) * dtype.itemsize,
            "lower_bound_bytes": lower_bound_bytes(reference, input_shape, dtype)}


# --------------------------------------------------------------------------- one configuration
class TrainingStep:
    """A model, a fixed input and output gradient, and one training step on them (what
    :func:`measure` times and measures; also timed side by side by the Fig. 5 experiment).
    Every step of the same architecture starts from the same weights (seeded), whatever the
    implementation."""

    def __init__(self, spec, input_shape, device, dtype):
        torch.manual_seed(SEED)
        self.model = spec.build().to(device=device, dtype=dtype).train()
        generator = torch.Generator().manual_seed(SEED)
        num_classes = self.model.classifier.out_features
        self.x = torch.randn(input_shape, generator=generator, dtype=dtype).to(device)
        self.grad = torch.randn((input_shape[0], num_classes), generator=generator,
                                dtype=dtype).to(device)

    def zero_grad(self):
        """Zero the parameter gradients in place (they stay allocated)."""
        self.model.zero_grad(set_to_none=False)

    def __call__(self, _=None, batch=None):
        """Forward + backward on the whole input, or on its first ``batch`` samples."""
        self.model(self.x[:batch]).backward(self.grad[:batch])


def _tracked_peak(step):
    """Peak tensor memory of one step above the tensor memory before it, and that memory
    (the model, its gradients, input and output gradient), from :class:`TensorMemoryTracker`:
    deterministic, on any device. Storages that exist before the step and that it only
    overwrites (the shared storages after warm-up) are in neither number."""
    step.zero_grad()
    tracker = training_state_tracker(step.model, [step.x, step.grad])
    baseline = tracker.total
    with tracker, tracker.saving():
        step()
    return {"peak_bytes": tracker.peak - baseline, "peak_baseline_bytes": baseline,
            "peak_method": "tensor_tracker"}


def _cuda_peak(step):
    """Peak CUDA memory of one step above the allocated memory before it, beside the tracked
    tensor peak of a second, identical step (``tensor_peak_bytes``) and their relative
    difference: what the caching allocator adds (rounding, workspaces inside operations)."""
    device = step.x.device
    step.zero_grad()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    tracked = _tracked_peak(step)["peak_bytes"]
    return {"peak_bytes": peak, "peak_baseline_bytes": baseline,
            "peak_method": "cuda_max_memory_allocated", "tensor_peak_bytes": tracked,
            "allocator_over_tensor_peak": peak / tracked - 1 if tracked else None}


def simulated_step_memory(spec, input_shape, dtype=torch.float32, momentum=0.9,
                          weight_decay=1e-4):
    """:class:`~experiments.measure.tensor_memory.StepMemory` of one training step of ``spec``
    on ``input_shape``, simulated on the meta device (no data, no compute, no memory): forward,
    cross-entropy, backward and an SGD step with momentum (the papers' CIFAR recipe keeps one
    momentum buffer per parameter), in the steady state (gradients and momentum allocated)."""
    with torch.device("meta"), FastMeta():
        model = spec.build().to(dtype=dtype).train()
        x = torch.empty(input_shape, dtype=dtype)
        target = torch.zeros(input_shape[0], dtype=torch.long)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum,
                                weight_decay=weight_decay)
    return step_memory(model, (x, target),
                       lambda m, inputs, labels: nn.functional.cross_entropy(m(inputs), labels),
                       optimizer)


def _dtype_name(dtype):
    return next(name for name, value in DTYPES.items() if value == dtype)


def _set_threads(threads):
    """numba's then torch's thread count (the order of :func:`experiments.records.point.setup`:
    launching numba's OpenMP pool resets the count torch's own operators use)."""
    if threads is not None:
        numba.set_num_threads(threads)
        torch.set_num_threads(threads)


def measure(spec, input_shape, device="cpu", dtype=torch.float32, warmup=1, repeats=5,
            peak=True, threads=None):
    """Measure one configuration; return the JSON-serialisable report (see the module doc).

    ``spec`` is a :class:`ModelSpec` (it builds the model, its reference architecture for the
    lower bound); ``input_shape`` is ``(N, 3, H, W)``;
    ``threads`` sets torch's and numba's thread counts (``None``: leave them). With
    ``peak=False`` the peak fields are ``None``.
    """
    device = torch.device(device)
    input_shape = tuple(input_shape)
    _set_threads(threads)
    step = TrainingStep(spec, input_shape, device, dtype)
    timing = time_callable(step, warmup, repeats, device, setup=step.zero_grad)
    records = saved_storage_records(step.model, step.x)
    saved = sum(nbytes for nbytes, _, _ in records)
    shared = (step.model.shared_storage_bytes()
              if isinstance(step.model, densenet.DenseNet) else 0)
    arch = architecture(spec, input_shape, dtype)
    lower_bound = arch["lower_bound_bytes"]
    excess = excess_over_lower_bound(
        records, lower_bound_parts(_reference_model(spec), input_shape, dtype), shared)
    peak_fields = {"peak_bytes": None, "peak_baseline_bytes": None, "peak_method": None}
    if peak:
        peak_fields = _cuda_peak(step) if device.type == "cuda" else _tracked_peak(step)
    return {
        "model": dataclasses.asdict(spec),
        "input_shape": list(input_shape),
        "dtype": _dtype_name(dtype),
        "device": device.type,
        "warmup": warmup,
        "param_count": arch["param_count"],
        "param_bytes": arch["param_bytes"],
        "saved_tensor_bytes": saved,
        "saved_tensor_count": len(records),
        "shared_storage_bytes": shared,
        "saved_bytes": saved + shared,
        "lower_bound_bytes": lower_bound,
        "saved_over_lower_bound": (saved + shared) / lower_bound,
        "saved_tensor_over_lower_bound": saved / lower_bound,
        **excess,
        **peak_fields,
        "time": timing,
        "environment": describe_environment(device),
    }


# --------------------------------------------------------------------------- command line
def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.measure",
        description="Saved bytes, lower bound, peak memory and time of one training step.")
    parser.add_argument("--model", choices=MODELS, default="densenet_bc")
    parser.add_argument("--depth", type=int, default=None,
                        help="depth 6n+4 of densenet_bc / torchvision_densenet (e.g. 40, 100)")
    parser.add_argument("--growth-rate", type=int, default=None,
                        help="k (densenet_bc default 12, densenet264 default 32)")
    parser.add_argument("--impl", choices=densenet.IMPLS, default=None,
                        help="DenseNet implementation (default: shared)")
    parser.add_argument("--norm", choices=densenet.NORMS, default=None,
                        help="normalization (default: bn)")
    parser.add_argument("--postact", action="store_true",
                        help="post-activation layers (default: pre-activation)")
    parser.add_argument("--num-classes", type=int, default=None)
    parser.add_argument("--batch", type=int, default=64, help="batch size (default: 64)")
    parser.add_argument("--size", type=int, default=None,
                        help="input height and width (default: 32 CIFAR, 224 ImageNet)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:<index>")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps (default: 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps (default: 5)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for torch and numba (default: leave as configured)")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip the peak-memory measurement")
    parser.add_argument("--simulate", action="store_true",
                        help="simulate one training step (with an SGD step) on the meta device "
                             "and report its tensor memory by kind: no compute, no memory, any "
                             "size (not counted: " + tensor_memory.NOT_COUNTED + ")")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    try:
        args.spec = ModelSpec(args.model, args.depth, args.growth_rate, args.impl, args.norm,
                              False if args.postact else None, args.num_classes)
        _reference_model(args.spec)  # the model's own argument checks, on the meta device
    except ValueError as error:
        parser.error(str(error))
    for name, value, minimum in (("--batch", args.batch, 1), ("--size", args.size, 1),
                                 ("--warmup", args.warmup, 0), ("--repeats", args.repeats, 1),
                                 ("--threads", args.threads, 1)):
        if value is not None and value < minimum:
            parser.error(f"{name} {value}: must be >= {minimum}")
    if args.threads is not None and args.threads > numba.config.NUMBA_NUM_THREADS:
        parser.error(f"--threads {args.threads}: numba can use at most "
                     f"{numba.config.NUMBA_NUM_THREADS} threads here (NUMBA_NUM_THREADS)")
    if args.size is None:
        args.size = args.spec.default_size
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available; use --device cpu")
    if args.json is not None and args.json.is_dir():
        parser.error(f"--json {args.json}: is a directory, expected a file path")
    args.input_shape = (args.batch, 3, args.size, args.size)
    return args


def format_summary(report):
    """A few human-readable lines."""
    t = report["time"]
    peak = report["peak_bytes"]
    model = " ".join(f"{k}={v}" for k, v in report["model"].items() if v is not None)

    def mib(key):
        return f"{report[key] / 2 ** 20:.2f}"

    return "\n".join([
        f"{model}, input {'x'.join(map(str, report['input_shape']))} "
        f"{report['dtype']} on {report['device']}: {report['param_count']:,} parameters",
        f"saved {mib('saved_bytes')} MiB (tensors {mib('saved_tensor_bytes')} + shared "
        f"storages {mib('shared_storage_bytes')}), lower bound {mib('lower_bound_bytes')} MiB, "
        f"ratio {report['saved_over_lower_bound']:.3f}",
        "peak: not measured" if peak is None else
        f"peak {mib('peak_bytes')} MiB above baseline ({report['peak_method']})",
        f"time per step: median {t['median_s'] * 1e3:.1f} ms (min {t['min_s'] * 1e3:.1f}, "
        f"max {t['max_s'] * 1e3:.1f}, {t['repeats']} repeats)",
    ])


def format_simulated(report, memory):
    """The simulated step's peak and its split by kind, in GiB."""
    model = " ".join(f"{k}={v}" for k, v in report["model"].items() if v is not None)
    kinds = ", ".join(f"{kind} {value / 2 ** 30:.3f}" for kind, value in
                      memory.peak_by_kind.items())
    return (f"{model}, input {'x'.join(map(str, report['input_shape']))} {report['dtype']}: "
            f"simulated peak tensor memory of a training step {memory.peak_bytes / 2 ** 30:.3f} "
            f"GiB ({kinds}); {tensor_memory.NOT_COUNTED}")


def main(argv=None):
    args = parse_args(argv)
    dtype = DTYPES[args.dtype]
    if args.simulate:
        memory = simulated_step_memory(args.spec, args.input_shape, dtype)
        report = {"model": dataclasses.asdict(args.spec), "input_shape": list(args.input_shape),
                  "dtype": args.dtype, **memory.record()}
        print(format_simulated(report, memory))
        if args.json is not None:
            print(f"wrote {write_json_atomic(args.json, report)}")
        return report
    report = measure(args.spec, args.input_shape, args.device, dtype, args.warmup, args.repeats,
                     peak=not args.no_peak, threads=args.threads)
    print(format_summary(report))
    if args.json is not None:
        print(f"wrote {write_json_atomic(args.json, report)}")
    return report
