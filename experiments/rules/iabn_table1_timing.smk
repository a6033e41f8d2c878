"""InPlace-ABN Table 1 right (experiments/iabn_table1_timing.py): BN+ACT+CONV time and saved
memory per strategy, one point per ResNet module.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources
and code.
"""


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
        paths.job_benchmark("iabn_table1_timing_point", RUN, "{module}")
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
