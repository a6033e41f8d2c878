"""What the Snakefile needs to plan the training experiments: each point's full recipe and its
command line. Importing this module is cheap (no torch): the Snakefile imports it when parsed.

A training experiment's profile section holds ``defaults`` (a recipe every point shares) and
``points`` (point name -> the keys it overrides); :func:`point_specs` merges them, with
``model_args`` merged key by key (a ``null`` there removes a default argument).
:func:`command` turns one point into the shell command that trains it: ``python -m
experiments.<id> ...`` for one process (or the fork server's client in place of ``python -m``:
the ``python_m`` argument), ``python -m experiments.train.launch --standalone
--nproc-per-node N -m experiments.<id> ...`` for ``nproc`` ranks on the CPU (``torchrun``'s
options and agent, the ranks forked from a launcher that imported the module once:
:mod:`.launch`), ``torchrun --standalone --nproc-per-node N -m ...`` on CUDA.
:func:`generate_command` is the command of a generated data set, and :func:`generated_stamp`
the file that says it was generated (the generate rule's output).
"""
import shlex

from ..records.forkserver import PYTHON_M  # the Snakefile may pass the fork server's client

#: The file the generator writes into its ``--out`` folder once the data set is complete: the
#: generate rule's output. Not the data set's folder (Snakemake deletes a job's outputs before
#: it runs the job, so a profile's root naming a user's folder would be emptied) and not the
#: ownership marker inside the tree (deleted by Snakemake before a rerun, it could no longer
#: prove the old tree generated, and the rerun would have to refuse to replace it).
GENERATED_STAMP = ".generated.json"


def point_specs(section):
    """``{point: recipe}``: ``section["defaults"]`` updated by each point's overrides."""
    defaults = section["defaults"]
    specs = {}
    for name, overrides in section["points"].items():
        spec = {**defaults, **overrides}
        model_args = {**defaults.get("model_args", {}), **overrides.get("model_args", {})}
        spec["model_args"] = {k: v for k, v in model_args.items() if v is not None}
        specs[name] = spec
    return specs


def _value(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


def model_arg_options(model_args):
    """``["--model-arg", "key=value", ...]`` of a mapping of constructor arguments."""
    return [word for key, value in model_args.items()
            for word in ("--model-arg", f"{key}={_value(value)}")]




def launcher(nproc, device, python_m=PYTHON_M):
    """``python_m`` for one process; for ``nproc`` ranks on the CPU :mod:`.launch` run by
    ``python_m`` (``torchrun`` with the ranks forked from one import of the module: a small
    point's run is mostly imports), on CUDA ``torchrun`` itself (a point trains for hours
    there, and no CUDA process is then a fork)."""
    if nproc == 1:
        return list(python_m)
    if device == "cpu":
        return [*python_m, "experiments.train.launch", "--standalone",
                f"--nproc-per-node={nproc}", "-m"]
    return ["torchrun", "--standalone", f"--nproc-per-node={nproc}", "-m"]


def arguments(spec, data_root):
    """The training options of one point's recipe (:mod:`experiments.train.point`)."""
    args = ["--dataset", spec["dataset"], "--data", str(data_root), "--model", spec["model"],
            "--norm", spec["norm"], "--epochs", spec["epochs"], "--batch", spec["batch"],
            "--lr", spec["lr"], "--schedule", spec["schedule"], "--workers", spec["workers"],
            "--seed", spec["seed"], "--device", spec["device"], "--dtype", spec["dtype"],
            "--threads", spec["threads"]]
    args += model_arg_options(spec["model_args"])
    for key, value in spec.get("schedule_args", {}).items():
        args += ["--schedule-arg", f"{key}={_value(value)}"]
    if spec["dataset"] == "imagenet":
        args += ["--resize", spec["resize"], "--crop", spec["crop"],
                 "--crop-style", spec["crop_style"]]
        for name, ev in spec["evals"].items():
            args += ["--eval", f"{name}={ev['mode']}:{ev['resize']}:{ev['crop']}"]
    return [str(a) for a in args]


def generated_stamp(root):
    """``<root>/.generated.json``: the stamp of the data set generated at ``root``."""
    return f"{root}/{GENERATED_STAMP}"


def generate_command(dataset, spec, out, python_m=PYTHON_M):
    """The command that generates ``dataset`` at ``out`` from its profile's ``generate``
    mapping: each key becomes an option (``train_per_class: 100`` -> ``--train-per-class
    100``; a list, ``sizes: [256x128]``, gives its items)."""
    words = [*python_m, "experiments.train.data.generate", dataset, "--out", str(out)]
    for key, value in spec.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        words += [f"--{key.replace('_', '-')}", *(_value(v) for v in values)]
    return shlex.join(words)


def training_command(experiment, nproc, device, arguments, outputs, python_m=PYTHON_M):
    """``experiments.<experiment>`` on ``nproc`` ranks of ``device`` (:func:`launcher`) with
    ``arguments`` and the outputs of a training point (``outputs`` maps ``out``, ``epochs_csv``,
    ``weights``, ``work_dir`` to paths), as one shell command."""
    words = [*launcher(nproc, device, python_m), f"experiments.{experiment}", *arguments]
    for key in ("out", "epochs_csv", "weights", "work_dir"):
        words += [f"--{key.replace('_', '-')}", str(outputs[key])]
    return shlex.join(words)


def command(experiment, spec, data_root, outputs, python_m=PYTHON_M):
    """The shell command that trains one point (:func:`training_command`)."""
    return training_command(experiment, spec["nproc"], spec["device"],
                            arguments(spec, data_root), outputs, python_m)


__all__ = ["GENERATED_STAMP", "point_specs", "model_arg_options", "launcher", "arguments",
           "generated_stamp", "generate_command",
           "training_command", "command"]
