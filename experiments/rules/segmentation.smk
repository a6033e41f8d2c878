"""InPlace-ABN Table 2: segmentation training (experiments/iabn_table2_segmentation.py).
Included by the Snakefile after training.smk, whose TRAINING, dataset_root, dataset_inputs and
training_outputs it uses.

Each point is one job of `devices` ranks (experiments/train/plan.py's launcher: torchrun on
cuda; on the CPU torchrun's agent with the ranks forked from one import, gloo processes).
Its inputs chain the experiments as the paper does: the body's ImageNet weights are a Table 1
point's output (so classification trains first), and a Table 2 top point's crops and crop
size are the capacity point's result for the same data set and body (experiments/train/seg_plan.py), so
the table's brackets and its mIoU come from one chain; a point with `init` starts from another
point's trained network instead (the paper's Vistas-pretrained Cityscapes test model).

The profile's `submissions` are the test-set rows' prediction folders for the benchmark servers
(experiments/train/seg_predict.py), under artifacts/submissions/<run>/<name>/ with the run's
record beside, <name>.json; the target `iabn_table2_submissions` writes them all. They are not
part of the default target: the test sets are the user's downloads, scored by the servers.
"""
from experiments.train import seg_plan

SEGMENTATION = {name: {**spec, "device": DEVICE} for name, spec in seg_plan.point_specs(
    config["iabn_table2_segmentation"], TRAINING["iabn_table1_imagenet"]).items()}
seg_plan.check_capacity(SEGMENTATION, TABLE2)
SUBMISSIONS = seg_plan.submission_specs(config["iabn_table2_segmentation"], SEGMENTATION)
EXPERIMENTS["iabn_table2_segmentation"] = {"points": list(SEGMENTATION),
                                           "notebooks": ["iabn_table2_segmentation"]}


def chained_inputs(spec):
    """``(ImageNet weights or the init point's weights, capacity point JSON or None)`` a point's
    command reads."""
    capacity = spec["capacity"]
    start = (paths.weights("iabn_table2_segmentation", RUN, spec["init"]) if spec.get("init")
             else paths.weights("iabn_table1_imagenet", RUN, spec["pretrained"]))
    return (start,
            None if capacity is None else paths.point_json("iabn_table2_capacity", RUN, capacity))


def segmentation_inputs(wildcards):
    spec = SEGMENTATION[wildcards.point]
    pretrained, capacity = chained_inputs(spec)
    inputs = {"data": dataset_inputs(spec["dataset"]), "pretrained": pretrained}
    if capacity is not None:
        inputs["capacity"] = capacity
    return inputs


def segmentation_command(wildcards):
    # A function of the wildcards only: Snakemake records such params, so a changed profile
    # value reruns the point (params that read `input` are not recorded).
    spec = SEGMENTATION[wildcards.point]
    return seg_plan.command("iabn_table2_segmentation", spec, dataset_root(spec["dataset"]),
                            *chained_inputs(spec),
                            training_outputs("iabn_table2_segmentation", wildcards.point),
                            PYTHON_M_WORDS)


rule iabn_table2_segmentation_point:
    """One cell of InPlace-ABN Table 2: DeepLabV3 trained from its ImageNet body, with the
    capacity experiment's batch compilation, evaluated by mIoU."""
    input:
        unpack(segmentation_inputs),
        code=code("experiments.iabn_table2_segmentation"),
    output:
        point=paths.point_json("iabn_table2_segmentation", RUN, "{point}"),
        epochs=paths.epochs_csv("iabn_table2_segmentation", RUN, "{point}"),
        weights=paths.weights("iabn_table2_segmentation", RUN, "{point}"),
    log:
        paths.job_log("iabn_table2_segmentation", RUN, "{point}"),
    benchmark:
        paths.job_benchmark("iabn_table2_segmentation_point", RUN, "{point}")
    wildcard_constraints:
        point="|".join(SEGMENTATION),
    threads:
        lambda wildcards: (SEGMENTATION[wildcards.point]["threads"]
                           * SEGMENTATION[wildcards.point]["devices"])
    resources:
        **cluster_resources(config["iabn_table2_segmentation"]["defaults"],
                            gpus=lambda wildcards: (
                                SEGMENTATION[wildcards.point]["devices"] if GPU else 0)),
    params:
        command=segmentation_command,
    shell:
        "{params.command} > {log} 2>&1"


def submission_paths(name):
    """``(prediction folder, record JSON)`` of submission ``name``."""
    return f"artifacts/submissions/{RUN}/{name}", f"artifacts/submissions/{RUN}/{name}.json"


def submission_inputs(wildcards):
    sub = SUBMISSIONS[wildcards.submission]
    spec = SEGMENTATION[sub["point"]]
    return {"data": dataset_inputs(spec["dataset"]),
            "point": paths.point_json("iabn_table2_segmentation", RUN, sub["point"]),
            "weights": paths.weights("iabn_table2_segmentation", RUN, sub["point"])}


def submission_command(wildcards):
    # A function of the wildcards only, as segmentation_command.
    sub = SUBMISSIONS[wildcards.submission]
    spec = SEGMENTATION[sub["point"]]
    return seg_plan.submission_command(
        sub, spec, dataset_root(spec["dataset"]),
        paths.point_json("iabn_table2_segmentation", RUN, sub["point"]),
        paths.weights("iabn_table2_segmentation", RUN, sub["point"]),
        *submission_paths(wildcards.submission), PYTHON_M_WORDS)


rule iabn_table2_submission:
    """One test-set row's predictions in its benchmark's format, by the row's trained point
    and its evaluation protocol (single scale, or 5 scales + flipping)."""
    input:
        unpack(submission_inputs),
        code=code("experiments.train.seg_predict"),
    output:
        predictions=directory(submission_paths("{submission}")[0]),
        record=submission_paths("{submission}")[1],
    log:
        paths.job_log("iabn_table2_submission", RUN, "{submission}"),
    wildcard_constraints:
        submission="|".join(SUBMISSIONS) or "(?!)",
    threads:
        lambda wildcards: SEGMENTATION[SUBMISSIONS[wildcards.submission]["point"]]["threads"]
    resources:
        **cluster_resources(config["iabn_table2_segmentation"]["defaults"], gpus=GPU),
    params:
        command=submission_command,
    shell:
        "{params.command} > {log} 2>&1"


rule iabn_table2_submissions:
    """Every submission folder of the profile (the benchmark servers' inputs)."""
    input:
        [path for name in SUBMISSIONS for path in submission_paths(name)],
