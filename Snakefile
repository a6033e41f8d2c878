"""The experiments of both papers as rules; `rule all` builds every table and figure.

    snakemake --cores all                                           # smoke profile (CPU, minutes)
    snakemake --cores all --resources gpu=1 --config profile=paper  # the papers' sizes, on a GPU
    snakemake --cores 2 iabn_table1_timing                          # one experiment
    snakemake --cores 2 iabn_table1_timing --forcerun iabn_table1_timing_point  # measure it anew

The experiments that have a rule (the keys of EXPERIMENTS; the claims report calls the papers'
other experiments "not implemented"), and the file of experiments/rules/ that holds their rules:

    densenet_fig2_contiguous  DenseNet Fig. 2 right: 3x3 convolution, (non-)contiguous input
    densenet_fig2_preact      DenseNet Fig. 2 left: CIFAR error, pre-/post-activation    training
    densenet_fig4_memory      DenseNet Fig. 4: memory vs depth
    densenet_fig5_time        DenseNet Fig. 5: time per minibatch
    densenet_fig6_imagenet    DenseNet Fig. 6: ImageNet top-1 error of deep DenseNets     training
    iabn_digits_on_par        InPlace-ABN 'on par' at small scale: real 8x8 digits, seeds
    iabn_table1_imagenet      InPlace-ABN Table 1 left: ImageNet top-1/top-5              training
    iabn_table1_timing        InPlace-ABN Table 1 right: BN+ACT+CONV time and memory
    iabn_table2_capacity      InPlace-ABN Table 2 brackets: crops / crop size in a budget
    iabn_table2_segmentation  InPlace-ABN Table 2: DeepLabV3 mIoU                     segmentation
    whole_step                beyond the papers: a whole training step, STD-BN vs InPlace-ABN

(`<file>.smk`; the others: `<id>.smk`). training.smk also generates the smoke profile's data
sets; bench_kernels.smk holds the kernel benchmark, report.smk the aggregation, the notebooks'
rendering and the claims report, gpu_selfcheck.smk the GPU self-check.

The profile is experiments/config/<profile>.yaml (`--config profile=...`, default smoke); a
`--configfile` or `--config` merges over it. The merged configuration is validated against
experiments/config/schema.yaml before anything is planned. A run is `<profile>-<device>`; its
files never collide with another run's (layout: experiments/records/paths.py).

An experiment is one module `experiments/<id>.py` (one measured point per call) and a file
experiments/rules/<id>.smk: its rule `<id>_point` and its entry in EXPERIMENTS (its points and
the notebooks that plot it), included below. Aggregation, rendering, the per-experiment
target rule `<id>`, the claims report and the run record are generic. Every rule names the
code it runs as inputs (`code(...)`), so editing a module marks the outputs of exactly the
rules that run it out of date; the target rules name every point, so a deleted point is
measured again. Every job writes a benchmark file (artifacts/benchmarks/<rule>/<run>/), which
the run record sums per rule; `snakemake --report report.html` shows every figure and table,
the claims and the run record (experiments/rules/report.smk).
"""
import os
from pathlib import Path

import yaml
from snakemake.utils import validate

from experiments.records import forkserver, paths, sources

CONFIG_DIR = Path(workflow.basedir) / "experiments" / "config"
FIGURES = Path(workflow.basedir) / "figures"
RENDERED_SUFFIXES = ("png", "pdf", "md", "tex", "html")


def merged(base, override):
    """``base`` updated by ``override``, recursively for nested mappings."""
    out = dict(base)
    for key, value in override.items():
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both_dicts else value
    return out


def profile_config(overrides):
    """The profile named by ``overrides["profile"]`` (default smoke), ``overrides`` merged in."""
    profile = overrides.get("profile", "smoke")
    # The schema lies beside the profiles and is none.
    available = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "schema")
    if profile not in available:
        raise ValueError(f"profile={profile!r} is not a profile; available profiles: "
                         f"{available} (experiments/config/<profile>.yaml)")
    return merged(yaml.safe_load((CONFIG_DIR / f"{profile}.yaml").read_text()), overrides)


def yaml_typed(value):
    """A nested ``--config`` value typed as YAML types it: Snakemake reads ``key={...}`` with
    YAML's BaseLoader, which leaves every scalar inside a string (``null``, ``100``, ``true``),
    so ``--config 'datasets={imagenet: {root: /x, generate: null}}'`` would fail the schema.
    Only null, booleans and numbers are typed; any other scalar stays the string it was."""
    if isinstance(value, dict):
        return {key: yaml_typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [yaml_typed(item) for item in value]
    if isinstance(value, str):
        try:
            typed = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:  # a quoted string that is no YAML scalar, e.g. '[x'
            return value
        return typed if typed is None or isinstance(typed, (bool, int, float)) else value
    return value


_profile = profile_config(merged(config, {
    key: yaml_typed(value) for key, value in workflow.config_settings.config.items()
    if isinstance(value, (dict, list))}))  # top-level --config values are typed already
config.clear()
config.update(_profile)
validate(config, "experiments/config/schema.yaml")

DEVICE = config["device"]
RUN = paths.run_name(config["profile"], DEVICE)
# With the profile's `forkserver`, a local run's jobs are forks of one process that has imported
# torch and the experiments (experiments/records/forkserver.py): their commands start with its
# client instead of `python -m`, which runs `python -m` itself where no server is (a cluster
# node).
PYTHON_M_WORDS = forkserver.command_prefix(config["forkserver"])
PYTHON_M = " ".join(PYTHON_M_WORDS)

# Timing jobs on one GPU would disturb each other: each takes one unit of `gpu`; pass
# `--resources gpu=<number of GPUs>`.
GPU = 1 if DEVICE == "cuda" else 0


def cluster_resources(section, gpus=GPU):
    """The ``resources:`` of a job configured by the profile section ``section`` that uses
    ``gpus`` GPUs (a training rule passes torchrun's process count on cuda, 0 on the CPU).

    ``gpu`` is both the local scheduling unit (`--resources gpu=N`) and what the SLURM
    executor requests (`sbatch --gpus`); ``cpus_per_task`` is the job's threads
    (`--cpus-per-task`); ``mem_mb`` (`--mem`) and ``runtime`` (minutes, `--time`) come from
    the section's ``cluster`` block. A local run limits only what `--resources` names.
    """
    cluster = section["cluster"]
    return {
        "gpu": gpus,
        "cpus_per_task": lambda wildcards, threads: threads,
        "mem_mb": cluster["mem_mb"],
        "runtime": cluster["runtime_min"],
    }

#: experiment id -> {"points": [point names], "notebooks": [notebooks that plot it]}
EXPERIMENTS = {}
#: notebook -> the artifacts it plots, for the notebooks that plot no experiment's CSV
NOTEBOOK_ARTIFACTS = {"bench_kernels": [paths.bench_kernels_json(RUN)]}


def point_targets(experiment):
    return [paths.point_json(experiment, RUN, p) for p in EXPERIMENTS[experiment]["points"]]


def notebook_targets(notebook):
    return [paths.rendered(notebook, RUN, s) for s in RENDERED_SUFFIXES]


def experiment_targets(experiment):
    """Every point of ``experiment``, its aggregated CSV and everything its notebooks render.

    The points are named although the CSV needs them: Snakemake regenerates a missing file
    only for a job that runs, and an up-to-date CSV does not run, so a deleted point would
    stay missing; a target rule (no output) runs whenever one of its inputs is missing.
    """
    return point_targets(experiment) + [paths.aggregate_csv(experiment, RUN)] + [
        t for nb in EXPERIMENTS[experiment]["notebooks"] for t in notebook_targets(nb)]


def code(*modules):
    """The source files running ``modules`` runs (each ``experiments.<...>`` module and every
    project module it imports, see experiments/records/sources.py): a rule's ``code`` input,
    so that editing any of them marks the rule's outputs out of date."""
    return sources.module_sources(*modules, root=workflow.basedir)


def checked_depths(experiment):
    """``config[experiment]["depths"]``, each of DenseNet-BC's form 6n + 4 (the schema checks
    that they are integers >= 10; JSON Schema cannot say "4 more than a multiple of 6")."""
    depths = config[experiment]["depths"]
    bad = [d for d in depths if (d - 4) % 6]
    if bad:
        raise ValueError(f"{experiment}.depths: {bad} are not of DenseNet-BC's form 6n + 4 "
                         "(40, 64, 88, 100, 160, ...)")
    return depths


# --------------------------------------------------------------------------- experiments
# Each family registers its experiments in EXPERIMENTS beside the rules that measure them.
include: "experiments/rules/densenet_fig2_contiguous.smk"
include: "experiments/rules/iabn_table1_timing.smk"
include: "experiments/rules/densenet_fig4_memory.smk"
include: "experiments/rules/densenet_fig5_time.smk"
include: "experiments/rules/iabn_table2_capacity.smk"
include: "experiments/rules/whole_step.smk"
include: "experiments/rules/iabn_digits_on_par.smk"
include: "experiments/rules/training.smk"
include: "experiments/rules/segmentation.smk"


# Light jobs that read artifacts/ only: on a cluster they run where snakemake runs, not as
# cluster jobs (the measuring and training rules take cluster_resources).
localrules: all, aggregate, render, claims, run_record

#: What the fork server imports once: every module a job of this workflow runs.
FORKSERVER_PRELOAD = ["experiments.train.launch", "experiments.train.data.generate",
                      "experiments.report.aggregate", "experiments.report.render",
                      "experiments.report.claims", "experiments.report.html_page",
                      "experiments.records.run_record", "experiments.bench_kernels",
                      *(f"experiments.{experiment}" for experiment in EXPERIMENTS)]


onstart:
    # Only where the jobs run on this machine: a cluster's jobs start fresh processes.
    if config["forkserver"] and workflow.local_exec:
        forkserver.start(FORKSERVER_PRELOAD, paths.job_log("forkserver", RUN, "server"))


#: What `all` builds before the run record (whose inputs they are).
ALL_TARGETS = [
    paths.bench_kernels_json(RUN),
    *(t for nb in NOTEBOOK_ARTIFACTS for t in notebook_targets(nb)),
    *(t for e in EXPERIMENTS for t in experiment_targets(e)),
    "figures/claims.md",
]
#: This snakemake process: the run record reads the run's wall and CPU time from it.
SNAKEMAKE_PID = os.getpid()


rule all:
    """Every experiment, its figures and tables, the kernel benchmark, the claims report and
    the run record."""
    default_target: True
    input:
        ALL_TARGETS,
        paths.run_record(RUN, "json"),


for _experiment in EXPERIMENTS:

    rule:
        name:
            _experiment
        input:
            experiment_targets(_experiment),


# --------------------------------------------------------------------------- generic rules
include: "experiments/rules/bench_kernels.smk"
include: "experiments/rules/report.smk"
include: "experiments/rules/gpu_selfcheck.smk"
