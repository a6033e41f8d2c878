"""DenseNet paper, Fig. 5: time per minibatch of DenseNet-BC (k = 12), per implementation.

Run as ``python -m experiments.densenet_fig5_time --depth D [--growth-rate K] [--batch N]
[--size S] [--impls ...] [--device cpu|cuda] [--threads T] [--warmup W] [--repeats R] --out
PATH``. One point is one network (depth); every implementation of it is measured in the same
process, interleaved (:func:`experiments.measure.timing.time_interleaved`: one step of each per round,
in a shuffled order), so load that changes while the point runs reaches all of them alike and
their ratio to ``naive`` - the quantity the paper reports - is not skewed.

The paper (p. 6, Sec. 5, Fig. 5): DenseNet-BC-100, k = 12, on an NVIDIA Maxwell Titan-X;
shared storage for batch norm and concatenation adds about 15% (LuaTorch) and 20% (PyTorch)
time per minibatch over the naive implementation. Its minibatch is not stated in Sec. 5; 64 is
the paper's CIFAR minibatch (Fig. 2) and the default here.

A step is one training step of :class:`experiments.measure.TrainingStep`: forward + backward
of the whole minibatch (32x32 inputs, fixed random input and output gradient), parameter
gradients zeroed untimed before each. All implementations start from the same weights.
Per implementation the record holds the median, min and max seconds per step over
``--repeats`` rounds after ``--warmup`` rounds, and the parameter count.
"""
from .measure import step as measure
from .records import point
from .measure.timing import time_interleaved

EXPERIMENT = "densenet_fig5_time"


def parse_args(argv=None):
    p = point.parser(EXPERIMENT, "Time per minibatch of a DenseNet-BC per implementation, "
                                 "interleaved (DenseNet paper, Fig. 5).")
    p.add_argument("--depth", type=int, default=100, help="depth 6n+4 (default: 100)")
    p.add_argument("--growth-rate", type=int, default=12, help="k (default: 12)")
    p.add_argument("--batch", type=int, default=64, help="minibatch size (default: 64)")
    p.add_argument("--size", type=int, default=32, help="input height = width (default: 32)")
    p.add_argument("--impls", nargs="+", choices=measure.IMPLEMENTATIONS,
                   default=list(measure.IMPLEMENTATIONS),
                   help="implementations to time (default: all)")
    args = p.parse_args(argv)
    point.check(p, args, positive=("depth", "growth_rate", "batch", "size"))
    if len(set(args.impls)) != len(args.impls):
        p.error(f"--impls {' '.join(args.impls)}: each implementation at most once")
    try:
        args.specs = {}
        for impl in args.impls:
            args.specs[impl], args.input_shape = measure.cifar_configuration(
                impl, args.depth, args.growth_rate, args.batch, args.size)
    except ValueError as error:
        p.error(str(error))
    return args


def run(args):
    """Time every implementation, interleaved; return the artifact's ``(config, results)``."""
    device, dtype = point.setup(args)
    steps = {impl: measure.TrainingStep(spec, args.input_shape, device, dtype)
             for impl, spec in args.specs.items()}
    timings = time_interleaved(steps, args.warmup, args.repeats, device,
                               setups={impl: step.zero_grad for impl, step in steps.items()})
    results = [{"impl": impl, "model": args.specs[impl].model,
                "param_count": sum(p.numel() for p in steps[impl].model.parameters()),
                **timings[impl]}
               for impl in args.impls]
    config = {"depth": args.depth, "growth_rate": args.growth_rate, "batch": args.batch,
              "size": args.size, "interleaved": True}
    return config, results


def summarize(config, results):
    """One line per implementation: the median time, and its ratio to naive if measured."""
    naive = next((r["median_s"] for r in results if r["impl"] == "naive"), None)
    lines = []
    for r in results:
        ratio = "" if naive is None else f"  {r['median_s'] / naive:5.2f}x naive"
        lines.append(f"{r['impl']:<12}{r['median_s'] * 1e3:10.1f} ms{ratio}")
    return "\n".join(lines)


def main(argv=None):
    point.main(EXPERIMENT, parse_args, run, summarize, argv)


if __name__ == "__main__":
    main()
