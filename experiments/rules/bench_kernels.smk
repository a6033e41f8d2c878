"""The InPlace-ABN kernel benchmark (experiments/bench_kernels.py): its figure is the notebook
bench_kernels (NOTEBOOK_ARTIFACTS), its goals are in the claims report. Included by the
Snakefile, which defines DEVICE, RUN, PYTHON_M, cluster_resources and code.
"""


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
    benchmark:
        paths.job_benchmark("bench_kernels", RUN, "bench_kernels")
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
