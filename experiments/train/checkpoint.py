"""Resumable training checkpoints: written atomically, read with ``weights_only=True``, checked
against the run they resume.

A checkpoint is one ``torch.save`` file holding only tensors and plain containers (so
``torch.load(..., weights_only=True)`` reads it and no pickled code runs on load)::

    {"format": FORMAT,            # this module's layout version
     "fingerprint": {...},        # the run's configuration (see engine.fingerprint)
     "epoch": int,                # epochs completed = the next epoch to run (its sampler epoch)
     "model": state_dict,         # the unwrapped model (no DDP "module." prefix)
     "optimizer": state_dict,
     "scheduler": state_dict,     # step count + the schedule's description
     "rng": [per-rank {"torch", "cuda", "numpy", "python"}],
     "metrics": [per-epoch rows], # the metrics CSV's rows so far
     "final": {...}}              # the last evaluation's results per evaluation set

:func:`save` writes a temporary file beside the destination, flushes it to disk and renames it
over the destination, so a run killed at any moment leaves either the previous checkpoint or the
new one, never half a file. :func:`load` turns anything unreadable (truncated, not a checkpoint,
wrong layout) into :class:`CorruptCheckpointError` and a checkpoint of another configuration
into :class:`CheckpointMismatchError`, both naming the file and what is wrong: a run never
silently starts afresh over a checkpoint it cannot use.
"""
import os
import random
from pathlib import Path

import numpy as np
import torch

from ..records.atomic import atomic_path

FORMAT = "experiments.train.checkpoint/1"
KEYS = ("format", "fingerprint", "epoch", "model", "optimizer", "scheduler", "rng", "metrics",
        "final")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used to resume this run."""


class CorruptCheckpointError(CheckpointError):
    """The file is not a readable checkpoint (truncated, damaged, or another kind of file)."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a run with another configuration or model."""


def save(path, state):
    """Write ``state`` (a dict with :data:`KEYS`; ``format`` is filled in) to ``path``
    atomically."""
    state = {**state, "format": FORMAT}
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise ValueError(f"checkpoint state: missing {missing}")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def load(path, fingerprint=None, map_location="cpu"):
    """Read the checkpoint at ``path`` with ``weights_only=True``; check it against
    ``fingerprint`` (if given).

    Raises ``FileNotFoundError`` if there is no file, :class:`CorruptCheckpointError` if it
    cannot be read or lacks the layout's keys, :class:`CheckpointMismatchError` naming each
    differing fingerprint entry.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path}: no such file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CorruptCheckpointError(
            f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); it is "
            f"truncated or damaged. Delete it to restart the run from scratch, or restore a "
            f"good copy; it is not replaced silently.") from error
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CorruptCheckpointError(f"checkpoint {path}: expected format {FORMAT!r}, found "
                                     f"{found!r}")
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise CorruptCheckpointError(f"checkpoint {path}: missing entries {missing}")
    if fingerprint is not None:
        differences = compare(state["fingerprint"], fingerprint)
        if differences:
            raise CheckpointMismatchError(
                f"checkpoint {path} belongs to another run configuration: "
                + "; ".join(differences)
                + ". Use another run directory, or delete the checkpoint to start afresh.")
    return state


def compare(saved, current, prefix=""):
    """Human-readable differences between two fingerprints (nested dicts); empty if equal."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}{key}"
            if key not in saved:
                out.append(f"{name}: absent in the checkpoint, {current[key]!r} now")
            elif key not in current:
                out.append(f"{name}: {saved[key]!r} in the checkpoint, absent now")
            else:
                out.extend(compare(saved[key], current[key], name + "."))
        return out
    if saved != current:
        return [f"{prefix.rstrip('.')}: {saved!r} in the checkpoint, {current!r} now"]
    return []


def model_differences(saved_state, model):
    """How ``saved_state`` (a state dict) differs from ``model``'s: missing/unexpected keys,
    shapes and dtypes; an empty list when it loads exactly."""
    current = model.state_dict()
    out = []
    missing = [k for k in current if k not in saved_state]
    unexpected = [k for k in saved_state if k not in current]
    if missing:
        out.append(f"keys missing from the checkpoint: {missing[:5]}"
                   + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    if unexpected:
        out.append(f"keys the model lacks: {unexpected[:5]}"
                   + (f" (+{len(unexpected) - 5} more)" if len(unexpected) > 5 else ""))
    for key, value in current.items():
        saved = saved_state.get(key)
        if saved is None or not torch.is_tensor(saved):
            continue
        if saved.shape != value.shape:
            out.append(f"{key}: shape {tuple(saved.shape)} in the checkpoint, "
                       f"{tuple(value.shape)} in the model")
        elif saved.dtype != value.dtype:
            out.append(f"{key}: dtype {saved.dtype} in the checkpoint, {value.dtype} in the model")
    return out


def load_model(path, model, saved_state):
    """Load ``saved_state`` into ``model`` exactly (no silent casts or partial loads)."""
    differences = model_differences(saved_state, model)
    if differences:
        raise CheckpointMismatchError(f"checkpoint {path}: its model does not match this run's: "
                                      + "; ".join(differences))
    model.load_state_dict(saved_state, strict=True)


def capture_rng(device):
    """This process's random states (torch CPU, the CUDA device's if ``device`` is CUDA, numpy,
    python ``random``) as tensors and plain lists, loadable with ``weights_only=True``."""
    device = torch.device(device)
    np_state = np.random.get_state(legacy=False)
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }


def restore_rng(state, device):
    """Set this process's random states from :func:`capture_rng`'s output."""
    device = torch.device(device)
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


__all__ = ["FORMAT", "KEYS", "CheckpointError", "CheckpointMismatchError",
           "CorruptCheckpointError", "capture_rng", "compare", "load", "load_model",
           "model_differences", "restore_rng", "save"]
