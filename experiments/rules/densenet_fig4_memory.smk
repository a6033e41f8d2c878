"""DenseNet Fig. 4 (experiments/densenet_fig4_memory.py): memory of a DenseNet-BC training step
per implementation and depth, measured at the profile's sizes and simulated at the paper's.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources,
code and checked_depths.
"""


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
        paths.job_benchmark("densenet_fig4_memory_point", RUN, "{impl}_d{depth}")
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
        paths.job_benchmark("densenet_fig4_memory_simulated_point", RUN, "simulated_{impl}")
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
