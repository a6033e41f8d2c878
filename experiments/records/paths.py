"""The layout of ``artifacts/`` and ``figures/``, shared by the Snakefile, the experiments, the
aggregation, the notebooks and the claims report (so a path is spelled in one place)::

    artifacts/<experiment>/<run>/<point>.json   one measured point (config, results, environment)
    artifacts/<experiment>/<run>/<point>.epochs.csv, <point>.weights.pt
                                                a training point's per-epoch metrics, its model
    artifacts/checkpoints/<experiment>/<run>/<point>/   an unfinished training point's checkpoint
    artifacts/data/<dataset>/                   the data sets the smoke profile generates
    artifacts/<experiment>.<run>.csv            every point of one run, one row per measurement
    artifacts/bench_kernels/<run>.json          the kernel micro-benchmark of one run
    artifacts/logs/<experiment>/<run>/<point>.log   per-job log
    artifacts/benchmarks/<rule>/<run>/<job>.tsv  per-job host time (Snakemake's benchmark:)
    artifacts/run_record/<run>.{json,md,html}   the run's machine, versions and times per rule
    artifacts/paper/                            the papers' own numbers, transcribed
    figures/<notebook>.ipynb                    one notebook per figure/table
    figures/<run>/<notebook>.{png,pdf,md,tex,html}  what a notebook renders for one run
    figures/claims.{md,html}                    the papers' claims beside every run's numbers

A *run* is ``<profile>-<device>`` (``smoke-cpu``, ``paper-cuda``), so runs of different profiles
or devices never write the same file. Notebooks find their inputs through the environment
variables ``ARTIFACTS_DIR`` (default ``<checkout>/artifacts``), ``ARTIFACTS_RUN`` (default: the
run whose CSV was written last) and ``FIGURES_DIR`` (default ``<checkout>/figures/<run>``),
which the pipeline and the tests set. ``<checkout>`` is the checkout the current directory lies
in (:func:`checkout_root`; a Jupyter kernel starts in its notebook's directory), so a notebook
reads the artifacts beside it even when the package was installed from another clone.

Importing this module is cheap (no torch): the Snakefile imports it when it is parsed.
"""
import os
import re
from pathlib import Path

#: The root of the checkout this package was installed from (the parent of the ``experiments``
#: package): where its code, and so its git commit, comes from.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Experiment ids, profiles and devices: lower-case words joined by underscores.
_NAME = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*$")


def _check_name(argument, value):
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{argument}={value!r} must be lower-case letters, digits and "
                         "underscores, e.g. 'smoke' or 'densenet_fig2_contiguous'")
    return value


def run_name(profile, device):
    """The run of a profile on a device: ``run_name("smoke", "cpu") == "smoke-cpu"``."""
    return f"{_check_name('profile', profile)}-{_check_name('device', device)}"


def point_json(experiment, run, point, root="artifacts"):
    """``<root>/<experiment>/<run>/<point>.json`` (wildcards such as ``{point}`` pass through)."""
    return f"{root}/{experiment}/{run}/{point}.json"


def epochs_csv(experiment, run, point, root="artifacts"):
    """``<root>/<experiment>/<run>/<point>.epochs.csv``: a training point's per-epoch metrics."""
    return f"{root}/{experiment}/{run}/{point}.epochs.csv"


def weights(experiment, run, point, root="artifacts"):
    """``<root>/<experiment>/<run>/<point>.weights.pt``: a training point's trained model."""
    return f"{root}/{experiment}/{run}/{point}.weights.pt"


def work_dir(experiment, run, point, root="artifacts"):
    """``<root>/checkpoints/<experiment>/<run>/<point>``: the resumable checkpoint of an
    unfinished training point (removed when the point finishes)."""
    return f"{root}/checkpoints/{experiment}/{run}/{point}"


def aggregate_csv(experiment, run, root="artifacts"):
    """``<root>/<experiment>.<run>.csv``: the aggregated points of one run."""
    return f"{root}/{experiment}.{run}.csv"


def job_log(experiment, run, point, root="artifacts"):
    """``<root>/logs/<experiment>/<run>/<point>.log``: stdout and stderr of one job."""
    return f"{root}/logs/{experiment}/{run}/{point}.log"


def job_benchmark(rule, run, job, root="artifacts"):
    """``<root>/benchmarks/<rule>/<run>/<job>.tsv``: Snakemake's host time/memory of one job
    of ``rule`` (the folder names the rule: the run record sums the times per rule)."""
    return f"{root}/benchmarks/{rule}/{run}/{job}.tsv"


def run_record(run, suffix, root="artifacts"):
    """``<root>/run_record/<run>.<suffix>``: the record of a pipeline run (json, md, html;
    experiments/records/run_record.py)."""
    return f"{root}/run_record/{run}.{suffix}"


def bench_kernels_json(run, root="artifacts"):
    """``<root>/bench_kernels/<run>.json``: the kernel benchmark (experiments/bench_kernels.py)
    of one run."""
    return f"{root}/bench_kernels/{run}.json"


def rendered(notebook, run, suffix, root="figures"):
    """``<root>/<run>/<notebook>.<suffix>``: a figure or table a notebook rendered."""
    return f"{root}/{run}/{notebook}.{suffix}"


def runs_of(experiment, root):
    """The runs with an aggregated CSV of ``experiment`` under ``root``, sorted by name."""
    prefix = f"{experiment}."
    return sorted(p.name[len(prefix):-len(".csv")] for p in Path(root).glob(f"{prefix}*.csv"))


# --------------------------------------------------------------------------- notebooks
def checkout_root(start=None):
    """The checkout ``start`` (default: the current directory) lies in: the nearest of it and
    its parents that holds a ``Snakefile`` and an ``artifacts/`` directory; else
    :data:`REPO_ROOT`, the checkout the package was installed from."""
    start = Path(start or os.getcwd()).resolve()
    for directory in (start, *start.parents):
        if (directory / "Snakefile").is_file() and (directory / "artifacts").is_dir():
            return directory
    return REPO_ROOT


def artifacts_dir():
    """``$ARTIFACTS_DIR``, else ``<checkout>/artifacts`` (:func:`checkout_root`)."""
    return Path(os.environ.get("ARTIFACTS_DIR") or checkout_root() / "artifacts")


def current_run(experiment):
    """``$ARTIFACTS_RUN``, else the run of ``experiment`` whose CSV was written last."""
    run = os.environ.get("ARTIFACTS_RUN")
    if run:
        return run
    root = artifacts_dir()
    runs = runs_of(experiment, root)
    if not runs:
        raise FileNotFoundError(
            f"no {aggregate_csv(experiment, '<run>', root)} found: run "
            f"`snakemake --cores 2 {experiment}` first, or set ARTIFACTS_DIR")
    return max(runs, key=lambda r: Path(aggregate_csv(experiment, r, root)).stat().st_mtime)


def figures_dir(run):
    """``$FIGURES_DIR``, else ``<checkout>/figures/<run>`` (:func:`checkout_root`)."""
    return Path(os.environ.get("FIGURES_DIR") or checkout_root() / "figures" / run)


__all__ = ["REPO_ROOT", "run_name", "point_json", "epochs_csv", "weights", "work_dir",
           "aggregate_csv", "job_log", "job_benchmark", "run_record",
           "bench_kernels_json", "rendered", "runs_of", "checkout_root", "artifacts_dir",
           "current_run", "figures_dir"]
