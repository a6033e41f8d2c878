"""InPlace-ABN "on par with STD-BN" at small scale (experiments/iabn_digits_on_par.py): a small
ResNeXt trained with STD-BN and with InPlace-ABN on scikit-learn's real digits, one point per
seed.
Included by the Snakefile, which defines DEVICE, RUN, PYTHON_M, EXPERIMENTS, cluster_resources
and code.
"""


DIGITS = config["iabn_digits_on_par"]
EXPERIMENTS["iabn_digits_on_par"] = {
    "points": [f"seed{seed}" for seed in DIGITS["seeds"]],
    "notebooks": ["iabn_digits_on_par"],
}


rule iabn_digits_on_par_point:
    """One seed: both normalizations trained from the seed's weights, their validation
    accuracy."""
    input:
        code=code("experiments.iabn_digits_on_par"),
    output:
        paths.point_json("iabn_digits_on_par", RUN, "seed{seed}"),
    log:
        paths.job_log("iabn_digits_on_par", RUN, "seed{seed}"),
    benchmark:
        paths.job_benchmark("iabn_digits_on_par_point", RUN, "seed{seed}")
    wildcard_constraints:
        seed="|".join(str(seed) for seed in DIGITS["seeds"]),
    threads: DIGITS["threads"]
    resources:
        **cluster_resources(DIGITS),
    params:
        cfg=DIGITS,
    shell:
        "{PYTHON_M} experiments.iabn_digits_on_par --seed {wildcards.seed}"
        " --epochs {params.cfg[epochs]} --batch {params.cfg[batch]} --lr {params.cfg[lr]}"
        " --width {params.cfg[width]} --val-fraction {params.cfg[val_fraction]}"
        " --device {DEVICE} --threads {threads} --out {output} > {log} 2>&1"
