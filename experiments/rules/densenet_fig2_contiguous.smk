"""DenseNet Fig. 2 right (experiments/densenet_fig2_contiguous.py): a 3x3 convolution on a
contiguous vs a non-contiguous input, one point per input width.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources
and code.
"""


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
        paths.job_benchmark("densenet_fig2_contiguous_point", RUN, "c{in_channels}")
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
