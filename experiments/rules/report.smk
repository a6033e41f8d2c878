"""What turns the points into the papers' figures and tables: one aggregated CSV per
experiment, the notebooks rendered headless, and the claims report. Included by the
Snakefile after every experiment family, which defines RUN, PYTHON_M, EXPERIMENTS,
NOTEBOOK_ARTIFACTS, FIGURES, RENDERED_SUFFIXES, point_targets and code.
"""


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
