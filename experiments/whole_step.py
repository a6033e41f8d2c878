"""Beyond the papers: InPlace-ABN's cost in a whole training step of a real network.

Both papers time single blocks (InPlace-ABN Table 1 right: one BN+ACT+CONV block; DenseNet
Fig. 5: one network's forward + backward); what a user feels is the training step of a whole
network, with every normalization layer, the layers between them and the optimizer. This
experiment times that step for the InPlace-ABN paper's networks with STD-BN and InPlace-ABN.

Run as ``python -m experiments.whole_step --network resnext101|wideresnet38|densenet264
[--width W] [--batch N] [--size S] [--classes K] [--modes eager [compile] [graphs]]
[--variants I II]
[--device cpu|cuda] [--threads T] [--warmup W] [--repeats R] --out PATH``. One point is one
network; its contenders (:func:`contenders`) are built, timed and measured in the one process:

* ResNeXt-101 (pre-activation blocks, the layout of the InPlace-ABN authors' release) and
  WideResNet-38, each with ``norm="bn"`` (PyTorch's batch norm + the activation in place,
  :class:`layers.residual.BatchNormAct2d`) and ``norm="iabn"`` with variant I and II;
* DenseNet-264 (``growth_rate = round(32 * width)``) with ``impl="shared"`` (Pleiss et al.'s
  shared storages) and ``norm`` ``bn``, ``iabn`` I and II, and ``impl="shared_inplace"`` (one
  storage, in place) with ``iabn`` I and II. ``shared_inplace``'s dense layers run variant II
  whatever the variant (:mod:`layers.shared_inplace`); its variant I contender differs in the
  stem's, transitions' and final norm only.

Every contender uses leaky ReLU (slope 0.01, the paper's), starts from the same weights (seeded)
and trains on the same random batch: ``zero_grad``, forward, cross-entropy, backward and an SGD
step (momentum 0.9, weight decay 1e-4), all inside the timed region. Per contender and mode
(``eager``; ``compile``: the model under ``torch.compile``, whose compilation falls in the
warm-up rounds; ``graphs``, CUDA only: the eager step captured in one CUDA graph and replayed,
:class:`GraphedStep`, the capture in the warm-up rounds) the record holds:

* ``median_s``/``min_s``/``max_s``: the step's time over ``--repeats`` rounds after ``--warmup``,
  every contender and mode once per round in a shuffled order
  (:func:`experiments.measure.timing.time_interleaved`), and ``time_vs_bn``: the median over
  the ``bn`` contender's median in the same mode;
* ``peak_bytes`` and ``activation_peak_bytes`` (eager): the step's peak tensor memory, all of it
  and above what the step starts with (parameters, gradients, momentum, batch), from
  :func:`experiments.measure.tensor_memory.step_memory`, and ``memory_saved_pct``: the
  activation peak saved against ``bn`` at the same batch; ``cuda_peak_bytes`` on CUDA (eager
  and compile): ``torch.cuda.max_memory_allocated`` over one step above the memory before it;
* the normalization layers (:func:`norm_fields`, four more eager steps; :class:`NormCalls`
  brackets every forward call of a normalization module and the backward nodes the call
  created): ``norm_calls`` (forward calls, out of ``norm_modules``), ``norm_s`` and
  ``norm_share`` (the time inside them, and its share of the step: host time on the CPU, from
  ``time.perf_counter`` around each call and node; kernel time under ``torch.profiler`` on
  CUDA), ``norm_host_us_per_call`` (host time per call, forward + backward), and from a step
  under ``torch.profiler`` ``norm_ops_per_call`` (ATen operators dispatched per call, none
  counted inside another) and, on CUDA, ``norm_launches_per_call`` (kernel launches, runtime
  or driver API) and ``norm_device_us_per_call``. The host times come from a step without the
  profiler, whose own cost per operator would inflate them. The memory-efficient DenseNet
  routes compute their norms without calling them as modules, and :mod:`layers.densenet` runs
  a step whose norms carry module hooks as the naive implementation (so that the hooks see
  every call): DenseNet's norm fields are those of the same network's naive step, every norm a
  module call, while its time and memory fields are the shared routes'.

The goals (:data:`CPU_GOAL` and :data:`GPU_GOAL`, this project's, not a paper's) are judged per
``iabn`` row: the CPU goal on every eager CPU row, the GPU goal on ResNeXt-101's eager and
graphed CUDA rows. ``goal_bound`` is the largest ``time_vs_bn`` that meets it, ``goal_met``
whether it holds (``None`` where no goal applies).
"""
import dataclasses
import sys
import time

import torch
import torch.nn.functional as F
from torch.autograd.profiler import record_function
from tqdm import tqdm

import layers
from layers import NORM_TYPES
from layers.residual import scaled

from .measure.tensor_memory import step_memory
from .measure.timing import time_interleaved
from .records import point

EXPERIMENT = "whole_step"
NETWORKS = ("resnext101", "wideresnet38", "densenet264")
#: network -> the implementations its contenders take (``None``: the network has one).
IMPLS = {"resnext101": (None,), "wideresnet38": (None,),
         "densenet264": ("shared", "shared_inplace")}
VARIANTS = ("I", "II")
MODES = ("eager", "compile", "graphs")
SLOPE = 0.01
#: DenseNet-264's growth rate at width 1 (Huang et al.'s k = 32, Pleiss et al.'s Fig. 6).
DENSENET_GROWTH_RATE = 32
MOMENTUM, WEIGHT_DECAY, LR = 0.9, 1e-4, 0.01

#: This project's goal for InPlace-ABN's whole step on the CPU (beyond the papers, which time
#: blocks only). ``max_time_vs_bn``: its step no slower than STD-BN's, since on the CPU the
#: layer alone is faster than PyTorch's composite, so a slower step means the network loses
#: what the layer gains. ``gain_fraction``: its step faster by at least this fraction of what
#: the layer's own speedup would save at STD-BN's norm share, both measured in the step
#: (``1 - share * (1 - iabn norm time / bn norm time)``), so that at least half the layer's
#: gain reaches the user.
CPU_GOAL = {"max_time_vs_bn": 1.0, "gain_fraction": 0.5}
#: This project's goal for InPlace-ABN's whole step on a GPU: ResNeXt-101's step at most the
#: paper's block overhead (+2%, Table 1 right) slower than STD-BN's where the step runs without
#: host work (``graphs``, a CUDA graph), and at most 5% slower eager, where each layer call's
#: host time still counts. Judged per ``iabn`` row of a CUDA run of that network.
GPU_GOAL = {"network": "resnext101", "max_time_vs_bn": {"graphs": 1.02, "eager": 1.05}}

#: Hooked steps per contender whose median norm time the norm fields give (:func:`norm_fields`).
NORM_STEPS = 3
NORM_RANGE = "whole_step::norm"
#: Profiler events of a kernel launch on the host (CUDA runtime and driver API).
LAUNCH_EVENTS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


@dataclasses.dataclass(frozen=True)
class Contender:
    """One network configuration of a point: ``impl`` (DenseNet only), ``norm``, ``variant``
    (InPlace-ABN only)."""

    network: str
    impl: str
    norm: str
    variant: str

    @property
    def name(self):
        """``bn``, ``iabn_II``; DenseNet's prefixed with its impl: ``shared_inplace_iabn_I``."""
        name = self.norm if self.variant is None else f"{self.norm}_{self.variant}"
        return name if self.impl is None else f"{self.impl}_{name}"

    def build(self, width, classes):
        """The model (training mode, CPU), its InPlace-ABN layers set to :attr:`variant`."""
        activation = {"activation": "leaky_relu", "activation_param": SLOPE}
        if self.network == "resnext101":
            model = layers.resnext101(classes, width, norm=self.norm, preact=True, **activation)
        elif self.network == "wideresnet38":
            model = layers.wideresnet38(classes, width, norm=self.norm, **activation)
        else:
            model = layers.densenet264(scaled("width", DENSENET_GROWTH_RATE, width),
                                       num_classes=classes, impl=self.impl, norm=self.norm,
                                       **activation)
        for module in model.modules():
            if isinstance(module, layers.InPlaceABN):
                module.variant = self.variant
        return model.train()


def contenders(network, variants=VARIANTS):
    """The :class:`Contender` list of ``network``: ``bn`` first (the baseline), then ``iabn``
    per variant, per implementation (``shared_inplace`` takes no ``bn``)."""
    if network not in IMPLS:
        raise ValueError(f"network={network!r} must be one of {NETWORKS}")
    out = []
    for impl in IMPLS[network]:
        if impl != "shared_inplace":
            out.append(Contender(network, impl, "bn", None))
        out += [Contender(network, impl, "iabn", v) for v in variants]
    return out


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """A model, its SGD optimizer, one batch, and the training step on them (callable);
    ``forward`` is the model itself or the model under ``torch.compile``."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    target: torch.Tensor
    forward: object

    @classmethod
    def build(cls, contender, width, classes, shape, device, dtype):
        """The eager step of ``contender`` on a seeded batch of ``shape``."""
        torch.manual_seed(point.SEED)  # every contender starts from the same weights
        model = contender.build(width, classes).to(device=device, dtype=dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM,
                                    weight_decay=WEIGHT_DECAY)
        generator = torch.Generator().manual_seed(point.SEED)
        x = torch.randn(shape, generator=generator, dtype=dtype).to(device)
        target = torch.randint(classes, (shape[0],), generator=generator).to(device)
        return cls(model, optimizer, x, target, model)

    def compiled(self):
        """The same model, optimizer and batch, the forward through ``torch.compile``."""
        return dataclasses.replace(self, forward=torch.compile(self.model))

    def graphed(self):
        """The same step captured in one CUDA graph (:class:`GraphedStep`)."""
        return GraphedStep(self)

    def in_mode(self, mode):
        """This step as run in ``mode`` (:data:`MODES`)."""
        return {"eager": lambda: self, "compile": self.compiled, "graphs": self.graphed}[mode]()

    @staticmethod
    def loss(forward, x, target):
        return F.cross_entropy(forward(x), target)

    def __call__(self):
        self.optimizer.zero_grad(set_to_none=False)
        self.loss(self.forward, self.x, self.target).backward()
        self.optimizer.step()


class GraphedStep:
    """A :class:`TrainingStep` captured in one CUDA graph (``torch.cuda.CUDAGraph``) on its
    first call and replayed on every call: forward, loss, backward and the SGD step, with no
    host work per layer at all. The capture follows PyTorch's whole-network recipe: a few eager
    steps on a side stream first (numba compiles or loads the kernels, cuDNN picks its
    algorithms, and every allocation the step makes is made once), the gradients set to
    ``None`` so the graph allocates them in its own pool, then the capture. Its batch and
    parameters are the eager step's tensors, read in place by every replay; the first call
    (capture and one replay) belongs in the warm-up rounds."""

    #: Eager steps on the side stream before the capture (PyTorch's recipe uses a few).
    WARMUP_STEPS = 3

    def __init__(self, step):
        if step.x.device.type != "cuda":
            raise ValueError(f"graphs mode needs a CUDA device, got {step.x.device}")
        self.step = step
        self.graph = None

    def _capture(self):
        step = self.step
        side = torch.cuda.Stream(step.x.device)
        side.wait_stream(torch.cuda.current_stream(step.x.device))
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                step()
        torch.cuda.current_stream(step.x.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        step.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            step.loss(step.forward, step.x, step.target).backward()
            step.optimizer.step()

    def __call__(self):
        if self.graph is None:
            self._capture()
        self.graph.replay()


# --------------------------------------------------------------------------- profiler
class NormCalls:
    """While entered, every forward call of a normalization module of ``model`` runs between
    ``enter()`` and ``leave(token)`` (``token``: what ``enter`` returned), and so does every
    backward node the call created (the nodes between its output's ``grad_fn`` and its
    input's, found when the call returns; their hooks go with the graph). ``calls`` counts the
    forward calls. :meth:`clock` times the calls, :meth:`ranges` marks them for the profiler."""

    def __init__(self, model, enter, leave):
        self.modules = [m for m in model.modules() if isinstance(m, NORM_TYPES)]
        self.enter, self.leave = enter, leave
        self.calls = 0
        self._handles = []
        self._open = []

    @classmethod
    def clock(cls, model):
        """Calls whose host seconds add up in ``seconds`` (``time.perf_counter``)."""
        calls = cls(model, time.perf_counter, lambda start: calls._add_since(start))
        calls.seconds = 0.0
        return calls

    def _add_since(self, start):
        self.seconds += time.perf_counter() - start

    @classmethod
    def ranges(cls, model):
        """Calls inside profiler ranges named :data:`NORM_RANGE`."""
        return cls(model, lambda: record_function(NORM_RANGE).__enter__(),
                   lambda opened: opened.__exit__(None, None, None))

    def __enter__(self):
        for module in self.modules:
            self._handles += [module.register_forward_pre_hook(self._before),
                              module.register_forward_hook(self._after)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before(self, module, args):
        self._open.append((args[0].grad_fn, self.enter()))

    def _after(self, module, args, output):
        boundary, token = self._open.pop()
        self.leave(token)
        self.calls += 1
        for node in nodes_between(output.grad_fn, boundary):
            self._around(node)

    def _around(self, node):
        """Run ``node``'s backward between ``enter`` and ``leave``."""
        tokens = []

        def enter(grad_outputs):
            tokens.append(self.enter())

        def leave(grad_inputs, grad_outputs):
            self.leave(tokens.pop())

        node.register_prehook(enter)
        node.register_hook(leave)


def nodes_between(start, boundary):
    """The autograd nodes reachable from ``start`` without passing ``boundary`` (the input's
    ``grad_fn``), leaving out the parameters' ``AccumulateGrad`` nodes."""
    seen, stack, found = set(), [start], []
    while stack:
        node = stack.pop()
        if node is None or node is boundary or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "AccumulateGrad":
            continue
        found.append(node)
        stack += [child for child, _ in node.next_functions]
    return found


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _operators(event):
    """ATen operators dispatched inside ``event``, counting none inside another."""
    return sum(1 if child.name.startswith("aten::") else _operators(child)
               for child in event.cpu_children)


def _kernel_us(events):
    return sum(k.duration for e in events for k in e.kernels)


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hooked_step(step, device):
    """``(norm seconds, step seconds, norm calls, norm modules)`` of one run of ``step`` with
    its norm calls timed on the host (:meth:`NormCalls.clock`)."""
    clock = NormCalls.clock(step.model)
    _synchronize(device)
    start = time.perf_counter()
    with clock:
        step()
    _synchronize(device)
    return clock.seconds, time.perf_counter() - start, clock.calls, len(clock.modules)


def norm_fields(step, device):
    """The norm fields of the eager ``step`` (see the module doc): :data:`NORM_STEPS` steps
    with their norm calls timed on the host, of which the one of median norm time gives the
    fields (one step's time is as noisy as one timed step, and the goal compares two
    contenders' norm times), and one under ``torch.profiler`` for the operators, launches and
    kernel times (the profiler's own cost per operator would inflate the host times)."""
    samples = sorted(_hooked_step(step, device) for _ in range(NORM_STEPS))
    norm_s, step_s, calls, modules = samples[len(samples) // 2]
    fields = {"norm_modules": modules, "norm_calls": calls, "hooked_step_s": step_s,
              "norm_s": norm_s, "norm_share": norm_s / step_s,
              "norm_host_us_per_call": 1e6 * norm_s / calls if calls else None}
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    ranges = NormCalls.ranges(step.model)
    with torch.profiler.profile(activities=activities) as profiler:
        with ranges:
            step()
        _synchronize(device)
    events = profiler.events()
    norms = [e for e in events if e.name == NORM_RANGE]
    inside = [d for e in norms for d in _descendants(e)]
    per_call = 1 / ranges.calls if ranges.calls else None
    fields["norm_ops_per_call"] = per_call and sum(_operators(e) for e in norms) * per_call
    fields["norm_launches_per_call"] = fields["norm_device_us_per_call"] = None
    if cuda:
        device_us = _kernel_us(inside)
        fields.update(norm_s=device_us / 1e6, norm_share=device_us / _kernel_us(events),
                      norm_launches_per_call=per_call and sum(
                          d.name in LAUNCH_EVENTS for d in inside) * per_call,
                      norm_device_us_per_call=per_call and device_us * per_call)
    return fields


# --------------------------------------------------------------------------- memory
def tensor_peak(step):
    """``peak_bytes`` and ``activation_peak_bytes`` of one eager step (tensor memory)."""
    memory = step_memory(step.model, (step.x, step.target),
                         lambda model, x, target: step.loss(model, x, target), step.optimizer)
    return {"peak_bytes": memory.peak_bytes,
            "activation_peak_bytes": memory.peak_bytes - memory.start_bytes}


def cuda_peak(step):
    """``torch.cuda.max_memory_allocated`` over one step, above the memory before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - baseline


# --------------------------------------------------------------------------- goal
def goal(bn, row):
    """``(goal_bound, goal_met)`` of an ``iabn`` record ``row`` against ``bn``'s record of the
    same mode, by :data:`CPU_GOAL` (the norm fields from the eager profile)."""
    layer_gain = bn["norm_share"] * (1 - row["norm_s"] / bn["norm_s"]) if bn["norm_s"] else 0.0
    bound = min(CPU_GOAL["max_time_vs_bn"], 1 - CPU_GOAL["gain_fraction"] * max(0.0, layer_gain))
    return bound, row["time_vs_bn"] <= bound


def gpu_goal(network, row):
    """``(goal_bound, goal_met)`` of an ``iabn`` record ``row`` of a CUDA run of ``network`` by
    :data:`GPU_GOAL`, ``(None, None)`` where it does not apply (another network or mode)."""
    bound = GPU_GOAL["max_time_vs_bn"].get(row["mode"])
    if network != GPU_GOAL["network"] or bound is None:
        return None, None
    return bound, row["time_vs_bn"] <= bound


def compare(records, device, network):
    """Add each record's ratios to the ``bn`` contender of its mode, and the goal of its
    device (:data:`CPU_GOAL` for eager CPU rows, :data:`GPU_GOAL` on CUDA)."""
    baseline = {r["mode"]: r for r in records if r["norm"] == "bn"}
    for r in records:
        bn = baseline[r["mode"]]
        r["time_vs_bn"] = r["median_s"] / bn["median_s"]
        r["memory_saved_pct"] = (None if r["activation_peak_bytes"] is None else
                                 100 * (1 - r["activation_peak_bytes"]
                                        / bn["activation_peak_bytes"]))
        r["goal_bound"] = r["goal_met"] = None
        if r["norm"] != "iabn":
            continue
        if device == "cpu" and r["mode"] == "eager":
            r["goal_bound"], r["goal_met"] = goal(bn, r)
        elif device == "cuda":
            r["goal_bound"], r["goal_met"] = gpu_goal(network, r)
    return records


# --------------------------------------------------------------------------- the point
def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Time, peak memory and normalization share of a whole "
                                 "training step, STD-BN vs InPlace-ABN (beyond the papers).")
    p.add_argument("--network", choices=NETWORKS, required=True)
    p.add_argument("--width", type=float, default=1.0,
                   help="channel scale (1: the paper's network; DenseNet: growth rate 32 x)")
    p.add_argument("--batch", type=int, default=32, help="minibatch size (default: 32)")
    p.add_argument("--size", type=int, default=224, help="input height and width (224)")
    p.add_argument("--classes", type=int, default=1000, help="classifier outputs (1000)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=["eager"],
                   help="eager, compile (torch.compile) and/or graphs (the eager step in one "
                        "CUDA graph; CUDA only); default: eager")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="InPlace-ABN variants (default: I II)")
    args = p.parse_args(argv)
    point.check(p, args, positive=("batch", "size", "classes"))
    if not args.width > 0:
        p.error(f"--width {args.width}: must be > 0")
    for name in ("modes", "variants"):
        values = getattr(args, name)
        if len(set(values)) != len(values):
            p.error(f"--{name} {' '.join(values)}: each at most once")
    if "eager" not in args.modes:
        p.error(f"--modes {' '.join(args.modes)}: eager is required (the memory and the "
                "profile are measured on it)")
    for mode, first_call in (("compile", "compiles"), ("graphs", "captures the graph")):
        if mode in args.modes and args.warmup < 1:
            p.error(f"--modes {mode} needs --warmup >= 1: the first call {first_call}")
    if "graphs" in args.modes and args.device != "cuda":
        p.error(f"--modes graphs needs --device cuda (a CUDA graph), got --device {args.device}")
    if args.batch < 2:
        p.error(f"--batch {args.batch}: training-mode batch norm needs >= 2 samples (the "
                "last feature map may be 1x1)")
    return args


def run(args):
    """Build every contender, time them interleaved, measure memory and the norm profile;
    return the artifact's ``(config, results)``."""
    device, dtype = point.setup(args)
    cuda = device.type == "cuda"
    shape = (args.batch, 3, args.size, args.size)
    eager = {c: TrainingStep.build(c, args.width, args.classes, shape, device, dtype)
             for c in contenders(args.network, args.variants)}
    steps = {(c, mode): step.in_mode(mode) for c, step in eager.items() for mode in args.modes}
    timing = time_interleaved(steps, args.warmup, args.repeats, device, seed=point.SEED)
    records = []
    for contender, step in tqdm(eager.items(), desc=f"{EXPERIMENT} {args.network}",
                                file=sys.stderr):
        # Memory and the profile of the eager step; the compiled and graphed rows share its
        # profile (the profiler's hooks would break the compiled graph; a CUDA graph runs no
        # hook) and have no tensor peak (the tracker is a dispatch mode, which neither runs
        # under). A CUDA graph's replay allocates nothing: its memory is its pool, allocated
        # at the capture, so its row has no CUDA peak either.
        measured = {**tensor_peak(step), **norm_fields(step, device)}
        for mode in args.modes:
            records.append({"contender": contender.name, "impl": contender.impl,
                            "norm": contender.norm, "variant": contender.variant,
                            "mode": mode, **timing[contender, mode],
                            **(measured if mode == "eager" else
                               {**measured, "peak_bytes": None, "activation_peak_bytes": None}),
                            "cuda_peak_bytes": cuda_peak(steps[contender, mode])
                            if cuda and mode != "graphs" else None})
    config = {"network": args.network, "width": args.width, "batch": args.batch,
              "size": args.size, "classes": args.classes, "modes": " ".join(args.modes),
              "activation": "leaky_relu", "activation_param": SLOPE, "optimizer": "sgd",
              "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
              "goal_max_time_vs_bn": CPU_GOAL["max_time_vs_bn"],
              "goal_gain_fraction": CPU_GOAL["gain_fraction"],
              "gpu_goal_max_time_vs_bn": " ".join(
                  f"{mode}={bound}" for mode, bound in GPU_GOAL["max_time_vs_bn"].items())}
    return config, compare(records, device.type, args.network)


def summarize(config, results):
    """One line per contender and mode: step time, its ratio to bn, memory, norm share."""
    lines = []
    for r in results:
        memory = ("" if r["memory_saved_pct"] is None else
                  f"  memory saved {r['memory_saved_pct']:+6.1f}%")
        goal_text = ("" if r["goal_met"] is None else
                     f"  goal {'met' if r['goal_met'] else 'NOT met'}")
        lines.append(f"{r['contender']:<24}{r['mode']:<8}{r['median_s'] * 1e3:10.1f} ms  "
                     f"x{r['time_vs_bn']:.3f} vs bn{memory}  norm share {r['norm_share']:.2f}, "
                     f"{r['norm_host_us_per_call'] or 0:.0f} us/call{goal_text}")
    return "\n".join(lines)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
