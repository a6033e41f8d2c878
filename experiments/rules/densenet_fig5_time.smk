"""DenseNet Fig. 5 (experiments/densenet_fig5_time.py): time per minibatch of a DenseNet-BC,
every implementation interleaved in one job per depth.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources,
code and checked_depths.
"""


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
        paths.job_benchmark("densenet_fig5_time_point", RUN, "d{depth}")
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
