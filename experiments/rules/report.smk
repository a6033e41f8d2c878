"""What turns the points into the papers' figures and tables: one aggregated CSV per
experiment, the notebooks rendered headless, the claims report, and the record of the run.
Included by the Snakefile after every experiment family, which defines RUN, PYTHON_M,
EXPERIMENTS, NOTEBOOK_ARTIFACTS, FIGURES, RENDERED_SUFFIXES, ALL_TARGETS, SNAKEMAKE_PID,
point_targets and code.

`snakemake --report report.html` collects what these rules mark with report(): every
notebook's figure (PNG) and table (HTML) under its paper and experiment, and the claims, the
kernel benchmark and the run record under REPORT_SUMMARY, each with its caption
(experiments/rules/captions/, Jinja templates that name the profile of the run).
"""

report: "captions/workflow.rst"

#: The report's categories: a notebook's paper, named by the prefix of the notebook's name.
REPORT_PAPERS = {"densenet_": "Memory-efficient DenseNets (Pleiss et al. 2017)",
                 "iabn_": "In-Place Activated BatchNorm (Rota Bulò et al. 2018)"}
#: The report's category for what is no paper's figure: the kernel benchmark, what goes beyond
#: the papers, the claims report and the run record.
REPORT_SUMMARY = "Summary of the run"
#: The rendered files the report shows (the others are for papers and downloads).
REPORTED_SUFFIXES = {"png": "figure", "html": "table"}


def report_category(wildcards):
    """The paper of the notebook ``wildcards.notebook`` (REPORT_PAPERS), else REPORT_SUMMARY."""
    papers = [paper for prefix, paper in REPORT_PAPERS.items()
              if wildcards.notebook.startswith(prefix)]
    return papers[0] if papers else REPORT_SUMMARY


def rendered_output(suffix):
    """A file the render rule writes; a figure or table of REPORTED_SUFFIXES marked for the
    report, under its paper and notebook, labelled "figure" or "table"."""
    path = paths.rendered("{notebook}", RUN, suffix)
    if suffix not in REPORTED_SUFFIXES:
        return path
    return report(path, caption="captions/figure.rst", category=report_category,
                  subcategory="{notebook}", labels={"result": REPORTED_SUFFIXES[suffix]})


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
    benchmark:
        paths.job_benchmark("aggregate", RUN, "{experiment}")
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
    """Execute a figure notebook headless: its figure (PNG, PDF) and table (Markdown, LaTeX,
    HTML)."""
    input:
        notebook_inputs,
    output:
        [rendered_output(s) for s in RENDERED_SUFFIXES],
    log:
        paths.job_log("figures", RUN, "{notebook}"),
    benchmark:
        paths.job_benchmark("render", RUN, "{notebook}")
    wildcard_constraints:
        notebook="|".join([nb for e in EXPERIMENTS.values() for nb in e["notebooks"]]
                          + list(NOTEBOOK_ARTIFACTS)),
    shell:
        "{PYTHON_M} experiments.report.render {input[0]} --run {RUN} --artifacts artifacts"
        " --out figures/{RUN} > {log} 2>&1"


rule claims:
    """The papers' claims beside every run's numbers (all runs under artifacts/), in Markdown
    and as an HTML page for the report."""
    input:
        [paths.aggregate_csv(e, RUN) for e in EXPERIMENTS],
        paths.bench_kernels_json(RUN),
        paper=[f"artifacts/paper/{name}" for name in ("memory_efficient_densenets.yaml",
                                                      "inplace_abn.yaml")],
        code=code("experiments.report.claims"),
    output:
        markdown="figures/claims.md",
        html=report("figures/claims.html", caption="captions/claims.rst",
                    category=REPORT_SUMMARY, subcategory="claims"),
    log:
        "artifacts/logs/claims.log",
    benchmark:
        paths.job_benchmark("claims", RUN, "claims")
    shell:
        "({PYTHON_M} experiments.report.claims --artifacts artifacts --out {output.markdown}"
        " && {PYTHON_M} experiments.report.html_page {output.markdown} --out {output.html}"
        " --title 'Claims') > {log} 2>&1"


rule run_record:
    """The record of the run (experiments/records/run_record.py): machine, commit, versions,
    the run's wall and CPU time and each rule's job times from the benchmark files. Its inputs
    are every other target of `all`, so it is the run's last job and runs again whenever any
    job ran."""
    input:
        ALL_TARGETS,
        code=code("experiments.records.run_record"),
    output:
        json=paths.run_record(RUN, "json"),
        markdown=paths.run_record(RUN, "md"),
        html=report(paths.run_record(RUN, "html"), caption="captions/run_record.rst",
                    category=REPORT_SUMMARY, subcategory="run record"),
    log:
        paths.job_log("run_record", RUN, "run_record"),
    params:
        profile=config["profile"],
    shell:
        "{PYTHON_M} experiments.records.run_record --run {RUN} --profile {params.profile}"
        " --device {DEVICE} --benchmarks artifacts/benchmarks --snakemake-pid {SNAKEMAKE_PID}"
        " --out {output.json} > {log} 2>&1"
