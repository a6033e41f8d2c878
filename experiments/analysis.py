"""Derived numbers of the aggregated CSVs, shared by the notebooks and the claims report (pure
pandas, no torch): overheads relative to a baseline, memory saved relative to a baseline.
"""
import pandas as pd

MS = 1e3
MIB = 2.0 ** 20


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


__all__ = ["contiguity_overhead", "strategy_overhead"]
