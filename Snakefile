"""Every experiment of both papers is a rule; `rule all` builds every table and figure.

    snakemake --cores all                          # default profile (CPU, minutes)
    snakemake --cores all --config profile=paper   # the papers' sizes, on GPUs
"""
import yaml

PROFILE = config.get("profile", "smoke")
with open(f"experiments/config/{PROFILE}.yaml") as handle:
    config = {**yaml.safe_load(handle), **config}
DEVICE = config["device"]


rule all:
    input:
        f"artifacts/bench_kernels/{DEVICE}.json",


rule bench_kernels:
    """InPlace-ABN kernels vs the PyTorch composite and vs a copy (the memory floor)."""
    output:
        "artifacts/bench_kernels/{device}.json",
    log:
        "artifacts/logs/bench_kernels/{device}.log",
    params:
        shape=" ".join(str(s) for s in config["bench_kernels"]["shape"]),
        bench=config["bench_kernels"],
    shell:
        "python -m experiments.bench_kernels --device {wildcards.device} --shape {params.shape}"
        " --dtype {params.bench[dtype]} --threads {params.bench[threads]}"
        " --repeats {params.bench[repeats]} --warmup {params.bench[warmup]}"
        " --out {output} > {log} 2>&1"
