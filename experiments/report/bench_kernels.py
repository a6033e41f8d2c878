"""The kernel benchmark's artifacts (``artifacts/bench_kernels/<run>.json``, written by
:mod:`experiments.bench_kernels`) as tables, for its notebook (``figures/bench_kernels.ipynb``)
and the claims report (pure pandas, no torch).
"""
import json
import os
from pathlib import Path

import pandas as pd

from ..records import paths

MS = 1e3
#: The contenders the table shows, and their columns.
TIMES = {"inplace_abn_fwd_bwd_II": "InPlace-ABN II fwd+bwd (ms)",
         "composite_fwd_bwd": "BN + leaky ReLU fwd+bwd (ms)",
         "inplace_abn_fwd_I": "InPlace-ABN fwd (ms)", "copy": "copy (ms)",
         "whole_steps_fwd_bwd": "whole-step operators alone fwd+bwd (ms)",
         "python_function_floor": "empty Python autograd function fwd+bwd (ms)"}


def runs(root):
    """The runs with a benchmark artifact under ``root``, sorted by name."""
    return sorted(p.stem for p in Path(paths.bench_kernels_json("_", root)).parent.glob("*.json"))


def load(run, root):
    """The benchmark artifact of ``run`` under ``root`` (a dict)."""
    path = Path(paths.bench_kernels_json(run, root))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist: run `snakemake --cores 2 bench_kernels`"
                                " for this profile first, or set ARTIFACTS_RUN") from None


def load_current():
    """``(report, run)`` for a notebook: the artifact of ``$ARTIFACTS_RUN``, else of the run
    whose benchmark was written last, under :func:`experiments.records.paths.artifacts_dir`."""
    root = paths.artifacts_dir()
    run = os.environ.get("ARTIFACTS_RUN") or max(
        runs(root), key=lambda r: Path(paths.bench_kernels_json(r, root)).stat().st_mtime,
        default="none")
    return load(run, root), run


def _shape(row):
    return "x".join(map(str, row["shape"]))


def goals(report):
    """One row per shape, dtype and goal, in the artifact's order: ``shape`` (``"NxCxHxW"``),
    ``dtype``, ``goal`` (the ratio's name), ``value``, ``comparison``, ``threshold``, ``met``,
    and ``copy_gbps``: the effective bandwidth of the row's copy (``None`` where the artifact
    has none), which the copy-relative goals are judged against."""
    return pd.DataFrame([{"shape": _shape(row), "dtype": row["dtype"], "goal": name, **goal,
                          "copy_gbps": _copy_bandwidth(row)}
                         for row in report["rows"] for name, goal in row["goals"].items()])


def _copy_bandwidth(row):
    """The effective bandwidth (GB/s) of the copy of an artifact's ``row``, or ``None``."""
    return row.get("results", {}).get("copy", {}).get("effective_bandwidth_GBps")


def table(report):
    """One row per shape and dtype: the medians of :data:`TIMES` (ms), the ratios, how many
    of the shape's goals are met, and every pass of the profile over the copy."""
    records = []
    for row in report["rows"]:
        record = {"shape": _shape(row), "dtype": row["dtype"]}
        record.update({column: row["results"][name]["median_s"] * MS
                       for name, column in TIMES.items() if name in row["results"]})
        record.update(row["ratios"])
        record["goals met"] = f"{sum(g['met'] for g in row['goals'].values())}/{len(row['goals'])}"
        record.update({f"{name} / copy": p["over_copy"] for name, p in row["profile"].items()})
        records.append(record)
    return pd.DataFrame(records)


def speedups(report):
    """One row per shape and dtype: ``shape``, ``dtype``, ``family`` (``"CxHxW"``: the shape
    without its batch size), ``batch``, ``tensor_mb`` (the tensor's size, MB), ``speedup``
    (``speedup_vs_composite``), ``python_floor`` (``python_floor_over_composite``),
    ``aten_inplace`` (``aten_inplace_over_composite``) and ``whole_steps``
    (``whole_steps_over_composite``; each ``None`` in an artifact that did not time it), for
    the crossover figure."""
    return pd.DataFrame([{"shape": _shape(row), "dtype": row["dtype"],
                          "family": "x".join(map(str, row["shape"][1:])),
                          "batch": row["shape"][0], "tensor_mb": row["tensor_bytes"] / 1e6,
                          "speedup": row["ratios"]["speedup_vs_composite"],
                          "python_floor": row["ratios"].get("python_floor_over_composite"),
                          "aten_inplace": row["ratios"].get("aten_inplace_over_composite"),
                          "whole_steps": row["ratios"].get("whole_steps_over_composite")}
                         for row in report["rows"]])


def _optional_ratio(value):
    """A ratio of :func:`speedups` as a float, ``None`` where it was not timed."""
    return None if value is None or pd.isna(value) else float(value)


def _shape_and_size(point):
    return None if point is None else f"{point['shape']} ({point['tensor_mb']:.2f} MB)"


def crossover(report):
    """Where ``InPlaceABN`` overtakes the composite, per dtype and family of shapes that differ
    in the batch size only (measured at two sizes at least).

    One row per dtype and family: ``dtype``, ``family``, ``sizes`` (how many were measured),
    ``slower_up_to`` (the largest measured shape at which the composite is faster, with its
    size; ``None``: none is), ``faster_from`` (the smallest measured shape from which
    ``InPlaceABN`` is at least as fast at every larger one; ``None``: not even the largest),
    ``python_floor_at_smallest`` (``python_floor_over_composite`` at the smallest measured
    size: the share of the composite's time that an in-place Python autograd function doing
    nothing takes), ``aten_inplace_at_smallest`` (``aten_inplace_over_composite`` there: the
    in-place layer on ATen operators over the composite) and ``whole_steps_at_smallest``
    (``whole_steps_over_composite`` there: the layer's whole-step operators alone over the
    composite; each ``None`` where not timed). The
    crossover lies between the two shapes; a family whose speedup goes below 1 again at a
    larger size has its ``slower_up_to`` above its first fast size, which the row shows as it
    is.
    """
    points = speedups(report)
    records = []
    for (dtype, family), rows in points.groupby(["dtype", "family"], sort=False):
        if len(rows) < 2:
            continue
        rows = rows.sort_values("tensor_mb")
        slower = rows[rows["speedup"] < 1.0]
        last_slow = None if slower.empty else slower.iloc[-1]
        faster = (rows if last_slow is None
                  else rows[rows["tensor_mb"] > last_slow["tensor_mb"]])
        first_fast = None if faster.empty else faster.iloc[0]
        smallest = rows.iloc[0]
        records.append({"dtype": dtype, "family": family, "sizes": len(rows),
                        "slower_up_to": _shape_and_size(last_slow),
                        "faster_from": _shape_and_size(first_fast),
                        "python_floor_at_smallest": _optional_ratio(smallest["python_floor"]),
                        "aten_inplace_at_smallest": _optional_ratio(smallest["aten_inplace"]),
                        "whole_steps_at_smallest": _optional_ratio(smallest["whole_steps"])})
    # object columns: a missing shape stays None beside strings (a string column makes it NaN)
    frame = pd.DataFrame(records, columns=["dtype", "family", "sizes", "slower_up_to",
                                           "faster_from", "python_floor_at_smallest",
                                           "aten_inplace_at_smallest",
                                           "whole_steps_at_smallest"],
                         dtype=object)
    return frame.astype({"sizes": int})


__all__ = ["crossover", "goals", "load", "load_current", "runs", "speedups", "table"]
