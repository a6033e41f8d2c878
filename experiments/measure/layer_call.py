"""Host time of one normalization-layer call: ``python -m experiments.measure.layer_call``.

At a tiny shape (default ``2x16x4x4`` float32 on the CPU) the kernels cost next to nothing, so
the time of a call is the Python and the dispatch around them: the argument checks, the views,
the autograd function, the custom operators. That per-call cost is what a network of a hundred
small layers pays a hundred times per step (issue 59). The contenders are InPlace-ABN (variants
I and II), ABN and PyTorch's ``nn.BatchNorm2d`` followed by ``F.leaky_relu`` (the composite
they replace), each a fresh module in training mode; each is timed forward only and forward +
backward, interleaved (:func:`experiments.measure.timing.time_interleaved`), with the input made
untimed before every call (a clone of a leaf that requires grad, as a convolution's output
would be: its clone's backward is in every contender's backward alike). Reports the median
host microseconds per call.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers import ABN, InPlaceABN

from .timing import time_interleaved

#: Leaky ReLU slope of every contender (the ABN layers' default).
SLOPE = 0.01


class BatchNormLeakyReLU(nn.BatchNorm2d):
    """PyTorch's composite: ``nn.BatchNorm2d`` then ``F.leaky_relu`` (out of place)."""

    def forward(self, input):
        return F.leaky_relu(super().forward(input), SLOPE)


def contenders(channels):
    """``{name: module}`` of the layers compared, fresh and in training mode."""
    return {"inplace_abn_I": InPlaceABN(channels, variant="I"),
            "inplace_abn_II": InPlaceABN(channels, variant="II"),
            "abn": ABN(channels),
            "bn_leaky_relu": BatchNormLeakyReLU(channels)}


def measure(shape=(2, 16, 4, 4), warmup=50, repeats=500, seed=0):
    """``{name: {"forward_us": ..., "forward_backward_us": ...}}``: the median host
    microseconds of one call of each contender at ``shape`` (forward with grad enabled, and
    forward + ``backward`` of a fixed outgoing gradient)."""
    if len(shape) < 2:
        raise ValueError(f"shape={shape!r} must be (N, C, *)")
    generator = torch.Generator().manual_seed(seed)
    leaf = torch.randn(*shape, generator=generator).requires_grad_()
    grad = torch.randn(*shape, generator=generator)
    modules = contenders(shape[1])

    def make_input():
        return leaf.clone()

    def forward(module):
        return lambda x: module(x)

    def forward_backward(module):
        return lambda x: module(x).backward(grad)

    times = {}
    for kind, wrap in (("forward_us", forward), ("forward_backward_us", forward_backward)):
        fns = {name: wrap(module) for name, module in modules.items()}
        timed = time_interleaved(fns, warmup, repeats, setups=dict.fromkeys(fns, make_input),
                                 seed=seed)
        for name, summary in timed.items():
            times.setdefault(name, {})[kind] = 1e6 * summary["median_s"]
    return times


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[2, 16, 4, 4])
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: the host path alone, no pool wake-ups)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    times = measure(tuple(args.shape), args.warmup, args.repeats)
    print(f"host us per call, median of {args.repeats}, shape {tuple(args.shape)}, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.2f}")
    for name, row in times.items():
        print(f"{name:16s} forward {row['forward_us']:7.1f}   "
              f"forward+backward {row['forward_backward_us']:7.1f}")
    return times


if __name__ == "__main__":
    main()
