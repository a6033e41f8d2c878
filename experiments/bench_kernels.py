"""Micro-benchmark of the InPlace-ABN kernels against PyTorch's BN + leaky ReLU and a copy.

Run as ``python -m experiments.bench_kernels [--shapes N C H W [N C H W ...]]
[--dtypes DTYPE ...] [--threads T] [--repeats R] [--warmup W] [--device cpu|cuda] [--run RUN]
[--out PATH]``; the default shapes are the table's, a sweep of the small one over the
batch size and a sweep of a tiny one, within which the composite overtakes the layer
(:data:`SHAPES`).

One row per shape of ``--shapes`` and dtype of ``--dtypes`` (float32, float64, float16,
bfloat16). A row's contenders are timed interleaved
(:func:`experiments.measure.timing.time_interleaved`: ``--warmup`` untimed rounds, then
``--repeats`` timed ones, each round runs every contender once in a freshly shuffled order),
so load that drifts on a noisy machine reaches them all alike; each gets the
median/min/max of its runs. Inputs are prepared outside the timed region. In a 16-bit row the
data is 16-bit and the parameters and running statistics float32, as under ``torch.autocast``,
for the layer and the composite alike. The contenders (:class:`Contenders`):

* ``inplace_abn_fwd_bwd_I`` / ``inplace_abn_fwd_bwd_II``: ``InPlaceABN`` (training mode,
  leaky ReLU 0.01) forward + backward. The input is a fresh non-leaf copy of a fixed one for
  every run (:class:`Refill`), as an in-place layer needs, and the incoming gradient a fresh
  copy of a fixed one that the backward receives as in a network, from the next layer's
  backward, which holds it no longer (:class:`HandOver`), so both contenders see what a
  network hands them (the layer never writes over it: a hook may keep it);
* ``composite_fwd_bwd``: ``F.batch_norm(training=True)`` + ``F.leaky_relu(0.01)`` forward +
  backward through autograd, on the same kind of input and gradient;
* ``aten_inplace_fwd_bwd``: the same in-place layer written with ATen operators
  (:class:`AtenInPlaceBatchNormAct`), forward + backward on the same kind of input and
  gradient: the path small tensors would be dispatched to if it beat the composite;
* ``inplace_abn_fwd_I``: the ``InPlaceABN`` forward alone, under ``torch.no_grad()`` in
  training mode (batch statistics), on a buffer refilled from the source before every run;
* ``copy``: ``dst.copy_(src)`` of one tensor of the same shape (one read and one write), the
  unit of memory traffic;
* ``whole_steps_fwd_bwd``: the layer's two whole-step operators alone
  (``layers.ops.forward_step_`` and ``backward_step_``, as InPlace-ABN II calls them) in an
  in-place autograd function that does nothing else (:class:`WholeStepsBatchNormAct`), on the
  same kind of input and gradient: the layer without its Python around the operators (argument
  checks, the module, the functional's dispatch), which bounds what trimming that Python could
  gain. The operators keep theirs (the eager call of :class:`layers.ops.KernelOperator`, the
  backend's choice of path and its arguments for the compiled kernels): this is no floor of the
  kernels themselves;
* ``python_function_floor``: forward + backward of an in-place autograd function that does
  nothing (:class:`InPlaceIdentity`), on the same input and gradient as the layer: the fixed
  cost that any layer written as a Python autograd function pays on top of its kernels (the
  composite's backward runs in C++ autograd nodes), which bounds how small a tensor the layer
  can beat the composite on;

and, in the same rounds, the kernel passes of the per-pass profile (:data:`PASSES`): the custom
operators of :mod:`layers.ops` alone, on the canonical ``(N, C, H*W)`` views of tensors of the
row's shape, as the layer calls them (directly in eager mode, see
:class:`layers.ops.KernelOperator`; the backward ones as variant II does).

A row of the artifact: ``shape``, ``dtype``, ``tensor_bytes``;
``results`` (contender -> ``median_s``, ``min_s``, ``max_s``, ``repeats``; the copy also
``effective_bandwidth_GBps``, 2 * tensor bytes / median);
``ratios``, from the medians:

* ``speedup_vs_composite``: composite / ``InPlaceABN`` II forward + backward
  (``speedup_vs_composite_I``: the same for variant I);
* ``fwd_bwd_over_traffic_floor``: ``InPlaceABN`` II forward + backward / (3.5 x copy). The
  floor, :data:`TRAFFIC_FLOOR_COPIES` copies of the tensor, is the memory traffic the pair
  cannot avoid: the forward reads and writes the tensor once (1 copy); the backward reduces over
  the output and the incoming gradient (1 copy), then reads both again and writes the outgoing
  gradient (1.5 copies);
* ``forward_over_copy``: ``InPlaceABN`` forward / copy;
* ``python_floor_over_composite``: ``python_function_floor`` / composite forward + backward
  (from 1 up, no Python autograd function can be as fast as the composite);
* ``aten_inplace_over_composite``: ``aten_inplace_fwd_bwd`` / composite forward + backward
  (above 1, the ATen path is no faster path for the sizes where the composite beats the
  layer);
* ``whole_steps_over_composite``: ``whole_steps_fwd_bwd`` / composite forward + backward
  (above 1, the layer's whole-step operators in an autograd function are slower than the
  composite: no trimming of the Python around the operators makes the layer as fast, only
  trimming the operators' own);

``goals`` (ratio -> ``value``, ``comparison`` (``>=`` or ``<=``), ``threshold``, ``met``): the
speed goals of the row's shape (:data:`SHAPE_GOALS`); ``profile`` (pass -> ``operator``, its
times as in ``results``, ``floor_copies`` (the traffic the pass cannot avoid, in copies),
``over_copy`` (median / copy median) and ``over_floor`` (``over_copy`` / ``floor_copies``)).

Writes one JSON file (atomically) with ``benchmark``, ``run``, ``config``, ``threads``,
``machine`` (the device's name), ``rows`` and ``environment``
(:func:`experiments.records.environment.describe_environment`). Like every artifact it belongs
to a run, ``<profile>-<device>`` (:mod:`experiments.records.paths`): the pipeline passes its
run, by hand it is ``manual-<device>``; default path ``artifacts/bench_kernels/<run>.json``.
The notebook ``figures/bench_kernels.ipynb`` plots it, and the claims report lists its goals.
"""
import argparse
import sys
from pathlib import Path

import numba
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from tqdm import tqdm

from layers import InPlaceABN, ops
from layers.kernels import common, per_channel
from layers.kernels.codecs import compute_dtype

from .records import paths
from .records.atomic import write_json_atomic
from .records.environment import describe_environment
from .measure.timing import time_interleaved

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
ACTIVATION = "leaky_relu"
SLOPE = 0.01
MOMENTUM = 0.1
EPS = 1e-5
SEED = 0

#: ResNeXt-101's four stages at batch 32, and a small shape.
STAGE_SHAPES = ((32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7))
SMALL_SHAPE = (8, 64, 28, 28)
#: The small shape's channels and maps at other batch sizes: with it, a sweep over the tensor's
#: size that locates the crossover below which the composite is faster (the fixed cost of a
#: call, in Python and in launching numba's threads, outweighs the memory traffic saved; see
#: :func:`experiments.report.bench_kernels.crossover`).
SWEEP_SHAPES = ((2, 64, 28, 28), (4, 64, 28, 28), (16, 64, 28, 28), (32, 64, 28, 28),
                (64, 64, 28, 28))
#: A second sweep, on tensors small enough that the crossover falls within it (on a CPU; the
#: first sweep's smallest shape is already past it there): the 48 channels of DenseNet-BC's
#: (k = 12) bottleneck output on CIFAR's 8x8 maps, at batch 2 to 128.
TINY_SWEEP_SHAPES = ((2, 48, 8, 8), (8, 48, 8, 8), (32, 48, 8, 8), (128, 48, 8, 8))
SHAPES = STAGE_SHAPES + (SMALL_SHAPE,) + SWEEP_SHAPES + TINY_SWEEP_SHAPES
#: The goals per shape, ratio -> (comparison, threshold). At the first stage shape all three
#: ratios have one; at the other stage shapes and the small one the speedup only (there the
#: floor and copy ratios measure the fixed cost of a call more than memory traffic). Any other
#: shape: :data:`DEFAULT_GOALS`, no slower than the composite.
SHAPE_GOALS = {
    STAGE_SHAPES[0]: {"speedup_vs_composite": (">=", 4.0),
                      "fwd_bwd_over_traffic_floor": ("<=", 1.5),
                      "forward_over_copy": ("<=", 1.1)},
    **{shape: {"speedup_vs_composite": (">=", 2.0)} for shape in STAGE_SHAPES[1:]},
    SMALL_SHAPE: {"speedup_vs_composite": (">=", 1.0)},
}
DEFAULT_GOALS = {"speedup_vs_composite": (">=", 1.0)}
#: Copies of the tensor an in-place forward + backward must move at least (module docstring).
TRAFFIC_FLOOR_COPIES = 3.5
#: The passes of the per-pass profile: name -> (operator of :mod:`layers.ops`, the copies of
#: the tensor it must move at least: reading one tensor is half a copy, writing one the other
#: half). ``forward_step`` is what the layer's training forward calls in eager mode: the whole
#: step (the per-channel scale, the statistics and output, the batch and running statistics,
#: in one call), so the layer's forward over it is the Python around the kernels;
#: ``training_forward`` is the step's pass over the tensor alone (statistics and output), and
#: ``statistics`` and ``normalize_act`` are that pass's two steps as separate passes.
PASSES = {
    "forward_step": ("layers::forward_step_", 1.0),
    "statistics": ("layers::moments", 0.5),
    "normalize_act": ("layers::scale_shift_act_", 1.0),
    "training_forward": ("layers::moments_normalize_act_", 1.0),
    "backward_reduce": ("layers::backward_reduce", 1.0),
    "backward_input": ("layers::backward_input", 1.5),
    "backward_input_in_place": ("layers::backward_input_", 1.5),
}


# --------------------------------------------------------------------------- arguments
def _shapes(parser, sizes):
    """The ``--shapes`` sizes as a list of ``(N, C, H, W)`` tuples, checked."""
    if len(sizes) % 4:
        parser.error(f"--shapes {' '.join(map(str, sizes))}: expected groups of four sizes "
                     f"N C H W, got {len(sizes)} numbers")
    shapes = [tuple(sizes[i:i + 4]) for i in range(0, len(sizes), 4)]
    for n, c, h, w in shapes:
        if min(n, c, h, w) < 1:
            parser.error(f"--shapes {n} {c} {h} {w}: every size must be >= 1")
        if n * h * w < 2:
            parser.error(f"--shapes {n} {c} {h} {w}: training-mode batch norm needs more than "
                         "one value per channel (N * H * W >= 2)")
    if len(set(shapes)) != len(shapes):
        parser.error(f"--shapes {' '.join(map(str, sizes))}: each shape once")
    return shapes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_kernels",
        description="Time InPlace-ABN forward/backward against BN + leaky ReLU and a copy.",
    )
    parser.add_argument("--shapes", type=int, nargs="+", metavar="N C H W",
                        default=[size for shape in SHAPES for size in shape],
                        help="input shapes, four sizes each (default: "
                             f"{', '.join(' '.join(map(str, s)) for s in SHAPES)})")
    parser.add_argument("--dtypes", choices=tuple(DTYPES), nargs="+", default=["float32"],
                        metavar="DTYPE",
                        help=f"one row per dtype, of {', '.join(DTYPES)} (default: float32)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for torch and numba (default: 2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds (default: 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default: 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--run", default=None,
                        help="the run, <profile>-<device> (default: manual-<device>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default: artifacts/bench_kernels/<run>.json)")
    args = parser.parse_args(argv)

    args.shapes = _shapes(parser, args.shapes)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    if args.threads > numba.config.NUMBA_NUM_THREADS:
        parser.error(f"--threads {args.threads}: numba can use at most "
                     f"{numba.config.NUMBA_NUM_THREADS} threads here (NUMBA_NUM_THREADS)")
    if len(set(args.dtypes)) != len(args.dtypes):
        parser.error(f"--dtypes {' '.join(args.dtypes)}: each dtype once")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup}: must be >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was requested, but no CUDA GPU is available "
                     "(torch.cuda.is_available() is False); use --device cpu")
    if args.run is None:
        args.run = paths.run_name("manual", args.device)
    profile, _, device = args.run.rpartition("-")
    try:
        if paths.run_name(profile, device) != args.run or device != args.device:
            raise ValueError
    except ValueError:
        parser.error(f"--run {args.run}: must be <profile>-{args.device} (the run of a profile "
                     f"on --device {args.device}), e.g. smoke-{args.device}")
    if args.out is None:
        args.out = Path(paths.bench_kernels_json(args.run))
    if args.out.exists() and args.out.is_dir():
        parser.error(f"--out {args.out}: is a directory, expected a file path")
    return args


# --------------------------------------------------------------------------- measurements
class _BatchNormParameters(torch.nn.Module):
    """A batch norm's weight (ones), bias (zeros) and running statistics, of ``channels``
    values with tensor ``options`` (dtype, device)."""

    def __init__(self, channels, options):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(channels, **options))
        self.bias = torch.nn.Parameter(torch.zeros(channels, **options))
        self.register_buffer("running_mean", torch.zeros(channels, **options))
        self.register_buffer("running_var", torch.ones(channels, **options))


class CompositeBatchNormAct(_BatchNormParameters):
    """``F.batch_norm`` (training) + ``F.leaky_relu``, the standard out-of-place pair."""

    def forward(self, x):
        y = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         training=True, momentum=MOMENTUM, eps=EPS)
        return F.leaky_relu(y, SLOPE)


class AtenInPlaceBatchNormAct(torch.autograd.Function):
    """InPlace-ABN II (leaky ReLU, ``|weight| + eps`` scale) written with ATen operators: the
    candidate path for small tensors, ATen's kernels on torch's threads in place of the numba
    kernels. It keeps the layer's contract: the output overwrites the input and only it (and
    per-channel vectors) is saved.

    Forward: ``native_batch_norm`` (statistics, running statistics and normalised values in
    one call), then ``leaky_relu`` written into the input, two operators as in the composite.
    Backward: ``dL/dy`` from the output, ``y`` by inverting the activation (a leaky ReLU of
    slope ``1 / slope``), the input rebuilt from ``y`` and the saved statistics, then
    ``native_batch_norm_backward``: four operators over the whole tensor where the
    composite's backward runs two.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var):
        gamma = per_channel.scale(weight, EPS, abs_mode=True)
        y, mean, invstd = torch.native_batch_norm(x, gamma, bias, running_mean, running_var,
                                                  True, MOMENTUM, EPS)
        torch.ops.aten.leaky_relu.out(y, SLOPE, out=x)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, weight, bias, gamma, mean, invstd)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, weight, bias, gamma, mean, invstd = ctx.saved_tensors
        dy = torch.ops.aten.leaky_relu_backward(grad, z, SLOPE, True)
        y = F.leaky_relu(z, 1.0 / SLOPE)
        scale = 1.0 / (gamma * invstd)  # x = (y - bias) / gamma / invstd + mean

        def channel(vector):
            return vector.to(z.dtype).view(-1, *(1,) * (z.dim() - 2))

        x = torch.addcmul(channel(mean - bias * scale), y, channel(scale))
        dx, dgamma, dbias = torch.ops.aten.native_batch_norm_backward(
            dy, x, gamma, None, None, mean, invstd, True, EPS, [True, True, True])
        # d gamma / d weight as one ATen operator (per_channel.scale_derivative, the same
        # values, would take four on tensors)
        return dx, dgamma * torch.sign(weight), dbias, None, None


class WholeStepsBatchNormAct(torch.autograd.Function):
    """InPlace-ABN II (leaky ReLU, ``|weight| + eps`` scale, training) as the layer's two
    whole-step operators and nothing else: the forward's ``ops.forward_step_`` on the input's
    ``(N, C, S)`` view, the backward's ``ops.backward_step_`` writing the input gradient over
    the incoming one (which the benchmark hands over, as the layer's owned-gradient path
    does). No argument is checked and no layout chosen: contiguous inputs of parameters of
    one float dtype only, as the benchmark's are."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var):
        state = ops.forward_step_(x.view(x.shape[0], x.shape[1], -1), weight, bias,
                                  running_mean, running_var, True, MOMENTUM, EPS,
                                  common.ACT_LEAKY_RELU, SLOPE, True)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, state)
        ctx.param_dtype = weight.dtype
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, state = ctx.saved_tensors
        n, c = z.shape[:2]
        dweight, dbias = ops.backward_step_(z.view(n, c, -1), grad.view(n, c, -1), None, state,
                                            common.ACT_LEAKY_RELU, SLOPE, common.MODE_Y, True,
                                            ctx.param_dtype, True, True)
        return grad, dweight, dbias, None, None


class WholeStepsABN(_BatchNormParameters):
    """:class:`WholeStepsBatchNormAct` as a module, timed like the layers."""

    def forward(self, x):
        return WholeStepsBatchNormAct.apply(x, self.weight, self.bias, self.running_mean,
                                            self.running_var)


class AtenInPlaceABN(_BatchNormParameters):
    """:class:`AtenInPlaceBatchNormAct` as a module, timed like the layers."""

    def forward(self, x):
        return AtenInPlaceBatchNormAct.apply(x, self.weight, self.bias, self.running_mean,
                                             self.running_var)


class HandOver(torch.autograd.Function):
    """The identity, whose backward passes on the gradient in ``box`` (a one-element list,
    emptied) instead of the one it receives. The layer before it then gets an incoming gradient
    that nothing else holds, as from the next layer's backward in a network; a gradient passed
    to ``out.backward(grad)`` stays the caller's and must not be overwritten."""

    @staticmethod
    def forward(ctx, x, box):
        ctx.box = box
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.box.pop(), None


class Refill(torch.autograd.Function):
    """``buffer`` refilled from ``source`` and returned as a new non-leaf input whose gradient
    reaches ``source``: what ``source.clone()`` gives an in-place layer (a leaf that requires
    grad is refused), in the memory of one buffer reused from run to run. A clone of a large
    tensor allocates fresh pages and faults each of them in: untimed, but on 2 cores it took a
    fifth of the benchmark's time."""

    @staticmethod
    def forward(ctx, source, buffer):
        buffer.copy_(source)
        ctx.mark_dirty(buffer)
        return buffer

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class InPlaceIdentity(torch.autograd.Function):
    """The least an in-place layer written as a Python autograd function does: it marks its
    input dirty, saves it and returns it; its backward returns the incoming gradient (and no
    parameter gradient)."""

    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        ctx.saved_tensors  # unpacked, as a layer's backward does (autograd checks versions)
        return grad


class PythonFunctionFloor(torch.nn.Module):
    """:class:`InPlaceIdentity` as a module (no parameters), timed like the layers."""

    def forward(self, x):
        return InPlaceIdentity.apply(x)


class Contenders:
    """The timed operations on one input ``src`` and incoming gradient ``grad``, for
    :func:`experiments.measure.timing.time_interleaved`: this benchmark and the GPU self-check
    (:mod:`experiments.gpu_selfcheck.timing`) time the same ones.

    ``abn`` holds ``InPlaceABN`` variants ``"I"`` and ``"II"`` (training mode, leaky ReLU),
    ``composite`` the :class:`CompositeBatchNormAct`. Parameters and running statistics are in
    the kernels' compute dtype (float32 for 16-bit data, as under autocast).
    """

    def __init__(self, src, grad):
        channels = src.shape[1]
        options = dict(dtype=compute_dtype(src.dtype), device=src.device)
        self.abn = {variant: InPlaceABN(channels, activation=ACTIVATION, activation_param=SLOPE,
                                        momentum=MOMENTUM, eps=EPS, variant=variant,
                                        **options).train()
                    for variant in ("I", "II")}
        self.composite = CompositeBatchNormAct(channels, options)
        self.aten_inplace = AtenInPlaceABN(channels, options)
        self.whole_steps = WholeStepsABN(channels, options)
        self.floor = PythonFunctionFloor()
        self.src, self.grad = src, grad
        # Source of the fresh non-leaf inputs of the fwd+bwd runs (:class:`Refill`); they and
        # the in-place runs of :meth:`refill` reuse one buffer, refilled before every run.
        self._base = src.clone().requires_grad_(True)
        self._buffer = torch.empty_like(src)
        self._grad_buffer = torch.empty_like(grad)
        self._dst = torch.empty_like(src)

    def fresh_input(self, module):
        """A setup: gradients cleared; returns a new non-leaf copy of the input
        (:class:`Refill`) and a copy of the incoming gradient that nothing else holds, in a box
        for :class:`HandOver`. The copy is written into the previous run's input gradient,
        taken from the source (the memory of a tensor of the input's shape, reused as the
        input's is, instead of a new one per run)."""
        def setup():
            grad = self._base.grad
            self._base.grad = None
            module.zero_grad(set_to_none=True)
            grad = torch.empty_like(self.grad) if grad is None else grad
            # detached: the buffer's history from the previous run stays out of this one
            return Refill.apply(self._base, self._buffer.detach()), [grad.copy_(self.grad)]
        return setup

    def backward(self, out, box):
        """The backward of ``out`` given the gradient in ``box``, handed over (:class:`HandOver`)."""
        HandOver.apply(out, box).backward(self.grad)

    def fwd_bwd(self, module):
        """A timed run: ``module``'s forward and backward (on a :meth:`fresh_input`)."""
        def run(inputs):
            x, box = inputs
            self.backward(module(x), box)
        return run

    def refill(self):
        """The setup of :meth:`forward`: one buffer refilled from the input (untimed)."""
        self._buffer.copy_(self.src)
        return self._buffer

    def forward(self, x):
        """The ``InPlaceABN`` training forward alone, in place on ``x``."""
        with torch.no_grad():
            self.abn["I"](x)

    def copy(self):
        """``dst.copy_(src)``: one read and one write of the tensor, the memory floor."""
        self._dst.copy_(self.src)

    def passes(self):
        """``(fns, setups)`` of the :data:`PASSES`: each operator alone on the canonical
        ``(N, C, H*W)`` views of the (contiguous) input (``z`` of the backward ones) and of the gradient;
        the in-place ones on the buffer of :meth:`refill`. The per-channel vectors hold
        neutral values (scale 1, shift 0): the passes' work does not depend on them."""
        n, c = self.src.shape[:2]

        def view(t):
            return t.view(n, c, -1)

        z, dz = view(self.src), view(self.grad)
        act = common.ACT_LEAKY_RELU
        ones = torch.ones(c, dtype=compute_dtype(self.src.dtype), device=self.src.device)
        zeros = torch.zeros_like(ones)
        gamma, beta = ones.double(), zeros.double()  # the fused forward's are float64
        coef = torch.stack([ones, zeros, zeros])  # dx = dy * k0 + v * k1 + k2
        running_mean, running_var = zeros.clone(), ones.clone()  # updated by each step
        fns = {
            "forward_step": lambda x: ops.forward_step_(x, ones, zeros, running_mean,
                                                        running_var, True, MOMENTUM, EPS, act,
                                                        SLOPE, True),
            "statistics": lambda: ops.moments(z),
            "normalize_act": lambda x: ops.scale_shift_act_(x, ones, zeros, act, SLOPE),
            "training_forward": lambda x: ops.moments_normalize_act_(x, gamma, beta, EPS, act,
                                                                     SLOPE),
            "backward_reduce": lambda: ops.backward_reduce(z, dz, None, ones, zeros, act, SLOPE,
                                                           common.MODE_Y),
            "backward_input": lambda: ops.backward_input(z, dz, None, ones, zeros, coef, act,
                                                         SLOPE, common.MODE_Y),
            "backward_input_in_place": lambda g: ops.backward_input_(z, g, None, ones, zeros,
                                                                     coef, act, SLOPE,
                                                                     common.MODE_Y),
        }
        setups = {name: lambda: view(self.refill())
                  for name in ("forward_step", "normalize_act", "training_forward")}
        setups["backward_input_in_place"] = lambda: view(self._grad_buffer.copy_(self.grad))
        return fns, setups


def _timed(shape, dtype, device):
    """``(fns, setups)`` for :func:`time_interleaved`: the contenders (module docstring) and
    the :data:`PASSES`, on shared tensors of ``shape`` and ``dtype``."""
    generator = torch.Generator().manual_seed(SEED)
    src = torch.randn(shape, generator=generator).to(dtype).to(device)
    grad = torch.randn(shape, generator=generator).to(dtype).to(device)
    c = Contenders(src, grad)
    fns = {"inplace_abn_fwd_bwd_I": c.fwd_bwd(c.abn["I"]),
           "inplace_abn_fwd_bwd_II": c.fwd_bwd(c.abn["II"]),
           "composite_fwd_bwd": c.fwd_bwd(c.composite),
           "aten_inplace_fwd_bwd": c.fwd_bwd(c.aten_inplace),
           "whole_steps_fwd_bwd": c.fwd_bwd(c.whole_steps),
           "inplace_abn_fwd_I": c.forward,
           "copy": c.copy,
           "python_function_floor": c.fwd_bwd(c.floor)}
    setups = {"inplace_abn_fwd_bwd_I": c.fresh_input(c.abn["I"]),
              "inplace_abn_fwd_bwd_II": c.fresh_input(c.abn["II"]),
              "composite_fwd_bwd": c.fresh_input(c.composite),
              "aten_inplace_fwd_bwd": c.fresh_input(c.aten_inplace),
              "whole_steps_fwd_bwd": c.fresh_input(c.whole_steps),
              "inplace_abn_fwd_I": c.refill,
              "python_function_floor": c.fresh_input(c.floor)}
    pass_fns, pass_setups = c.passes()
    return {**fns, **pass_fns}, {**setups, **pass_setups}


def ratios(results):
    """The ratios of one row (module docstring) from the contenders' medians."""
    median = {name: r["median_s"] for name, r in results.items()}
    return {
        "speedup_vs_composite": median["composite_fwd_bwd"] / median["inplace_abn_fwd_bwd_II"],
        "speedup_vs_composite_I": median["composite_fwd_bwd"] / median["inplace_abn_fwd_bwd_I"],
        "fwd_bwd_over_traffic_floor": (median["inplace_abn_fwd_bwd_II"]
                                       / (TRAFFIC_FLOOR_COPIES * median["copy"])),
        "forward_over_copy": median["inplace_abn_fwd_I"] / median["copy"],
        "python_floor_over_composite": (median["python_function_floor"]
                                        / median["composite_fwd_bwd"]),
        "aten_inplace_over_composite": (median["aten_inplace_fwd_bwd"]
                                        / median["composite_fwd_bwd"]),
        "whole_steps_over_composite": (median["whole_steps_fwd_bwd"]
                                       / median["composite_fwd_bwd"]),
    }


def goals(shape, row_ratios):
    """Each goal of a row of ``shape``: its ratio's value, comparison, threshold and whether
    it is met."""
    out = {}
    for name, (comparison, threshold) in SHAPE_GOALS.get(tuple(shape), DEFAULT_GOALS).items():
        value = row_ratios[name]
        met = value >= threshold if comparison == ">=" else value <= threshold
        out[name] = {"value": value, "comparison": comparison, "threshold": threshold,
                     "met": met}
    return out


def profile(timed, copy_s):
    """The per-pass profile: each pass of :data:`PASSES` with its times (``timed``) and its
    median over the copy's ``copy_s``, per copy and per the copies it cannot avoid."""
    out = {}
    for name, (operator, floor_copies) in PASSES.items():
        over_copy = timed[name]["median_s"] / copy_s
        out[name] = {"operator": operator, **timed[name], "floor_copies": floor_copies,
                     "over_copy": over_copy, "over_floor": over_copy / floor_copies}
    return out


def _row(shape, dtype, device, args):
    """The measurements, ratios, goals and profile of one shape and dtype."""
    fns, setups = _timed(shape, DTYPES[dtype], device)
    timed = time_interleaved(fns, args.warmup, args.repeats, device, setups=setups)
    results = {name: r for name, r in timed.items() if name not in PASSES}
    tensor_bytes = torch.Size(shape).numel() * DTYPES[dtype].itemsize
    copy_s = results["copy"]["median_s"]
    results["copy"]["effective_bandwidth_GBps"] = 2 * tensor_bytes / copy_s / 1e9
    row_ratios = ratios(results)
    return {"shape": list(shape), "dtype": dtype, "tensor_bytes": tensor_bytes,
            "results": results, "ratios": row_ratios, "goals": goals(shape, row_ratios),
            "profile": profile(timed, copy_s)}


def run_benchmark(args):
    """Run every measurement of every shape and dtype; return the JSON-serialisable report."""
    torch.set_num_threads(args.threads)  # the layers' numba loops follow torch's count
    torch.manual_seed(SEED)
    device = torch.device(args.device)
    points = [(shape, dtype) for shape in args.shapes for dtype in args.dtypes]
    rows = []
    for shape, dtype in tqdm(points, desc="bench_kernels", unit="row", file=sys.stderr):
        rows.append(_row(shape, dtype, device, args))
        if device.type == "cuda":
            torch.cuda.empty_cache()

    config = {
        "shapes": [list(shape) for shape in args.shapes],
        "dtypes": list(args.dtypes),
        "threads": args.threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "device": args.device,
        "activation": ACTIVATION,
        "activation_param": SLOPE,
        "momentum": MOMENTUM,
        "eps": EPS,
        "seed": SEED,
    }
    environment = describe_environment(device)
    return {
        "benchmark": "bench_kernels",
        "run": args.run,
        "config": config,
        "threads": args.threads,
        "machine": environment["device_name"],
        "rows": rows,
        "environment": environment,
    }


def format_summary(report):
    """A short human-readable table of the report, one block per shape and dtype."""
    config = report["config"]
    lines = [
        f"bench_kernels on {config['device']} ({report['machine']}), {report['threads']} "
        f"threads, {config['repeats']} interleaved rounds after {config['warmup']} warm-up",
    ]
    for row in report["rows"]:
        timings = {**row["results"], **row["profile"]}
        lines.append(f"{'x'.join(map(str, row['shape']))} {row['dtype']:<14}"
                     f"{'median ms':>12}{'min ms':>12}{'max ms':>12}")
        for name, r in timings.items():
            lines.append(f"  {name:<26}{r['median_s'] * 1e3:>12.3f}{r['min_s'] * 1e3:>12.3f}"
                         f"{r['max_s'] * 1e3:>12.3f}")
        lines.append(f"  copy effective bandwidth: "
                     f"{row['results']['copy']['effective_bandwidth_GBps']:.2f} GB/s")
        for name, goal in row["goals"].items():
            lines.append(f"  {name:<26}{goal['value']:>12.3f}  goal {goal['comparison']} "
                         f"{goal['threshold']:g}: {'met' if goal['met'] else 'NOT met'}")
        lines.append("  per pass, over copy: " + ", ".join(
            f"{name} {p['over_copy']:.2f} (floor {p['floor_copies']:g})"
            for name, p in row["profile"].items()))
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    report = run_benchmark(args)
    path = write_json_atomic(args.out, report)
    print(format_summary(report))
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
