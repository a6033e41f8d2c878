"""The claims report's section on the whole training step (experiments/whole_step.py): beyond
the papers, so not a claim of theirs and not in ``artifacts/paper/``.

Per run, network and InPlace-ABN contender: its step time over STD-BN's in the same process
and mode, beside the paper's block figure (INPLACE-ABN I over STANDARD, read from the claim
``iabn_time_overhead`` of ``artifacts/paper/inplace_abn.yaml``: a BN+ACT+CONV block, not a
network); the peak memory it saves at the same batch; STD-BN's share of the step in the
normalization layers and the host time per layer call; and this project's goal
(:data:`experiments.whole_step.CPU_GOAL` on the CPU, :data:`~experiments.whole_step.GPU_GOAL`
on CUDA), as the point judged it (``goal_bound``, ``goal_met``; "does not apply" where neither
does).
"""
from pathlib import Path

import pandas as pd
import yaml

from ..records import paths

EXPERIMENT = "whole_step"
#: The paper's claim whose figure the whole-step overhead is shown beside.
BLOCK_CLAIM = ("inplace_abn.yaml", "iabn_time_overhead")


def block_figure(artifacts):
    """The paper's block overhead as text, ``"+0.8-2% time (...setting)"``, from its YAML."""
    name, claim_id = BLOCK_CLAIM
    document = yaml.safe_load((Path(artifacts) / "paper" / name).read_text(encoding="utf-8"))
    claim = next(c for c in document["claims"] if c["id"] == claim_id)
    return f"{claim['claimed']} ({claim['setting']})"


def rows(frame):
    """The section's rows of one run's CSV ``frame``: every ``iabn`` contender in every mode,
    with its network's ``bn`` norm share and host time per call beside it."""
    bn = frame[frame["norm"] == "bn"].set_index(["network", "mode"])
    out = []
    for r in frame[frame["norm"] == "iabn"].itertuples(index=False):
        base = bn.loc[(r.network, r.mode)]
        setup = r.network if pd.isna(r.impl) else f"{r.network} {r.impl}"
        met = "does not apply" if pd.isna(r.goal_met) else (
            "**yes**" if _true(r.goal_met) else "**no**")
        out.append({
            "network": setup, "norm": f"iabn {r.variant}", "mode": r.mode,
            "batch": int(r.batch),
            "time vs bn": f"{100 * (r.time_vs_bn - 1):+.1f}%",
            "memory saved": "-" if pd.isna(r.memory_saved_pct) else f"{r.memory_saved_pct:.1f}%",
            "bn norm share": f"{base['norm_share']:.2f}",
            "host us / call (bn, iabn)": f"{_us(base['norm_host_us_per_call'])}, "
                                         f"{_us(r.norm_host_us_per_call)}",
            "goal": "-" if pd.isna(r.goal_bound) else f"time vs bn <= {r.goal_bound:.3f}",
            "met": met})
    return pd.DataFrame(out)


def _true(value):
    """A CSV boolean (``True``/``"True"``) as a bool."""
    return str(value).lower() == "true"


def _us(value):
    return "-" if pd.isna(value) else f"{value:.0f}"


def goal_lines(artifacts):
    """The section as Markdown lines, one table per run of the experiment."""
    lines = ["", "## Whole training step (beyond the papers)", "",
             "From `artifacts/whole_step.<run>.csv` (`snakemake --cores 2 whole_step`; its "
             "figure: `figures/<run>/whole_step.png`): one training step (forward, backward, "
             "SGD step) of each network, InPlace-ABN against STD-BN (PyTorch's batch norm + "
             "leaky ReLU) timed interleaved in one process, and the peak memory above the "
             "step's start at the same batch. Not a paper's claim: the papers time blocks, "
             f"InPlace-ABN's is {block_figure(artifacts)}. The goal is this project's "
             "(experiments/whole_step.py, `CPU_GOAL`, `GPU_GOAL`): on the CPU no slower than "
             "STD-BN, and faster by at least half of what the layer's own speedup in the step "
             "would give at STD-BN's norm share; on a GPU, ResNeXt-101's step at most 2% "
             "slower than STD-BN's in a CUDA graph (`graphs` mode) and 5% eager. The share "
             "counts norm module calls, forward and backward (DenseNet's: in the naive route, "
             "which a step with hooks on its norms takes)."]
    runs = paths.runs_of(EXPERIMENT, artifacts)
    if not runs:
        return lines + ["", "No whole-step run yet."]
    for run in runs:
        table = rows(pd.read_csv(paths.aggregate_csv(EXPERIMENT, run, artifacts)))
        header = ["run", *table.columns]
        lines += ["", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join([run, *map(str, cells)]) + " |"
                  for cells in table.itertuples(index=False)]
    return lines


__all__ = ["BLOCK_CLAIM", "block_figure", "rows", "goal_lines"]
