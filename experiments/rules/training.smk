"""The training experiments (DenseNet Fig. 2 left and Fig. 6, InPlace-ABN Table 1 left) and
the data sets they train on. Included by the Snakefile, which defines DEVICE, GPU, RUN,
EXPERIMENTS, cluster_resources and code.

A training point is one job: one process, or N ranks (experiments/train/plan.py's launcher:
`torchrun` on cuda, on the CPU torchrun's agent with the ranks forked from one import of the
experiment) that take N units of the `gpu` resource on cuda (N gloo processes on the CPU).
Its recipe is the profile section's `defaults` updated by the point's entry
(experiments/train/plan.py); its outputs are the point JSON, the per-epoch CSV and the trained
weights; an unfinished point's checkpoint (artifacts/checkpoints/...) is not an output, so a
killed job resumes when it is run again.
"""
import shlex

from experiments.train import plan

DATASETS = config["datasets"]


def dataset_root(name):
    """The data set's root (a folder of the user's, or one the generate rule fills)."""
    return DATASETS[name]["root"]


def dataset_inputs(name):
    """What a point training on ``name`` waits for: the generated data set's stamp, if any."""
    return [plan.generated_stamp(dataset_root(name))] if DATASETS[name]["generate"] else []


for _name, _spec in DATASETS.items():
    if not _spec["generate"]:
        continue

    rule:
        """A small, learnable data set in the released on-disk format (CIFAR python batches,
        an ImageNet ImageFolder tree of JPEGs, Cityscapes, COCO-Stuff and Vistas trees),
        written whole or not at all. The output is the generator's stamp, never the root
        itself: Snakemake deletes a job's outputs before running it, and the root may name a
        folder of the user's. --overwrite replaces only a tree the generator made (it holds
        its marker); a root holding anything else stops the job with an error naming it."""
        name:
            f"generate_{_name}"
        input:
            code=code("experiments.train.data.generate"),
        output:
            plan.generated_stamp(_spec["root"]),
        log:
            f"artifacts/logs/data/{_name}.log",
        benchmark:
            paths.job_benchmark(f"generate_{_name}", RUN, _name)
        params:
            command=plan.generate_command(_name, _spec["generate"], _spec["root"],
                                          PYTHON_M_WORDS),
        shell:
            "{params.command} --overwrite > {log} 2>&1"


TRAINING = {experiment: {name: {**spec, "device": DEVICE}
                         for name, spec in plan.point_specs(config[experiment]).items()}
            for experiment in ("densenet_fig2_preact", "densenet_fig6_imagenet",
                               "iabn_table1_imagenet")}
PARITY = config["iabn_table1_imagenet"]["parity"]

# Each training experiment has one notebook of its own name; Table 1 adds its parity points.
for _experiment, _points in TRAINING.items():
    EXPERIMENTS[_experiment] = {"points": list(_points), "notebooks": [_experiment]}
EXPERIMENTS["iabn_table1_imagenet"]["points"] += [f"parity_{model}" for model in PARITY["models"]]


def training_outputs(experiment, point):
    return {"out": paths.point_json(experiment, RUN, point),
            "epochs_csv": paths.epochs_csv(experiment, RUN, point),
            "weights": paths.weights(experiment, RUN, point),
            "work_dir": paths.work_dir(experiment, RUN, point)}


for _experiment, _points in TRAINING.items():

    rule:
        name:
            f"{_experiment}_point"
        input:
            data=lambda wildcards, e=_experiment: dataset_inputs(
                TRAINING[e][wildcards.point]["dataset"]),
            code=code(f"experiments.{_experiment}"),
        output:
            point=paths.point_json(_experiment, RUN, "{point}"),
            epochs=paths.epochs_csv(_experiment, RUN, "{point}"),
            weights=paths.weights(_experiment, RUN, "{point}"),
        log:
            paths.job_log(_experiment, RUN, "{point}"),
        benchmark:
            paths.job_benchmark(f"{_experiment}_point", RUN, "{point}")
        wildcard_constraints:
            point="|".join(_points),
        threads:
            lambda wildcards, e=_experiment: (TRAINING[e][wildcards.point]["threads"]
                                              * TRAINING[e][wildcards.point]["nproc"])
        resources:
            **cluster_resources(config[_experiment]["defaults"],
                                gpus=lambda wildcards, e=_experiment: (
                                    TRAINING[e][wildcards.point]["nproc"] if GPU else 0)),
        params:
            command=lambda wildcards, e=_experiment: plan.command(
                e, TRAINING[e][wildcards.point],
                dataset_root(TRAINING[e][wildcards.point]["dataset"]),
                training_outputs(e, wildcards.point), PYTHON_M_WORDS),
        shell:
            "{params.command} > {log} 2>&1"


rule iabn_table1_imagenet_parity:
    """STD-BN + leaky ReLU vs InPlace-ABN trained side by side in float64 (one model)."""
    input:
        data=dataset_inputs("imagenet"),
        code=code("experiments.iabn_table1_imagenet"),
    output:
        paths.point_json("iabn_table1_imagenet", RUN, "parity_{model}"),
    log:
        paths.job_log("iabn_table1_imagenet", RUN, "parity_{model}"),
    benchmark:
        paths.job_benchmark("iabn_table1_imagenet_parity", RUN, "parity_{model}")
    wildcard_constraints:
        model="|".join(PARITY["models"]),
    threads: PARITY["threads"]
    resources:
        **cluster_resources(PARITY),
    params:
        cfg=PARITY,
        root=dataset_root("imagenet"),
        model_args=lambda wildcards: shlex.join(
            plan.model_arg_options(PARITY["models"][wildcards.model])),
    shell:
        "{PYTHON_M} experiments.iabn_table1_imagenet parity --data {params.root}"
        " --model {wildcards.model} {params.model_args} --steps {params.cfg[steps]}"
        " --batch {params.cfg[batch]} --resize {params.cfg[resize]} --crop {params.cfg[crop]}"
        " --lr {params.cfg[lr]} --device {DEVICE} --threads {threads} --out {output}"
        " > {log} 2>&1"
