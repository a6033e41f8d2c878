"""What the Snakefile needs to plan InPlace-ABN Table 2's segmentation training: each point's
recipe, which capacity point and which ImageNet checkpoint it takes, and its command line.
Importing this module is cheap (no torch): the Snakefile imports it when parsed.

The profile section ``iabn_table2_segmentation`` holds ``defaults`` (the recipe every point
shares), ``pretrained`` (body -> the ``iabn_table1_imagenet`` point whose weights start it),
``top`` (Table 2 top: ``bodies`` x ``datasets``, each dataset's entry overriding the defaults
and optionally naming its own ``bodies``, x the four batch compilations of :data:`CONFIGS`) and ``bottom`` (Table 2 bottom: point name ->
the keys it overrides, including ``body``, ``norm``, ``dataset``, ``crops`` and ``crop``).

A top point takes its crops and crop size from the capacity point of the same data set and
body (the norm and mode in :data:`CONFIGS`): each data set has its own chain (its classes and
FIXED CROP crop: Cityscapes 512^2, COCO-Stuff 480^2 and 496^2), so Table 2's brackets and its
mIoU come from one chain; a
bottom point (the paper's tuned runs) states them. Every point's body has the architecture
arguments (``width``, ``preact``) of its ImageNet point, so the checkpoint fits.

The paper's test-set models: a bottom point may start from another point's trained network
(``init: <point>``, ``--init``: the Cityscapes test model is "Vistas pre-trained"; that point
trains first, and the two share body and normalisation) instead of the ImageNet weights, and
may train on training + validation (``train_val: true``: the Vistas test model).
``submissions`` (optional) names the prediction folders to write for the benchmark servers:
name -> ``{point, split, eval}`` (:func:`submission_specs`, :func:`submission_command`).
"""
import shlex

from ..records.forkserver import PYTHON_M
from .plan import model_arg_options, training_command

#: Table 2 top's batch compilations: name -> (norm, the capacity point's norm and mode).
CONFIGS = {
    "bn_fixed_crop": ("bn", "bn_fixed_crop"),
    "iabn_fixed_crop": ("iabn", "iabn_fixed_crop"),
    "iabn_fixed_batch": ("iabn", "iabn_fixed_batch"),
    "iabn_sync_fixed_batch": ("iabn_sync", "iabn_fixed_batch"),
}
#: Body arguments a segmentation body shares with its ImageNet checkpoint.
ARCHITECTURE_ARGS = ("width", "preact")


def _body_args(body, pretrained, training):
    point = pretrained[body]
    if point not in training:
        raise ValueError(f"iabn_table2_segmentation.pretrained.{body}={point!r}: not a point of "
                         f"iabn_table1_imagenet (points: {sorted(training)})")
    spec = training[point]
    if spec["model"] != body:
        raise ValueError(f"iabn_table2_segmentation.pretrained.{body}={point!r}: that point "
                         f"trains {spec['model']!r}, not {body!r}")
    return {k: v for k, v in spec["model_args"].items() if k in ARCHITECTURE_ARGS}


def point_specs(section, training):
    """``{point: spec}`` of the section; ``training`` is ``iabn_table1_imagenet``'s point specs
    (:func:`.plan.point_specs`). Each spec has the recipe keys, ``body``, ``dataset``,
    ``norm``, ``model_args`` (from the ImageNet point), ``pretrained`` (that point) and either
    ``capacity`` (a capacity point name) or ``crops`` and ``crop``."""
    defaults, pretrained = section["defaults"], section["pretrained"]
    specs = {}
    for dataset, overrides in section["top"]["datasets"].items():
        overrides = dict(overrides)
        bodies = overrides.pop("bodies", section["top"]["bodies"])
        for body in bodies:
            for config, (norm, capacity) in CONFIGS.items():
                specs[f"{body}_{dataset}_{config}"] = {
                    **defaults, **overrides, "body": body, "dataset": dataset, "norm": norm,
                    "config": config, "capacity": f"{dataset}_{body}_{capacity}"}
    for name, overrides in section["bottom"].items():
        if name in specs:
            raise ValueError(f"iabn_table2_segmentation.bottom.{name}: the name of a top point")
        specs[name] = {**defaults, **overrides, "config": "bottom", "capacity": None}
    for name, spec in specs.items():
        _check_init(name, spec, specs)
        if spec["body"] not in pretrained:
            raise ValueError(f"iabn_table2_segmentation: point {name} has body "
                             f"{spec['body']!r}, which has no pretrained entry")
        spec["pretrained"] = pretrained[spec["body"]]
        spec["model_args"] = _body_args(spec["body"], pretrained, training)
    return specs


def _check_init(name, spec, specs):
    """Raise ``ValueError`` unless a point's ``init`` (if any) is another point of the same body
    and normalisation that starts from ImageNet (one link: the chain stays visible)."""
    init = spec.get("init")
    if init is None:
        return
    source = specs.get(init)
    if source is None or init == name:
        raise ValueError(f"iabn_table2_segmentation point {name}: init {init!r} is not another "
                         f"point (points: {sorted(specs)})")
    if source.get("init") is not None:
        raise ValueError(f"iabn_table2_segmentation point {name}: init {init!r} itself starts "
                         "from another point; start from a point trained from ImageNet")
    for key in ("body", "norm", "output_stride"):
        if source[key] != spec[key]:
            raise ValueError(f"iabn_table2_segmentation point {name}: {key} {spec[key]!r} but "
                             f"its init point {init} has {source[key]!r}")


def submission_specs(section, specs):
    """``{name: {point, split, eval}}`` of the section's ``submissions`` (none without it);
    ``ValueError`` unless each names a point and one of that point's evaluations (the split
    is checked by the command, which knows the data sets)."""
    submissions = section.get("submissions") or {}
    for name, sub in submissions.items():
        spec = specs.get(sub["point"])
        if spec is None:
            raise ValueError(f"iabn_table2_segmentation.submissions.{name}: point "
                             f"{sub['point']!r} is not a point (points: {sorted(specs)})")
        if sub["eval"] not in spec["evals"]:
            raise ValueError(f"iabn_table2_segmentation.submissions.{name}: point "
                             f"{sub['point']} has no evaluation {sub['eval']!r} (its "
                             f"evaluations: {sorted(spec['evals'])})")
    return dict(submissions)


def submission_command(submission, spec, data_root, point_json, weights, predictions, out,
                       python_m=PYTHON_M):
    """The shell command that writes one submission folder (:mod:`.seg_predict`) with the
    point's device, dtype, threads and workers."""
    words = [*python_m, "experiments.train.seg_predict", "--point", point_json, "--weights",
             weights, "--data", data_root, "--split", submission["split"], "--eval",
             submission["eval"], "--predictions", predictions, "--out", out, "--device",
             spec["device"], "--dtype", spec["dtype"], "--threads", spec["threads"],
             "--workers", spec["workers"]]
    return shlex.join(str(w) for w in words)


def _check_chain(name, spec, capacity):
    """Raise ``ValueError`` unless the capacity experiment has points of the top point's own
    data set and body (``datasets.<dataset>.crops.<body>`` and ``bodies.<body>``)."""
    crops = capacity["datasets"].get(spec["dataset"], {}).get("crops", {})
    if spec["body"] not in crops or spec["body"] not in capacity["bodies"]:
        raise ValueError(f"iabn_table2_segmentation point {name}: no capacity point of data set "
                         f"{spec['dataset']!r} and body {spec['body']!r}, which give its crops: "
                         f"add iabn_table2_capacity.datasets.{spec['dataset']}.crops."
                         f"{spec['body']} (and bodies.{spec['body']})")


def check_capacity(specs, capacity):
    """Raise ``ValueError`` unless each top point has a capacity chain of its own data set and
    body (:func:`_check_chain`) and its body matches the capacity experiment's networks
    (``width``; ResNeXt's ``layout``): the brackets must be those of the trained network."""
    for name, spec in specs.items():
        if spec["capacity"] is None:
            continue
        _check_chain(name, spec, capacity)
        args = spec["model_args"]
        if args.get("width", 1.0) != capacity["width"]:
            raise ValueError(f"iabn_table2_segmentation point {name}: body width "
                             f"{args.get('width', 1.0)} (from its ImageNet point) differs from "
                             f"iabn_table2_capacity.width {capacity['width']}")
        if spec["body"] == "resnext101" and args.get("preact", False) != (
                capacity["layout"] == "preact"):
            raise ValueError(f"iabn_table2_segmentation point {name}: ResNeXt-101 "
                             f"preact={args.get('preact', False)} (from its ImageNet point) but "
                             f"iabn_table2_capacity.layout is {capacity['layout']!r}")


def _value(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


def arguments(spec, data_root, start_weights, capacity_json):
    """The options of one point (:mod:`experiments.train.seg_point`); ``start_weights`` are the
    ImageNet weights (``--pretrained``), or the ``init`` point's weights (``--init``)."""
    start = "--init" if spec.get("init") else "--pretrained"
    args = ["--dataset", spec["dataset"], "--data", data_root, "--body", spec["body"],
            "--norm", spec["norm"], "--output-stride", spec["output_stride"],
            start, start_weights, "--epochs", spec["epochs"], "--lr", spec["lr"],
            "--poly-power", spec["poly_power"], "--momentum", spec["momentum"],
            "--weight-decay", spec["weight_decay"], "--bootstrap-p", spec["bootstrap_p"],
            "--bootstrap-m", spec["bootstrap_m"], "--scale", *spec["scale"],
            "--workers", spec["workers"], "--seed", spec["seed"], "--device", spec["device"],
            "--dtype", spec["dtype"], "--threads", spec["threads"]]
    args += model_arg_options(spec["model_args"])
    if capacity_json is not None:
        args += ["--capacity", capacity_json]
    else:
        args += ["--crops", spec["crops"], "--crop", spec["crop"]]
    if spec["class_uniform"]:
        args.append("--class-uniform")
    if spec["coarse"]:
        args.append("--coarse")
    if spec.get("train_val"):
        args.append("--train-val")
    for name, ev in spec["evals"].items():
        scales = ",".join(_value(s) for s in ev["scales"])
        args += ["--eval", f"{name}={scales}:{'flip' if ev['flip'] else 'noflip'}"]
    if spec["eval_window"] is not None:
        args += ["--eval-window", spec["eval_window"]]
    args += ["--eval-every", spec["eval_every"]]
    return [str(a) for a in args]


def command(experiment, spec, data_root, start_weights, capacity_json, outputs,
            python_m=PYTHON_M):
    """The shell command that trains one point on ``spec["devices"]`` ranks
    (:func:`.plan.training_command`; ``python_m`` as there)."""
    return training_command(experiment, spec["devices"], spec["device"],
                            arguments(spec, data_root, start_weights, capacity_json),
                            outputs, python_m)


__all__ = ["ARCHITECTURE_ARGS", "CONFIGS", "arguments", "check_capacity", "command",
           "point_specs", "submission_command", "submission_specs"]
