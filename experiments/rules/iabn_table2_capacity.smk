"""InPlace-ABN Table 2 brackets (experiments/iabn_table2_capacity.py): the largest batch or crop
of a segmentation network within the memory budget, measured at the profile's sizes and
simulated at the paper's. segmentation.smk reads TABLE2 (each Table 2 cell's chain).
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources
and code.
"""


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
        paths.job_benchmark("iabn_table2_capacity_point", RUN, "{dataset}_{body}_{norm}_{mode}")
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
        paths.job_benchmark("iabn_table2_capacity_simulated_point", RUN,
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
