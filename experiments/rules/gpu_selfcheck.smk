"""The GPU self-check (experiments/gpu_selfcheck/): what a user with a CUDA GPU runs first.
Included by the Snakefile; not part of `all`.
"""


rule gpu_selfcheck:
    """On a machine with a CUDA GPU: the layer tests on CUDA tensors, the numba.cuda kernels
    against the CPU kernels and PyTorch's (cuDNN) batch norm, and their times against a copy
    and F.batch_norm + activation; writes artifacts/gpu_selfcheck/<gpu name>.json and .md.
    Without a GPU it says so and writes nothing. It declares no output (the file name is the
    GPU's), so it runs whenever it is targeted: `snakemake --cores all gpu_selfcheck`. It
    fails (after writing both files) when a check or a layer test failed. The checks run in
    as many processes as the rule's threads (`--jobs`: every core given to snakemake)."""
    threads: workflow.cores
    resources:
        gpu=1,
    shell:
        "python -m experiments.gpu_selfcheck --out artifacts/gpu_selfcheck --jobs {threads}"
