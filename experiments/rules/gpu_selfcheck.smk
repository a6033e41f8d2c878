"""The GPU self-check (experiments/gpu_selfcheck/): what a user with a CUDA GPU runs first.
Included by the Snakefile; not part of `all`.
"""


def _every_core(wildcards):
    """The self-check's threads: every core given to a local run (`--cores`). On a cluster there
    is no such total (each job asks for its own cores), and the job evaluates this again inside
    its allocation, as a remote run on a node whose cores it may not all have: there it is 1 on
    both sides unless `--set-threads gpu_selfcheck=N` sets it. A function, not `workflow.cores`
    itself: Snakemake evaluates a rule's plain value while it parses the Snakefile, and under
    a cluster executor that value raised for every target, not only for this rule's."""
    if workflow.local_exec and workflow.is_main_process:
        return workflow.cores
    return 1


rule gpu_selfcheck:
    """On a machine with a CUDA GPU: the layer tests on CUDA tensors, the numba.cuda kernels
    against the CPU kernels and PyTorch's (cuDNN) batch norm, and their times against a copy
    and F.batch_norm + activation; writes artifacts/gpu_selfcheck/<gpu name>.json and .md.
    Without a GPU it says so and writes nothing. It declares no output (the file name is the
    GPU's), so it runs whenever it is targeted: `snakemake --cores all gpu_selfcheck`. It
    fails (after writing both files) when a check or a layer test failed. The checks run in
    as many processes as the rule's threads (`--jobs`: every core given to snakemake; on a
    cluster, `--set-threads gpu_selfcheck=N`)."""
    threads: _every_core
    resources:
        gpu=1,
    shell:
        "python -m experiments.gpu_selfcheck --out artifacts/gpu_selfcheck --jobs {threads}"
