"""Derived numbers of the aggregated CSVs, shared by the notebooks and the claims report (pure
pandas, no torch): overheads relative to a baseline, memory saved relative to a baseline, and
how memory grows with depth.
"""
import numpy as np
import pandas as pd

MS = 1e3
MIB = 2.0 ** 20
GIB = 2.0 ** 30


def _missing(frame, columns, argument="frame"):
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{argument} lacks the columns {missing}; has {list(frame.columns)}")


def contiguity_overhead(frame):
    """Per ``(pass, in_channels)`` of ``densenet_fig2_contiguous``: the median times (ms) of
    both layouts and ``overhead_pct = 100 * (non_contiguous / contiguous - 1)``."""
    _missing(frame, ("pass", "in_channels", "layout", "median_s"))
    table = (frame.assign(time_ms=frame["median_s"] * MS)
             .pivot_table(index=["pass", "in_channels"], columns="layout", values="time_ms")
             .reset_index())
    table.columns.name = None
    table["overhead_pct"] = 100 * (table["non_contiguous"] / table["contiguous"] - 1)
    return table


def strategy_overhead(frame, baseline="standard"):
    """Per ``(module, strategy)`` of ``iabn_table1_timing``: median/min/max time (ms),
    ``overhead_pct`` (time relative to ``baseline`` in the same module), ``saved_mib`` (all
    saved bytes), ``saved_buffers`` (feature-map buffers) and ``memory_saving_pct`` (saved
    feature-map bytes relative to ``baseline``, as the paper counts them).
    Rows keep the frame's order (the order the points and strategies were measured in)."""
    _missing(frame, ("module", "strategy", "median_s", "min_s", "max_s", "saved_bytes",
                     "saved_map_bytes", "saved_buffers"))
    if baseline not in set(frame["strategy"]):
        raise ValueError(f"baseline={baseline!r} is not among the strategies "
                         f"{sorted(set(frame['strategy']))}")
    base = frame[frame["strategy"] == baseline].set_index("module")
    table = pd.DataFrame({
        "module": frame["module"],
        "strategy": frame["strategy"],
        "median_ms": frame["median_s"] * MS,
        "min_ms": frame["min_s"] * MS,
        "max_ms": frame["max_s"] * MS,
        "overhead_pct": 100 * (frame["median_s"].to_numpy()
                               / base.loc[frame["module"], "median_s"].to_numpy() - 1),
        "saved_mib": frame["saved_bytes"] / MIB,
        "saved_buffers": frame["saved_buffers"],
        "memory_saving_pct": 100 * (1 - frame["saved_map_bytes"].to_numpy()
                                    / base.loc[frame["module"], "saved_map_bytes"].to_numpy()),
    })
    return table.reset_index(drop=True)


# --------------------------------------------------------------------------- DenseNet Figs. 4, 5
#: ``status`` of a ``densenet_fig4_memory`` point whose step ran (vs ``out_of_memory``).
FITS = "ok"


def _baseline_rows(frame, baseline, key):
    """``frame``'s rows of the ``impl`` ``baseline``, indexed by ``key``; a clear error if none."""
    impls = sorted(set(frame["impl"]))
    if baseline not in impls:
        raise ValueError(f"baseline={baseline!r} is not among the implementations {impls}")
    return frame[frame["impl"] == baseline].set_index(key)


#: The ``memory`` of points simulated on the meta device (no GPU, no compute).
SIMULATED = "simulated_meta_device"


def simulated_rows(frame):
    """Which rows of ``frame`` are simulated (a boolean Series)."""
    if "memory" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["memory"].astype(object).fillna("").eq(SIMULATED)


def measured_points(frame):
    """``frame`` without its simulated rows (the points whose steps really ran)."""
    return frame[~simulated_rows(frame)]


def _simulated_records(frame, kind):
    """The simulated rows of ``frame`` whose ``kind`` is ``kind``."""
    if "kind" not in frame:
        return frame.iloc[:0]
    return frame[simulated_rows(frame) & frame["kind"].eq(kind)]


def simulated_memory_vs_depth(frame):
    """Per simulated ``(impl, depth)`` of ``densenet_fig4_memory`` (``--simulate`` points):
    ``param_count``, ``peak_gib`` (simulated tensor memory of a training step), ``fits`` (within
    the budget) and the peak by kind (``*_gib``), sorted by implementation and depth."""
    rows = _simulated_records(frame, "simulated_depth")
    if rows.empty:
        return pd.DataFrame(columns=["impl", "depth", "param_count", "peak_gib", "fits",
                                     "budget_gib"])
    kinds = [c for c in rows.columns
             if c.startswith("tensor_peak_") and c.endswith("_bytes") and c != "tensor_peak_bytes"]
    table = pd.DataFrame({"impl": rows["impl"], "depth": rows["depth"].astype(int),
                          "param_count": rows["param_count"],
                          "peak_gib": rows["tensor_peak_bytes"] / GIB,
                          "fits": rows["fits"].astype(bool),
                          "budget_gib": rows["memory_budget_gib"]})
    for column in kinds:
        table[column.removeprefix("tensor_peak_").removesuffix("_bytes") + "_gib"] = (
            rows[column] / GIB)
    return table.sort_values(["impl", "depth"]).reset_index(drop=True)


def simulated_deepest(frame):
    """Per implementation with a ``--simulate`` point: ``depth`` (the deepest 6n + 4 whose
    simulated step fits the budget; NaN if none), ``param_count``, ``peak_gib``, ``capped``
    (the search stopped at ``max_depth``, which fits), ``max_depth``, ``first_failing_depth``
    and ``budget_gib``."""
    rows = _simulated_records(frame, "simulated_deepest")
    if rows.empty:
        return pd.DataFrame(columns=["impl", "depth", "param_count", "peak_gib", "capped",
                                     "max_depth", "first_failing_depth", "budget_gib"])
    return pd.DataFrame({"impl": rows["impl"], "depth": rows["depth"],
                         "param_count": rows["param_count"],
                         "peak_gib": rows["tensor_peak_bytes"] / GIB,
                         "capped": rows["capped"].astype(bool), "max_depth": rows["max_depth"],
                         "first_failing_depth": rows["first_failing_depth"],
                         "budget_gib": rows["memory_budget_gib"]}).reset_index(drop=True)


#: DenseNet-BC's depths are ``6n + 4`` (three dense blocks of ``n`` layers and four others).
DEPTH_STEP = 6


def depth_at_budget(depths, peaks, budget):
    """The deepest DenseNet-BC depth ``6n + 4`` whose peak fits ``budget`` by a least-squares
    fit ``peak = a + b d + c d^2`` over ``(depths, peaks)``, or ``None`` with fewer than three
    depths.

    Quadratic because a DenseNet's parameters (and their gradients and optimizer state) grow
    with the square of its depth, its stored feature maps linearly or quadratically: the fit
    is the memory model that extends measured depths to the one where the budget is met.
    ``inf`` if the fitted peak never reaches the budget past the deepest depth given.
    """
    depths = np.asarray(depths, dtype=float)
    if len(np.unique(depths)) < 3:
        return None
    coefficients = np.polyfit(depths, np.asarray(peaks, dtype=float), 2)
    coefficients[-1] -= budget
    roots = [r.real for r in np.roots(coefficients) if abs(r.imag) < 1e-9
             and r.real >= depths.max()]
    if not roots:
        return float("inf")
    return int(DEPTH_STEP * ((min(roots) - 4) // DEPTH_STEP) + 4)


def memory_vs_depth(frame, baseline="naive"):
    """Per ``(impl, depth)`` of ``densenet_fig4_memory``, in the frame's order: ``status``,
    ``param_count``, ``saved_mib``, ``peak_mib``, ``lower_bound_mib``,
    ``saved_over_lower_bound``, ``saved_vs_baseline_pct`` (saved bytes as a percentage of
    ``baseline``'s at the same depth; NaN where either did not fit or ``baseline`` was not
    measured at that depth) and ``median_ms``. Points that ran out of memory keep their row,
    with NaN measurements. Simulated points are left out (:func:`simulated_memory_vs_depth`)."""
    frame = measured_points(frame)
    _missing(frame, ("impl", "depth", "status", "param_count", "saved_bytes", "peak_bytes",
                     "lower_bound_bytes", "median_s"))
    base = frame[(frame["impl"] == baseline) & (frame["status"] == FITS)].set_index("depth")
    base_saved = base["saved_bytes"].reindex(frame["depth"]).to_numpy()
    return pd.DataFrame({
        "impl": frame["impl"],
        "depth": frame["depth"],
        "status": frame["status"],
        "param_count": frame["param_count"],
        "saved_mib": frame["saved_bytes"] / MIB,
        "peak_mib": frame["peak_bytes"] / MIB,
        "lower_bound_mib": frame["lower_bound_bytes"] / MIB,
        "saved_over_lower_bound": frame["saved_bytes"] / frame["lower_bound_bytes"],
        "saved_vs_baseline_pct": 100 * frame["saved_bytes"].to_numpy() / base_saved,
        "median_ms": frame["median_s"] * MS,
    }).reset_index(drop=True)


def growth_with_depth(frame, column="saved_bytes"):
    """Per ``impl`` of ``densenet_fig4_memory``: how ``column`` grows with depth.

    A least-squares fit ``column = a + b d + c d^2`` over the depths whose step fitted (for
    equally spaced depths ``2 c h^2`` is the mean second difference, ``h`` the spacing);
    ``quadratic_share = c D^2 / column(D)`` at the deepest such depth ``D``: about 1 for memory
    quadratic in depth, about 0 for memory linear in depth. Columns: ``impl``, ``depths``
    (how many), ``deepest``, ``quadratic_coef``, ``linear_coef``, ``quadratic_share``; NaN
    coefficients for an implementation with fewer than three depths. Simulated points are left
    out.
    """
    frame = measured_points(frame)
    _missing(frame, ("impl", "depth", "status", column))
    rows = []
    for impl, group in frame[frame["status"] == FITS].groupby("impl", sort=False):
        group = group.sort_values("depth")
        depth = group["depth"].to_numpy(dtype=float)
        value = group[column].to_numpy(dtype=float)
        c = b = share = float("nan")
        if len(np.unique(depth)) >= 3:
            c, b, _ = np.polyfit(depth, value, 2)
            share = c * depth[-1] ** 2 / value[-1]
        rows.append({"impl": impl, "depths": len(depth), "deepest": int(depth[-1]),
                     "quadratic_coef": c, "linear_coef": b, "quadratic_share": share})
    return pd.DataFrame(rows, columns=["impl", "depths", "deepest", "quadratic_coef",
                                       "linear_coef", "quadratic_share"])


def time_vs_baseline(frame, baseline="naive"):
    """Per ``(depth, impl)`` of ``densenet_fig5_time``, in the frame's order: median/min/max
    time per minibatch (ms), ``ratio`` (median over ``baseline``'s median at the same depth)
    and ``overhead_pct = 100 * (ratio - 1)``."""
    _missing(frame, ("depth", "impl", "median_s", "min_s", "max_s"))
    base = _baseline_rows(frame, baseline, "depth")
    ratio = frame["median_s"].to_numpy() / base["median_s"].reindex(frame["depth"]).to_numpy()
    return pd.DataFrame({
        "depth": frame["depth"],
        "impl": frame["impl"],
        "median_ms": frame["median_s"] * MS,
        "min_ms": frame["min_s"] * MS,
        "max_ms": frame["max_s"] * MS,
        "ratio": ratio,
        "overhead_pct": 100 * (ratio - 1),
    }).reset_index(drop=True)


__all__ = ["contiguity_overhead", "strategy_overhead", "memory_vs_depth", "growth_with_depth",
           "time_vs_baseline", "measured_points", "simulated_rows", "simulated_memory_vs_depth",
           "simulated_deepest", "depth_at_budget", "SIMULATED", "DEPTH_STEP"]
