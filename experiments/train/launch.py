"""``torchrun`` for a module whose ranks are forked from a launcher that has imported it once.

    python -m experiments.train.launch --standalone --nproc-per-node=2 -m experiments.<id> ...

takes ``torchrun``'s options and runs the same elastic agent, rendezvous and environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ...), with one difference: ``torchrun
-m`` starts every rank as a fresh ``python -m`` process, which imports torch and the training
code anew (about 7 s of CPU per rank on a laptop, most of a small point's run), while this
launcher imports the module once and forks the ranks from itself (what ``torchrun``'s
``--run-path --start-method fork`` does for a script). Each rank calls the module's
``main(argv)`` with the command line, as the module's ``__main__`` block does under ``python
-m``.

Forking is safe here because the launcher only imports: it runs no parallel CPU work and does
not initialise CUDA before the ranks exist (checked: a module whose import initialises CUDA is
refused, since CUDA cannot be used in a forked child). The pipeline launches its multi-rank
CPU points with it (:func:`experiments.train.plan.launcher`; on CUDA, where a point trains for
hours, it uses ``torchrun`` itself); ``torchrun -m`` runs the same modules unchanged.
"""
import importlib
import os
import sys
import uuid

import torch
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch


class LaunchError(ValueError):
    """A command line this launcher cannot run."""


def run_rank(module, *args):
    """One rank: ``main(args)`` of the (already imported) ``module``, as ``python -m module
    args`` would run it in a fresh process; a ``SystemExit`` with a non-zero status fails the
    rank with that status."""
    if "OMP_NUM_THREADS" in os.environ:  # read at torch's import in a fresh process
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    imported = sys.modules[module]
    sys.argv = [imported.__file__, *args]
    try:
        imported.main(list(args))
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


def parse(argv):
    """``(torchrun's parsed options, module)``; only ``-m`` modules are launched here."""
    args = torchrun.parse_args(argv)
    if not args.module:
        raise LaunchError(f"{args.training_script!r}: this launcher runs modules; pass -m "
                          "<module> (use torchrun itself for a script)")
    if args.no_python or args.run_path:
        raise LaunchError("--no-python and --run-path do not apply: the ranks are forked "
                          "from this launcher")
    if not args.standalone:
        raise LaunchError("pass --standalone: forked ranks run on this node only (use torchrun "
                          "for a rendezvous across nodes)")
    return args, args.training_script


def main(argv=None):
    """Parse ``argv`` as ``torchrun`` does, import the module, run its ranks; exit non-zero
    (with the failed rank's report) if one fails."""
    try:
        args, module = parse(sys.argv[1:] if argv is None else argv)
    except LaunchError as error:
        sys.exit(f"experiments.train.launch: {error}")
    # --standalone, as torchrun.run sets it: a c10d store on a free local port
    args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", uuid.uuid4().hex
    config, _, _ = torchrun.config_from_args(args)
    config.start_method = "fork"
    if not callable(getattr(importlib.import_module(module), "main", None)):
        sys.exit(f"experiments.train.launch: {module} has no main(argv) to run in each rank")
    if torch.cuda.is_initialized():
        sys.exit(f"experiments.train.launch: importing {module} initialised CUDA, which forked "
                 "ranks cannot use; launch it with torchrun")
    try:
        elastic_launch(config, run_rank)(module, *args.training_script_args)
    except ChildFailedError as error:
        sys.exit(error.format_msg())


if __name__ == "__main__":
    main()
