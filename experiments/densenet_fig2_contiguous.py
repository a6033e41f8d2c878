"""DenseNet paper, Fig. 2 (right): a 3x3 convolution on a contiguous input vs a non-contiguous one.

Run as ``python -m experiments.densenet_fig2_contiguous --in-channels C [--out-channels K]
[--batch N] [--size S] [--device cpu|cuda] [--threads T] [--warmup W] [--repeats R] --out
PATH``. One point is one input channel count ``C``; both layouts are measured in the same
process, one after the other, so their ratio is not skewed by load that differs between jobs.

The paper (p. 3, Fig. 2 right): 3x3 filters on 32x32 feature maps, minibatch 64, on a GTX 980
with cuDNN; a non-contiguous input costs 30-50% more time. Its output channel count is not
stated; the default ``K = 12`` is the growth rate of the paper's DenseNet-BC experiments.

Layouts (input of shape ``(N, C, S, S)``):

* ``contiguous``: a tensor of its own, as a DenseNet layer sees after copying the concatenation
  of its predecessors' features into one block;
* ``non_contiguous``: the first ``C`` channels of an ``(N, 2C, S, S)`` tensor, a channel slice
  such as a concatenation without a copy would give (its batch stride is ``2 C S S``).

Passes, each timed as median/min/max over ``--repeats`` runs after ``--warmup``:

* ``forward``: ``F.conv2d`` under ``torch.no_grad()``;
* ``forward_backward``: the forward with autograd, then the gradients of the input, the weight
  and the bias (``torch.autograd.grad``, so the slice's own backward is not timed).
"""
import sys

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .records import point
from .measure.timing import time_callable

EXPERIMENT = "densenet_fig2_contiguous"
LAYOUTS = ("contiguous", "non_contiguous")
PASSES = ("forward", "forward_backward")
KERNEL = 3


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Time a 3x3 convolution on a contiguous vs a non-contiguous "
                                 "input (DenseNet paper, Fig. 2 right).")
    p.add_argument("--in-channels", type=int, required=True, help="input channels C")
    p.add_argument("--out-channels", type=int, default=12, help="output channels (default: 12)")
    p.add_argument("--batch", type=int, default=64, help="minibatch size (default: 64)")
    p.add_argument("--size", type=int, default=32, help="feature map height = width (default: 32)")
    args = p.parse_args(argv)
    point.check(p, args, positive=("in_channels", "out_channels", "batch", "size"))
    return args


def make_input(layout, shape, dtype, device, requires_grad=False):
    """An input of ``shape`` in ``layout``; returns ``(tensor, source)``.

    ``source`` is the leaf that owns the storage: the input itself when contiguous, the
    ``(N, 2C, H, W)`` parent of the channel slice otherwise.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
    n, c, h, w = shape
    channels = c if layout == "contiguous" else 2 * c
    source = torch.randn(n, channels, h, w, dtype=dtype, device=device,
                         requires_grad=requires_grad)
    return source[:, :c], source


def _timed_passes(layout, args, dtype, device):
    """``{pass: fn}`` for one layout, on its own input, weight and output gradient."""
    shape = (args.batch, args.in_channels, args.size, args.size)
    weight = torch.randn(args.out_channels, args.in_channels, KERNEL, KERNEL, dtype=dtype,
                         device=device, requires_grad=True)
    bias = torch.zeros(args.out_channels, dtype=dtype, device=device, requires_grad=True)
    grad = torch.randn(args.batch, args.out_channels, args.size, args.size, dtype=dtype,
                       device=device)
    x, source = make_input(layout, shape, dtype, device, requires_grad=True)
    assert x.is_contiguous() == (layout == "contiguous")

    def forward():
        with torch.no_grad():
            F.conv2d(x, weight, bias, padding=KERNEL // 2)

    def forward_backward():
        # Re-take the slice so the graph starts at the input the convolution sees.
        inp = source[:, :args.in_channels]
        out = F.conv2d(inp, weight, bias, padding=KERNEL // 2)
        torch.autograd.grad(out, (inp, weight, bias), grad)

    return {"forward": forward, "forward_backward": forward_backward}


def run(args):
    """Measure every layout and pass; return the artifact's ``(config, results)``."""
    device, dtype = point.setup(args)
    results = []
    jobs = [(layout, name) for layout in LAYOUTS for name in PASSES]
    passes = {layout: _timed_passes(layout, args, dtype, device) for layout in LAYOUTS}
    for layout, name in tqdm(jobs, desc=f"{EXPERIMENT} C={args.in_channels}", file=sys.stderr):
        timing = time_callable(passes[layout][name], args.warmup, args.repeats, device)
        results.append({"layout": layout, "pass": name, **timing})
    config = {"in_channels": args.in_channels, "out_channels": args.out_channels,
              "batch": args.batch, "size": args.size, "kernel": KERNEL,
              "non_contiguous_parent_channels": 2 * args.in_channels}
    return config, results


def summarize(config, results):
    """One line per layout and pass: the median time."""
    return "\n".join(f"{r['layout']:<16}{r['pass']:<18}{r['median_s'] * 1e3:10.3f} ms"
                     for r in results)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
