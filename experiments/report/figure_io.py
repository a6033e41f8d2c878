"""What the notebooks in ``figures/`` share: loading a run's aggregated CSV, and writing a
figure (PNG and PDF) and a table (Markdown and LaTeX) atomically.

Locations follow :mod:`experiments.records.paths` (``ARTIFACTS_DIR``, ``ARTIFACTS_RUN``,
``FIGURES_DIR``), so one notebook runs unchanged in Jupyter, under the pipeline and in tests.
"""
import math

import pandas as pd

from ..records import paths
from ..records.atomic import atomic_path

FIGURE_FORMATS = ("png", "pdf")
DPI = 200
#: How the DenseNet figures (Figs. 4 and 5) name the implementations they compare.
IMPLEMENTATION_LABELS = {"naive": "naive", "shared": "shared storage",
                         "shared_inplace": "one shared storage + InPlace-ABN",
                         "checkpoint": "checkpoint", "torchvision": "torchvision (memory-efficient)"}


def load_aggregate(experiment):
    """``(frame, run)``: the aggregated CSV of ``experiment`` for the current run."""
    run = paths.current_run(experiment)
    csv = paths.aggregate_csv(experiment, run, paths.artifacts_dir())
    try:
        return pd.read_csv(csv), run
    except FileNotFoundError:
        raise FileNotFoundError(f"{csv} does not exist: run `snakemake --cores 2 {experiment}`"
                                " for this profile first, or set ARTIFACTS_RUN") from None


def save_figure(fig, name, run):
    """Write ``fig`` as ``<figures_dir(run)>/<name>.png`` and ``.pdf``; return the paths."""
    written = []
    for fmt in FIGURE_FORMATS:
        path = paths.figures_dir(run) / f"{name}.{fmt}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI, bbox_inches="tight")
        written.append(path)
    return written


def _cell(value, digits):
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def markdown_table(frame, digits=2):
    """``frame`` as a GitHub Markdown table (floats with ``digits`` decimals, index dropped)."""
    header = [str(c) for c in frame.columns]
    rows = [[_cell(v, digits) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def save_table(frame, name, run, digits=2, caption=None):
    """Write ``frame`` as ``<figures_dir(run)>/<name>.md`` and ``.tex``; return the paths."""
    directory = paths.figures_dir(run)
    md = markdown_table(frame, digits)
    tex = frame.to_latex(index=False, escape=True, float_format=f"%.{digits}f", caption=caption)
    written = []
    for suffix, text in (("md", (f"{caption}\n\n" if caption else "") + md), ("tex", tex)):
        path = directory / f"{name}.{suffix}"
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        written.append(path)
    return written


__all__ = ["IMPLEMENTATION_LABELS", "load_aggregate", "save_figure", "save_table",
           "markdown_table"]
