"""Beyond the papers (experiments/whole_step.py): the whole training step of ResNeXt-101,
WideResNet-38 and DenseNet-264, STD-BN vs InPlace-ABN, one point per network.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources
and code.
"""


WHOLE_STEP = config["whole_step"]
EXPERIMENTS["whole_step"] = {
    "points": list(WHOLE_STEP["networks"]),
    "notebooks": ["whole_step"],
}


rule whole_step_point:
    """One network's training step (forward, backward, SGD step) per normalization, timed
    interleaved, with its peak memory and the normalization layers' share."""
    input:
        code=code("experiments.whole_step"),
    output:
        paths.point_json("whole_step", RUN, "{network}"),
    log:
        paths.job_log("whole_step", RUN, "{network}"),
    benchmark:
        paths.job_benchmark("whole_step_point", RUN, "{network}")
    wildcard_constraints:
        network="|".join(WHOLE_STEP["networks"]),
    threads: WHOLE_STEP["threads"]
    resources:
        **cluster_resources(WHOLE_STEP),
    params:
        cfg=WHOLE_STEP,
        net=lambda wildcards: WHOLE_STEP["networks"][wildcards.network],
        modes=" ".join(WHOLE_STEP["modes"]),
        variants=" ".join(WHOLE_STEP["variants"]),
    shell:
        "{PYTHON_M} experiments.whole_step --network {wildcards.network}"
        " --width {params.net[width]} --batch {params.net[batch]} --size {params.net[size]}"
        " --classes {params.cfg[classes]} --modes {params.modes} --variants {params.variants}"
        " --device {DEVICE} --dtype {params.cfg[dtype]} --threads {threads}"
        " --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]} --out {output}"
        " > {log} 2>&1"
