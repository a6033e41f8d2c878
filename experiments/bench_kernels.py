"""Micro-benchmark of the InPlace-ABN kernels against PyTorch's BN + leaky ReLU.

Run as ``python -m experiments.bench_kernels [--shape N C H W] [--dtypes DTYPE ...]
[--threads T] [--repeats R] [--warmup W] [--device cpu|cuda] [--run RUN] [--out PATH]``.

Measurements, one row per dtype of ``--dtypes`` (float32, float64, float16, bfloat16), each the
median/min/max of ``--repeats`` timed runs after ``--warmup`` untimed ones; inputs are prepared
outside the timed region. In a 16-bit row the data is 16-bit and the parameters and running
statistics float32, as under ``torch.autocast``, for the layer and the composite alike:

* ``inplace_abn_fwd_bwd_I`` / ``inplace_abn_fwd_bwd_II``: ``InPlaceABN`` (training mode,
  leaky ReLU 0.01) forward + backward with a fixed incoming gradient. The input is a fresh
  non-leaf ``base.clone()`` for every run, as an in-place layer needs;
* ``composite_fwd_bwd``: ``F.batch_norm(training=True)`` + ``F.leaky_relu(0.01)`` forward +
  backward through autograd, on the same kind of input and gradient;
* ``inplace_abn_fwd_I``: the ``InPlaceABN`` forward alone, under ``torch.no_grad()`` in
  training mode (batch statistics), on a buffer refilled from the source before every run;
* ``copy``: ``dst.copy_(src)`` of one tensor of the same shape, the memory-traffic floor.

Derived per row: ``speedup_vs_composite_I``/``_II`` (composite time / in-place time),
``forward_over_copy`` (in-place forward time / copy time) and, under ``results.copy``, the
copy's ``effective_bandwidth_GBps`` (2 * tensor bytes / time, one read and one write).

Writes one JSON file (atomically) with ``run``, ``config``, ``rows`` (``dtype``,
``tensor_bytes``, ``results``, ``ratios`` each) and ``environment``. Like every artifact it
belongs to a run, ``<profile>-<device>`` (:mod:`experiments.records.paths`): the pipeline passes
its run, by hand it is ``manual-<device>``; default path ``artifacts/bench_kernels/<run>.json``.
"""
import argparse
import sys
from pathlib import Path

import numba
import torch
import torch.nn.functional as F
from tqdm import tqdm

from layers import InPlaceABN
from layers.kernels.codecs import compute_dtype

from .records import paths
from .records.atomic import write_json_atomic
from .records.environment import describe_environment
from .measure.timing import time_callable

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
ACTIVATION = "leaky_relu"
SLOPE = 0.01
MOMENTUM = 0.1
EPS = 1e-5
SEED = 0


# --------------------------------------------------------------------------- arguments
def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.bench_kernels",
        description="Time InPlace-ABN forward/backward against BN + leaky ReLU and a copy.",
    )
    parser.add_argument("--shape", type=int, nargs=4, metavar=("N", "C", "H", "W"),
                        default=[32, 256, 56, 56], help="input shape (default: 32 256 56 56)")
    parser.add_argument("--dtypes", choices=tuple(DTYPES), nargs="+", default=["float32"],
                        metavar="DTYPE",
                        help=f"one row per dtype, of {', '.join(DTYPES)} (default: float32)")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for torch and numba (default: 2)")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs (default: 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--run", default=None,
                        help="the run, <profile>-<device> (default: manual-<device>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default: artifacts/bench_kernels/<run>.json)")
    args = parser.parse_args(argv)

    n, c, h, w = args.shape
    if min(args.shape) < 1:
        parser.error(f"--shape {n} {c} {h} {w}: every size must be >= 1")
    if n * h * w < 2:
        parser.error(f"--shape {n} {c} {h} {w}: training-mode batch norm needs more than one "
                     "value per channel (N * H * W >= 2)")
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
class CompositeBatchNormAct(torch.nn.Module):
    """``F.batch_norm`` (training) + ``F.leaky_relu``, the standard out-of-place pair."""

    def __init__(self, channels, options):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(channels, **options))
        self.bias = torch.nn.Parameter(torch.zeros(channels, **options))
        self.register_buffer("running_mean", torch.zeros(channels, **options))
        self.register_buffer("running_var", torch.ones(channels, **options))

    def forward(self, x):
        y = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         training=True, momentum=MOMENTUM, eps=EPS)
        return F.leaky_relu(y, SLOPE)


class Contenders:
    """The timed operations on one input ``src`` and incoming gradient ``grad``, for
    :func:`experiments.measure.timing.time_callable` and ``time_interleaved``: this benchmark
    and the GPU self-check (:mod:`experiments.gpu_selfcheck.timing`) time the same ones.

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
        self.src, self.grad = src, grad
        # Source of the fresh non-leaf inputs of the fwd+bwd runs: x = base.clone() is what an
        # in-place layer accepts (a leaf that requires grad is refused).
        self._base = src.clone().requires_grad_(True)
        self._buffer = torch.empty_like(src)
        self._dst = torch.empty_like(src)

    def fresh_input(self, module):
        """A setup: a new non-leaf copy of the input, gradients cleared."""
        def setup():
            self._base.grad = None
            module.zero_grad(set_to_none=True)
            return self._base.clone()
        return setup

    def fwd_bwd(self, module):
        """A timed run: ``module``'s forward and backward with the incoming gradient."""
        def run(x):
            module(x).backward(self.grad)
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


def _measurements(shape, dtype, device):
    """``[(name, fn, setup)]`` for :func:`time_callable`, sharing the input tensors."""
    generator = torch.Generator().manual_seed(SEED)
    src = torch.randn(shape, generator=generator).to(dtype).to(device)
    grad = torch.randn(shape, generator=generator).to(dtype).to(device)
    c = Contenders(src, grad)
    return [
        ("inplace_abn_fwd_bwd_I", c.fwd_bwd(c.abn["I"]), c.fresh_input(c.abn["I"])),
        ("inplace_abn_fwd_bwd_II", c.fwd_bwd(c.abn["II"]), c.fresh_input(c.abn["II"])),
        ("composite_fwd_bwd", c.fwd_bwd(c.composite), c.fresh_input(c.composite)),
        ("inplace_abn_fwd_I", c.forward, c.refill),
        ("copy", c.copy, None),
    ]


def _ratios(results):
    def ratio(numerator, denominator):
        return results[numerator]["median_s"] / results[denominator]["median_s"]

    return {
        "speedup_vs_composite_I": ratio("composite_fwd_bwd", "inplace_abn_fwd_bwd_I"),
        "speedup_vs_composite_II": ratio("composite_fwd_bwd", "inplace_abn_fwd_bwd_II"),
        "forward_over_copy": ratio("inplace_abn_fwd_I", "copy"),
    }


def _row(shape, dtype, device, args, bar):
    """The measurements and ratios of one dtype."""
    results = {}
    for name, fn, setup in _measurements(shape, DTYPES[dtype], device):
        bar.set_postfix_str(f"{dtype} {name}")
        results[name] = time_callable(fn, args.warmup, args.repeats, device, setup=setup)
        bar.update()
    tensor_bytes = torch.Size(shape).numel() * DTYPES[dtype].itemsize
    results["copy"]["effective_bandwidth_GBps"] = (2 * tensor_bytes
                                                   / results["copy"]["median_s"] / 1e9)
    return {"dtype": dtype, "tensor_bytes": tensor_bytes, "results": results,
            "ratios": _ratios(results)}


def run_benchmark(args):
    """Run every measurement of every dtype; return the JSON-serialisable report."""
    torch.set_num_threads(args.threads)  # the layers' numba loops follow torch's count
    torch.manual_seed(SEED)
    shape, device = tuple(args.shape), torch.device(args.device)
    total = len(args.dtypes) * len(_measurements((2, 1, 1, 1), torch.float32, "cpu"))
    with tqdm(total=total, desc="bench_kernels", unit="measurement", file=sys.stderr) as bar:
        rows = [_row(shape, dtype, device, args, bar) for dtype in args.dtypes]

    config = {
        "shape": list(shape),
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
    return {
        "benchmark": "bench_kernels",
        "run": args.run,
        "config": config,
        "rows": rows,
        "environment": describe_environment(device),
    }


def format_summary(report):
    """A short human-readable table of the report, one block per dtype."""
    config, env = report["config"], report["environment"]
    lines = [
        f"bench_kernels: shape {'x'.join(map(str, config['shape']))} on "
        f"{config['device']} ({env['device_name']}), {config['threads']} threads, "
        f"{config['repeats']} repeats after {config['warmup']} warm-up",
    ]
    for row in report["rows"]:
        results = row["results"]
        lines.append(f"{row['dtype']:<24}{'median ms':>12}{'min ms':>12}{'max ms':>12}")
        for name, r in results.items():
            lines.append(f"  {name:<22}{r['median_s'] * 1e3:>12.2f}{r['min_s'] * 1e3:>12.2f}"
                         f"{r['max_s'] * 1e3:>12.2f}")
        lines.append(f"  copy effective bandwidth: "
                     f"{results['copy']['effective_bandwidth_GBps']:.2f} GB/s")
        for name, value in row["ratios"].items():
            lines.append(f"  {name:<22}{value:>12.3f}")
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
