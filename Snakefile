"""The experiments of both papers as rules; `rule all` builds every table and figure.

    snakemake --cores all                                           # smoke profile (CPU, minutes)
    snakemake --cores all --resources gpu=1 --config profile=paper  # the papers' sizes, on a GPU
    snakemake --cores 2 iabn_table1_timing                          # one experiment
    snakemake --cores 2 iabn_table1_timing --forcerun iabn_table1_timing_point  # measure it anew

The experiments that have a rule (the keys of EXPERIMENTS below; the claims report calls the
papers' other experiments "not implemented"):

    densenet_fig2_contiguous   DenseNet Fig. 2 right: 3x3 convolution, (non-)contiguous input
    densenet_fig2_preact       DenseNet Fig. 2 left: CIFAR error, pre- vs post-activation
    densenet_fig4_memory       DenseNet Fig. 4: memory vs depth
    densenet_fig5_time         DenseNet Fig. 5: time per minibatch
    densenet_fig6_imagenet     DenseNet Fig. 6: ImageNet top-1 error of deep DenseNets
    iabn_table1_imagenet       InPlace-ABN Table 1 left: ImageNet top-1/top-5, STD-BN vs InPlace-ABN
    iabn_table1_timing         InPlace-ABN Table 1 right: BN+ACT+CONV time and memory
    iabn_table2_capacity       InPlace-ABN Table 2 brackets: crops / crop size in a budget
    iabn_table2_segmentation   InPlace-ABN Table 2: DeepLabV3 mIoU, Cityscapes/COCO-Stuff/Vistas

The training experiments (and the data sets the smoke profile generates for them) are in
experiments/rules/training.smk, the segmentation training in experiments/rules/segmentation.smk.

The profile is experiments/config/<profile>.yaml (`--config profile=...`, default smoke); a
`--configfile` or `--config` merges over it. The merged configuration is validated against
experiments/config/schema.yaml before anything is planned. A run is `<profile>-<device>`; its
files never collide with another run's (layout: experiments/records/paths.py).

An experiment is one module `experiments/<id>.py` (one measured point per call) and one rule
`<id>_point` here, plus an entry in EXPERIMENTS (its points and the notebooks that plot it).
Aggregation, rendering, the per-experiment target rule `<id>` and the claims report are
generic. Every rule names the code it runs as inputs (`code(...)`), so editing a module marks
the outputs of exactly the rules that run it out of date; the target rules name every point,
so a deleted point is measured again.
"""
from pathlib import Path

import yaml
from snakemake.utils import validate

from experiments.records import forkserver, paths, sources

CONFIG_DIR = Path(workflow.basedir) / "experiments" / "config"
FIGURES = Path(workflow.basedir) / "figures"
RENDERED_SUFFIXES = ("png", "pdf", "md", "tex")


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


# --------------------------------------------------------------------------- experiments
FIG2 = config["densenet_fig2_contiguous"]
EXPERIMENTS["densenet_fig2_contiguous"] = {
    "points": [f"c{c}" for c in FIG2["in_channels"]],
    "notebooks": ["densenet_fig2_contiguous"],
}


rule densenet_fig2_contiguous_point:
    """DenseNet Fig. 2 right: a 3x3 convolution, contiguous vs non-contiguous input."""
    input:
        code=code("experiments.densenet_fig2_contiguous"),
    output:
        paths.point_json("densenet_fig2_contiguous", RUN, "c{in_channels}"),
    log:
        paths.job_log("densenet_fig2_contiguous", RUN, "c{in_channels}"),
    benchmark:
        paths.job_benchmark("densenet_fig2_contiguous", RUN, "c{in_channels}")
    wildcard_constraints:
        in_channels=r"\d+",
    threads: FIG2["threads"]
    resources:
        **cluster_resources(FIG2),
    params:
        cfg=FIG2,
    shell:
        "{PYTHON_M} experiments.densenet_fig2_contiguous --in-channels {wildcards.in_channels}"
        " --out-channels {params.cfg[out_channels]} --batch {params.cfg[batch]}"
        " --size {params.cfg[size]} --device {DEVICE} --dtype {params.cfg[dtype]}"
        " --threads {threads} --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]}"
        " --out {output} > {log} 2>&1"


TABLE1 = config["iabn_table1_timing"]
EXPERIMENTS["iabn_table1_timing"] = {
    "points": TABLE1["modules"],
    "notebooks": ["iabn_table1_timing"],
}


rule iabn_table1_timing_point:
    """InPlace-ABN Table 1 right: BN+ACT+CONV time and saved memory per strategy."""
    input:
        code=code("experiments.iabn_table1_timing"),
    output:
        paths.point_json("iabn_table1_timing", RUN, "{module}"),
    log:
        paths.job_log("iabn_table1_timing", RUN, "{module}"),
    benchmark:
        paths.job_benchmark("iabn_table1_timing", RUN, "{module}")
    wildcard_constraints:
        module="conv[1-4]",
    threads: TABLE1["threads"]
    resources:
        **cluster_resources(TABLE1),
    params:
        cfg=TABLE1,
        max_size="" if TABLE1["max_size"] is None else f"--max-size {TABLE1['max_size']}",
    shell:
        "{PYTHON_M} experiments.iabn_table1_timing --module {wildcards.module}"
        " --batch {params.cfg[batch]} {params.max_size} --device {DEVICE}"
        " --dtype {params.cfg[dtype]} --threads {threads} --warmup {params.cfg[warmup]}"
        " --repeats {params.cfg[repeats]} --out {output} > {log} 2>&1"


def checked_depths(experiment):
    """``config[experiment]["depths"]``, each of DenseNet-BC's form 6n + 4 (the schema checks
    that they are integers >= 10; JSON Schema cannot say "4 more than a multiple of 6")."""
    depths = config[experiment]["depths"]
    bad = [d for d in depths if (d - 4) % 6]
    if bad:
        raise ValueError(f"{experiment}.depths: {bad} are not of DenseNet-BC's form 6n + 4 "
                         "(40, 64, 88, 100, 160, ...)")
    return depths


FIG4 = config["densenet_fig4_memory"]
FIG4_SIMULATED = FIG4["simulated"]
EXPERIMENTS["densenet_fig4_memory"] = {
    "points": [f"{impl}_d{depth}" for impl in FIG4["impls"]
               for depth in checked_depths("densenet_fig4_memory")]
    + [f"simulated_{impl}" for impl in FIG4_SIMULATED["impls"]],
    "notebooks": ["densenet_fig4_memory"],
}


rule densenet_fig4_memory_point:
    """DenseNet Fig. 4: memory of one DenseNet-BC training step, one implementation and depth."""
    input:
        code=code("experiments.densenet_fig4_memory"),
    output:
        paths.point_json("densenet_fig4_memory", RUN, "{impl}_d{depth}"),
    log:
        paths.job_log("densenet_fig4_memory", RUN, "{impl}_d{depth}"),
    benchmark:
        paths.job_benchmark("densenet_fig4_memory", RUN, "{impl}_d{depth}")
    wildcard_constraints:
        impl="|".join(FIG4["impls"]),
        depth=r"\d+",
    threads: FIG4["threads"]
    resources:
        **cluster_resources(FIG4),
    params:
        cfg=FIG4,
        budget="" if FIG4["memory_budget_gib"] is None
        else f"--budget-gib {FIG4['memory_budget_gib']}",
        peak="" if FIG4["peak"] else "--no-peak",
    shell:
        "{PYTHON_M} experiments.densenet_fig4_memory --impl {wildcards.impl}"
        " --depth {wildcards.depth} --growth-rate {params.cfg[growth_rate]}"
        " --batch {params.cfg[batch]} --size {params.cfg[size]} {params.budget} {params.peak}"
        " --device {DEVICE} --dtype {params.cfg[dtype]} --threads {threads}"
        " --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]} --out {output}"
        " > {log} 2>&1"


rule densenet_fig4_memory_simulated_point:
    """DenseNet Fig. 4 at the paper's scale (batch 64): one implementation's training step at
    every depth simulated on the meta device (tensor memory, no GPU), and the deepest depth
    that fits the budget."""
    input:
        code=code("experiments.densenet_fig4_memory"),
    output:
        paths.point_json("densenet_fig4_memory", RUN, "simulated_{impl}"),
    log:
        paths.job_log("densenet_fig4_memory", RUN, "simulated_{impl}"),
    benchmark:
        paths.job_benchmark("densenet_fig4_memory", RUN, "simulated_{impl}")
    wildcard_constraints:
        impl="|".join(FIG4_SIMULATED["impls"]),
    threads: 1
    resources:
        **cluster_resources(FIG4, gpus=0),
    params:
        cfg=FIG4,
        sim=FIG4_SIMULATED,
        depths=" ".join(str(d) for d in FIG4_SIMULATED["depths"]),
    shell:
        "{PYTHON_M} experiments.densenet_fig4_memory --simulate --impl {wildcards.impl}"
        " --depths {params.depths} --max-depth {params.sim[max_depth]}"
        " --growth-rate {params.cfg[growth_rate]} --batch {params.sim[batch]}"
        " --size {params.cfg[size]} --budget-gib {params.sim[budget_gib]}"
        " --dtype {params.cfg[dtype]} --threads {threads} --out {output} > {log} 2>&1"


FIG5 = config["densenet_fig5_time"]
EXPERIMENTS["densenet_fig5_time"] = {
    "points": [f"d{depth}" for depth in checked_depths("densenet_fig5_time")],
    "notebooks": ["densenet_fig5_time"],
}


rule densenet_fig5_time_point:
    """DenseNet Fig. 5: time per minibatch of one DenseNet-BC, every implementation interleaved
    in the one job (so their ratio is not skewed by load that differs between jobs)."""
    input:
        code=code("experiments.densenet_fig5_time"),
    output:
        paths.point_json("densenet_fig5_time", RUN, "d{depth}"),
    log:
        paths.job_log("densenet_fig5_time", RUN, "d{depth}"),
    benchmark:
        paths.job_benchmark("densenet_fig5_time", RUN, "d{depth}")
    wildcard_constraints:
        depth=r"\d+",
    threads: FIG5["threads"]
    resources:
        **cluster_resources(FIG5),
    params:
        cfg=FIG5,
        impls=" ".join(FIG5["impls"]),
    shell:
        "{PYTHON_M} experiments.densenet_fig5_time --depth {wildcards.depth}"
        " --growth-rate {params.cfg[growth_rate]} --batch {params.cfg[batch]}"
        " --size {params.cfg[size]} --impls {params.impls} --device {DEVICE}"
        " --dtype {params.cfg[dtype]} --threads {threads} --warmup {params.cfg[warmup]}"
        " --repeats {params.cfg[repeats]} --out {output} > {log} 2>&1"


TABLE2 = config["iabn_table2_capacity"]
TABLE2_SIMULATED = TABLE2["simulated"]
EXPERIMENTS["iabn_table2_capacity"] = {
    "points": [f"{prefix}{dataset}_{body}_{norm}_{mode}"
               for prefix, section in (("", TABLE2), ("simulated_", TABLE2_SIMULATED))
               for dataset, spec in section["datasets"].items() for body in spec["crops"]
               if body in section["bodies"] for norm in ("bn", "iabn")
               for mode in TABLE2["modes"]],
    "notebooks": ["iabn_table2_capacity"],
}


def std_bn_point(wildcards, prefix=""):
    """FIXED BATCH keeps the STD-BN batch: the STD-BN FIXED CROP point of the same data set and
    body (``prefix``: ``"simulated_"`` among the simulated points), an input."""
    if wildcards.mode != "fixed_batch":
        return []
    return [paths.point_json("iabn_table2_capacity", RUN,
                             f"{prefix}{wildcards.dataset}_{wildcards.body}_bn_fixed_crop")]


def simulated_std_bn_point(wildcards):
    """:func:`std_bn_point` among the simulated points."""
    return std_bn_point(wildcards, "simulated_")


def capacity_args(wildcards, section, std_bn):
    """The data set's label, classes and crop (its own FIXED CROP crop for the body: each data
    set's brackets come from its own chain), and ``--batch-from`` the STD-BN point (FIXED
    BATCH; ``std_bn``: :func:`std_bn_point` or :func:`simulated_std_bn_point`) or ``--batch``
    where the FIXED CROP search starts (``section``: the real or simulated settings)."""
    dataset = section["datasets"][wildcards.dataset]
    batch = (f"--batch-from {std_bn(wildcards)[0]}" if wildcards.mode == "fixed_batch"
             else f"--batch {section['bodies'][wildcards.body]['batch']}")
    return (f"--dataset {wildcards.dataset} --classes {dataset['classes']}"
            f" --crop {dataset['crops'][wildcards.body]} {batch}")


rule iabn_table2_capacity_point:
    """InPlace-ABN Table 2 brackets: the largest batch (FIXED CROP) or crop (FIXED BATCH, at
    the STD-BN FIXED CROP batch) of one segmentation network and normalization within the
    memory budget."""
    input:
        std_bn=std_bn_point,
        code=code("experiments.iabn_table2_capacity"),
    output:
        paths.point_json("iabn_table2_capacity", RUN, "{dataset}_{body}_{norm}_{mode}"),
    log:
        paths.job_log("iabn_table2_capacity", RUN, "{dataset}_{body}_{norm}_{mode}"),
    benchmark:
        paths.job_benchmark("iabn_table2_capacity", RUN, "{dataset}_{body}_{norm}_{mode}")
    wildcard_constraints:
        dataset="|".join(TABLE2["datasets"]),
        body="|".join(TABLE2["bodies"]),
        norm="bn|iabn",
        mode="fixed_crop|fixed_batch",
    threads: TABLE2["threads"]
    resources:
        **cluster_resources(TABLE2),
    params:
        cfg=TABLE2,
        args=lambda wildcards: capacity_args(wildcards, TABLE2, std_bn_point),
        method="" if TABLE2["method"] is None else f"--method {TABLE2['method']}",
        fit_batches=" ".join(str(n) for n in TABLE2["fit_batches"]),
        fit_crops=" ".join(str(c) for c in TABLE2["fit_crops"]),
    shell:
        "{PYTHON_M} experiments.iabn_table2_capacity --body {wildcards.body}"
        " --norm {wildcards.norm} --mode {wildcards.mode} {params.args}"
        " --budget-mib {params.cfg[budget_mib]} --width {params.cfg[width]}"
        " --layout {params.cfg[layout]} {params.method} --crop-step {params.cfg[crop_step]}"
        " --fit-batches {params.fit_batches} --fit-crops {params.fit_crops}"
        " --device {DEVICE} --dtype {params.cfg[dtype]} --threads {threads}"
        " --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]} --out {output}"
        " > {log} 2>&1"


rule iabn_table2_capacity_simulated_point:
    """InPlace-ABN Table 2 brackets at the paper's sizes (full width, the paper's crops, 12 GiB
    per GPU), every probe's training step simulated on the meta device: tensor memory, no GPU."""
    input:
        std_bn=simulated_std_bn_point,
        code=code("experiments.iabn_table2_capacity"),
    output:
        paths.point_json("iabn_table2_capacity", RUN, "simulated_{dataset}_{body}_{norm}_{mode}"),
    log:
        paths.job_log("iabn_table2_capacity", RUN, "simulated_{dataset}_{body}_{norm}_{mode}"),
    benchmark:
        paths.job_benchmark("iabn_table2_capacity", RUN,
                            "simulated_{dataset}_{body}_{norm}_{mode}")
    wildcard_constraints:
        dataset="|".join(TABLE2_SIMULATED["datasets"]),
        body="|".join(TABLE2_SIMULATED["bodies"]),
        norm="bn|iabn",
        mode="fixed_crop|fixed_batch",
    threads: 1
    resources:
        **cluster_resources(TABLE2, gpus=0),
    params:
        cfg=TABLE2,
        sim=TABLE2_SIMULATED,
        args=lambda wildcards: capacity_args(wildcards, TABLE2_SIMULATED,
                                             simulated_std_bn_point),
    shell:
        "{PYTHON_M} experiments.iabn_table2_capacity --simulate --body {wildcards.body}"
        " --norm {wildcards.norm} --mode {wildcards.mode} {params.args}"
        " --budget-mib {params.sim[budget_mib]} --width {params.sim[width]}"
        " --layout {params.cfg[layout]} --crop-step {params.cfg[crop_step]}"
        " --dtype {params.cfg[dtype]} --threads {threads} --warmup {params.cfg[warmup]}"
        " --repeats 1 --out {output} > {log} 2>&1"


# --------------------------------------------------------------------------- generic rules
include: "experiments/rules/training.smk"
include: "experiments/rules/segmentation.smk"
include: "experiments/rules/gpu_selfcheck.smk"


# Light jobs that read artifacts/ only: on a cluster they run where snakemake runs, not as
# cluster jobs (the measuring and training rules take cluster_resources).
localrules: all, aggregate, render, claims

#: What the fork server imports once: every module a job of this workflow runs.
FORKSERVER_PRELOAD = ["experiments.train.launch", "experiments.train.data.generate",
                      "experiments.report.aggregate", "experiments.report.render",
                      "experiments.report.claims", "experiments.bench_kernels",
                      *(f"experiments.{experiment}" for experiment in EXPERIMENTS)]


onstart:
    # Only where the jobs run on this machine: a cluster's jobs start fresh processes.
    if config["forkserver"] and workflow.local_exec:
        forkserver.start(FORKSERVER_PRELOAD, paths.job_log("forkserver", RUN, "server"))


rule all:
    """Every experiment, its figures and tables, the kernel benchmark and the claims report."""
    default_target: True
    input:
        paths.bench_kernels_json(RUN),
        [t for nb in NOTEBOOK_ARTIFACTS for t in notebook_targets(nb)],
        [t for e in EXPERIMENTS for t in experiment_targets(e)],
        "figures/claims.md",


for _experiment in EXPERIMENTS:

    rule:
        name:
            _experiment
        input:
            experiment_targets(_experiment),


rule aggregate:
    """One CSV per experiment and run, one row per measurement of every point. update(): the
    previous CSV is kept until the new one replaces it (Snakemake would delete it before the
    job, and a point that fails to read would leave none)."""
    input:
        points=lambda wildcards: point_targets(wildcards.experiment),
        code=code("experiments.report.aggregate"),
    output:
        update(paths.aggregate_csv("{experiment}", RUN)),
    log:
        paths.job_log("{experiment}", RUN, "aggregate"),
    wildcard_constraints:
        experiment="|".join(EXPERIMENTS),
    shell:
        "{PYTHON_M} experiments.report.aggregate --out {output} {input.points} > {log} 2>&1"


def notebook_inputs(wildcards):
    """The notebook, the CSVs of every experiment it plots (or its artifacts of
    NOTEBOOK_ARTIFACTS), and the code it and the renderer run (the project modules the notebook
    imports)."""
    notebook = FIGURES / f"{wildcards.notebook}.ipynb"
    read = [e for e, spec in EXPERIMENTS.items() if wildcards.notebook in spec["notebooks"]]
    return ([str(notebook)] + [paths.aggregate_csv(e, RUN) for e in read]
            + NOTEBOOK_ARTIFACTS.get(wildcards.notebook, [])
            + code("experiments.report.render")
            + sources.notebook_sources(notebook, root=workflow.basedir))


rule render:
    """Execute a figure notebook headless: its figure (PNG, PDF) and table (Markdown, LaTeX)."""
    input:
        notebook_inputs,
    output:
        [paths.rendered("{notebook}", RUN, s) for s in RENDERED_SUFFIXES],
    log:
        paths.job_log("figures", RUN, "{notebook}"),
    wildcard_constraints:
        notebook="|".join([nb for e in EXPERIMENTS.values() for nb in e["notebooks"]]
                          + list(NOTEBOOK_ARTIFACTS)),
    shell:
        "{PYTHON_M} experiments.report.render {input[0]} --run {RUN} --artifacts artifacts"
        " --out figures/{RUN} > {log} 2>&1"


rule claims:
    """The papers' claims beside every run's numbers (all runs under artifacts/)."""
    input:
        [paths.aggregate_csv(e, RUN) for e in EXPERIMENTS],
        paths.bench_kernels_json(RUN),
        paper=[f"artifacts/paper/{name}" for name in ("memory_efficient_densenets.yaml",
                                                      "inplace_abn.yaml")],
        code=code("experiments.report.claims"),
    output:
        "figures/claims.md",
    log:
        "artifacts/logs/claims.log",
    shell:
        "{PYTHON_M} experiments.report.claims --artifacts artifacts --out {output} > {log} 2>&1"


rule bench_kernels:
    """InPlace-ABN kernels vs the PyTorch composite and vs a copy (the memory floor), every
    shape of the profile, contenders interleaved; one file per run like every artifact (its
    figure: notebook bench_kernels, its goals: the claims report)."""
    input:
        code=code("experiments.bench_kernels"),
    output:
        paths.bench_kernels_json(RUN),
    log:
        paths.job_log("bench_kernels", RUN, "bench_kernels"),
    threads: config["bench_kernels"]["threads"]
    resources:
        **cluster_resources(config["bench_kernels"]),
    params:
        shapes=" ".join(str(s) for shape in config["bench_kernels"]["shapes"] for s in shape),
        dtypes=" ".join(config["bench_kernels"]["dtypes"]),
        bench=config["bench_kernels"],
    shell:
        "{PYTHON_M} experiments.bench_kernels --device {DEVICE} --run {RUN} --shapes {params.shapes}"
        " --dtypes {params.dtypes} --threads {params.bench[threads]}"
        " --repeats {params.bench[repeats]} --warmup {params.bench[warmup]}"
        " --out {output} > {log} 2>&1"
