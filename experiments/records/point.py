"""What every measured point shares: its command-line options, their checks, the thread and
seed settings, and the JSON artifact it writes.

An experiment module builds its parser with :func:`parser`, adds its own options, checks them
with :func:`check` (which also checks the shared ones), measures, and calls :func:`write`. The
artifact is::

    {"experiment": ..., "config": {...}, "results": [{...}, ...], "environment": {...}}

``results`` is a list of flat records (one per measurement: a layout, a strategy, a pass), the
rows :mod:`experiments.report.aggregate` puts into the experiment's CSV.
"""
import argparse
from pathlib import Path

import numba
import torch

from .atomic import write_json_atomic
from .environment import describe_environment

DTYPES = {"float32": torch.float32, "float64": torch.float64}
SEED = 0
#: Options of timed points only.
TIMED = ("warmup", "repeats")


def parser(experiment, description, timed=True):
    """An argument parser with the shared options ``--device --dtype --threads --out``, and
    ``--warmup --repeats`` for a ``timed`` point (training points repeat nothing)."""
    p = argparse.ArgumentParser(prog=f"python -m experiments.{experiment}",
                                description=description)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--threads", type=int, default=1,
                   help="threads for torch and numba (default: 1)")
    if timed:
        p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
        p.add_argument("--repeats", type=int, default=10, help="timed runs (default: 10)")
    p.add_argument("--out", type=Path, required=True, help="the point's JSON artifact")
    return p


def check(p, args, positive=()):
    """Parse-time checks of the shared options and of ``positive`` (option names whose value
    must be >= 1 when given); errors exit with status 2 and name the option."""
    for name in ("threads", "repeats", *positive):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value}: must be >= 1")
    if getattr(args, "warmup", 0) < 0:
        p.error(f"--warmup {args.warmup}: must be >= 0")
    if args.threads > numba.config.NUMBA_NUM_THREADS:
        p.error(f"--threads {args.threads}: numba can use at most "
                f"{numba.config.NUMBA_NUM_THREADS} threads here (NUMBA_NUM_THREADS)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda was requested, but no CUDA GPU is available "
                "(torch.cuda.is_available() is False); use --device cpu")
    if args.out.is_dir():
        p.error(f"--out {args.out}: is a directory, expected a file path")


def seed(args):
    """The point's seed: its ``--seed`` where it has one (training points), else :data:`SEED`."""
    return getattr(args, "seed", SEED)


def setup(args):
    """Set numba's and torch's threads and the seeds; return ``(device, dtype)``.

    numba first: launching its OpenMP pool resets the process's OpenMP thread count, and
    torch's operators (oneDNN convolutions) would then run on more threads than asked, which
    on a busy machine slows them tenfold. Setting torch's count afterwards restores it.
    """
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    torch.manual_seed(seed(args))
    return torch.device(args.device), DTYPES[args.dtype]


def shared_config(args):
    """The shared options as they go into the artifact's ``config``."""
    timing = {name: getattr(args, name) for name in TIMED if hasattr(args, name)}
    return {"device": args.device, "dtype": args.dtype, "threads": args.threads, **timing,
            "seed": seed(args)}


def write(args, experiment, config, results):
    """Write the point's artifact to ``args.out`` atomically; return it."""
    report = {
        "experiment": experiment,
        "config": {**config, **shared_config(args)},
        "results": results,
        "environment": describe_environment(args.device),
    }
    write_json_atomic(args.out, report)
    return report


def main(experiment, parse_args, run, summarize, argv=None):
    """An experiment's command line: parse ``argv``, run the point, write its artifact, and
    print ``summarize(config, results, *extra)`` and where the artifact went.

    ``run(args)`` returns ``(config, results, *extra)``; ``extra`` (e.g. a fuller report than
    the artifact keeps) only goes to ``summarize``, which returns the text to print.
    """
    args = parse_args(argv)
    config, results, *extra = run(args)
    write(args, experiment, config, results)
    print(summarize(config, results, *extra))
    print(f"wrote {args.out}")


__all__ = ["DTYPES", "SEED", "TIMED", "parser", "seed", "check", "setup", "shared_config", "write", "main"]
