"""InPlace-ABN paper, Table 1 (right): forward+backward time and memory of one BN+ACT+CONV block
per strategy, with the shapes of ResNeXt-101's four modules.

Run as ``python -m experiments.iabn_table1_timing --module conv1|conv2|conv3|conv4 [--batch N]
[--max-size S] [--strategies ...] [--device cpu|cuda] [--threads T] [--warmup W] [--repeats R]
--out PATH``. One point is one module; its strategies are measured in the same process, one
after the other.

Shapes (:data:`MODULES`). The paper (§4.3) times "basic BN+ACT+CONV blocks from ResNeXt-101"
with batch 32 and "the meta-parameters (number of feature channels, spatial dimensions)
encountered in the four modules of ResNeXt-101, denoted as CONV1-CONV4", without listing them.
We take the paper's ResNeXt-101 (cardinality 64, §4.1; bottleneck width 4, i.e. 64x4d) at
224x224 input, its four bottleneck stages (conv2_x ... conv5_x of the ResNeXt paper) as
CONV1-CONV4, and in each the block before the 3x3 grouped convolution of a non-first bottleneck
block: BN+ACT over the 1x1 reduction's output, then the 3x3 convolution with 64 groups,
stride 1, channels in = out:

======  ========  ===========  ======
module  channels  spatial      groups
======  ========  ===========  ======
conv1   256       56 x 56      64
conv2   512       28 x 28      64
conv3   1024      14 x 14      64
conv4   2048      7 x 7        64
======  ========  ===========  ======

``--max-size S`` caps the spatial size (``min(native, S)``) for quick runs; ``--batch``
defaults to the paper's 32. The activation is leaky ReLU with slope 0.01 everywhere (§4).

Per strategy (:data:`experiments.measure.blocks.STRATEGIES`) the record holds the forward+backward time
(median/min/max seconds over ``--repeats`` runs after ``--warmup``; each run gets a fresh
non-leaf copy of one input, made outside the timed region, and a fixed output gradient) and
the memory held for backward after one forward, from saved-tensor hooks
(:mod:`experiments.measure.saved_tensors`; distinct storages, parameters and buffers excluded):
``saved_bytes`` (all of it), ``saved_tensors`` (how many storages), ``saved_map_bytes`` (the
storages of at least the input's size: the ``x``, ``x_hat``, ``z`` buffers of the paper's
Fig. 2), ``saved_channel_bytes`` (the rest: per-channel statistics, which the paper leaves
out of its diagrams), ``input_bytes`` (one ``(N, C, H, W)`` buffer) and
``saved_buffers = saved_map_bytes / input_bytes``.
"""
import sys

import torch
from tqdm import tqdm

from .records import point
from .measure.blocks import SLOPE, STRATEGIES, build_block
from .measure.saved_tensors import saved_storages
from .measure.timing import time_callable

EXPERIMENT = "iabn_table1_timing"
#: module -> (channels, spatial size) of the 3x3 grouped convolution's input, ResNeXt-101 64x4d.
MODULES = {"conv1": (256, 56), "conv2": (512, 28), "conv3": (1024, 14), "conv4": (2048, 7)}
GROUPS = 64


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Time and memory of BN+ACT+CONV blocks per strategy "
                                 "(InPlace-ABN paper, Table 1 right).")
    p.add_argument("--module", choices=tuple(MODULES), required=True,
                   help="ResNeXt-101 module whose shape the block takes")
    p.add_argument("--batch", type=int, default=32, help="minibatch size (default: 32)")
    p.add_argument("--max-size", type=int, default=None,
                   help="cap on the spatial size (default: the module's own)")
    p.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                   help="strategies to measure (default: all)")
    args = p.parse_args(argv)
    point.check(p, args, positive=("batch", "max_size"))
    n, _, h, w = module_shape(args.module, args.batch, args.max_size)
    if n * h * w < 2:
        p.error(f"--batch {args.batch} --max-size {args.max_size}: training-mode batch norm "
                "needs more than one value per channel (batch * size * size >= 2)")
    if len(set(args.strategies)) != len(args.strategies):
        p.error(f"--strategies {' '.join(args.strategies)}: each strategy at most once")
    return args


def module_shape(module, batch, max_size=None):
    """``(N, C, H, W)`` of ``module``'s block input, the spatial size capped at ``max_size``."""
    if module not in MODULES:
        raise ValueError(f"module={module!r} must be one of {tuple(MODULES)}")
    channels, size = MODULES[module]
    if max_size is not None:
        size = min(size, max_size)
    return batch, channels, size, size


def measure_strategy(strategy, source, grad, warmup, repeats, device):
    """Time and saved-tensor record of one strategy on copies of ``source``."""
    channels = source.shape[1]
    block = build_block(strategy, channels, GROUPS, source.dtype, source.device)
    base = source.clone().requires_grad_(True)

    def fresh_input():
        base.grad = None
        block.zero_grad(set_to_none=True)
        return base.clone()

    timing = time_callable(lambda x: block(x).backward(grad), warmup, repeats, device,
                           setup=fresh_input)
    storages = saved_storages(block, fresh_input())
    input_bytes = source.numel() * source.element_size()
    map_bytes = sum(b for b in storages if b >= input_bytes)
    return {"strategy": strategy, **timing, "saved_bytes": sum(storages),
            "saved_tensors": len(storages), "saved_map_bytes": map_bytes,
            "saved_channel_bytes": sum(storages) - map_bytes, "input_bytes": input_bytes,
            "saved_buffers": map_bytes / input_bytes}


def run(args):
    """Measure every strategy; return the artifact's ``(config, results)``."""
    device, dtype = point.setup(args)
    shape = module_shape(args.module, args.batch, args.max_size)
    generator = torch.Generator().manual_seed(point.SEED)
    source = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    grad = torch.randn(shape, generator=generator, dtype=dtype).to(device)
    results = [measure_strategy(s, source, grad, args.warmup, args.repeats, device)
               for s in tqdm(args.strategies, desc=f"{EXPERIMENT} {args.module}",
                             file=sys.stderr)]
    n, c, h, w = shape
    config = {"module": args.module, "batch": n, "channels": c, "height": h, "width": w,
              "groups": GROUPS, "max_size": args.max_size, "activation": "leaky_relu",
              "activation_param": SLOPE}
    return config, results


def summarize(config, results):
    """One line per strategy: the median time and the buffers saved for backward."""
    return "\n".join(f"{r['strategy']:<22}{r['median_s'] * 1e3:10.3f} ms  "
                     f"{r['saved_buffers']:6.3f} buffers saved" for r in results)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
