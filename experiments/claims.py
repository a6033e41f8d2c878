"""The claims report: every quantitative claim of both papers beside what each run measured.

Run as ``python -m experiments.claims [--artifacts DIR] [--out figures/claims.md]``.

The claims are the entries of ``artifacts/paper/*.yaml`` (the papers' numbers, with their
sources); each names the experiment that measures it. For every run of that experiment found
under ``--artifacts`` (an aggregated ``<experiment>.<run>.csv``), the claim's evaluator - one
function per claim, registered with :func:`evaluates` - reads the CSV and returns what was
measured, a verdict and its reason. Verdicts:

* ``reproduced`` / ``not reproduced``: the evaluator's stated criterion holds / fails;
* ``not measurable on this device``: the claim is about hardware or software the run did not
  use (e.g. GPU timings measured on a CPU); the measured numbers are still shown;
* ``not run``: no run of the experiment has results yet.

Adding an experiment's claims: add the entries to the paper's YAML and one evaluator per claim
here. A claim whose experiment has results but no evaluator is an error, not a silent gap.
"""
import argparse
import dataclasses
from pathlib import Path

import pandas as pd
import yaml

from . import analysis, paths
from .artifacts import atomic_path

PAPER_FILES = ("memory_efficient_densenets.yaml", "inplace_abn.yaml")
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable on this device"
NOT_RUN = "not run"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a run measured for a claim, the verdict, and why."""

    measured: str
    verdict: str
    reason: str


EVALUATORS = {}


def evaluates(claim_id):
    """Register the decorated ``fn(claim, frame) -> Outcome`` as the evaluator of ``claim_id``.

    ``claim`` is the claim's YAML entry, ``frame`` one run's aggregated CSV.
    """
    def register(fn):
        if claim_id in EVALUATORS:
            raise ValueError(f"claim_id={claim_id!r} already has an evaluator")
        EVALUATORS[claim_id] = fn
        return fn
    return register


# --------------------------------------------------------------------------- helpers
def _device(frame):
    """The run's device type (``cpu``/``cuda``) from its CSV."""
    devices = set(frame["device"])
    if len(devices) != 1:
        raise ValueError(f"one run mixes devices {sorted(devices)}")
    return devices.pop()


def _span(values):
    """``"+1.2% to +3.4%"`` (or one value) for a series of percentages."""
    low, high = values.min(), values.max()
    return f"{low:+.1f}%" if low == high else f"{low:+.1f}% to {high:+.1f}%"


def _verdict(ok):
    return REPRODUCED if ok else NOT_REPRODUCED


GPU_TIMING = ("the claim is about GPU (CUDA) timings; on a CPU the kernels and their costs "
              "differ, so the numbers are shown for reference only")


# --------------------------------------------------------------------------- DenseNet
#: Percentage points the measured overhead may lie outside the paper's range.
NONCONTIGUOUS_TOLERANCE_PP = 5.0


@evaluates("densenet_noncontiguous_overhead")
def _noncontiguous_overhead(claim, frame):
    table = analysis.contiguity_overhead(frame)
    forward = table.loc[table["pass"] == "forward", "overhead_pct"]
    both = table.loc[table["pass"] == "forward_backward", "overhead_pct"]
    measured = (f"forward {_span(forward)} (median {forward.median():+.1f}%), forward+backward "
                f"{_span(both)}, over {len(forward)} channel counts")
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, "the claim is about cuDNN convolutions on a "
                       "GPU; CPU convolutions take other code paths, shown for reference only")
    low, high = claim["value"]
    tol = NONCONTIGUOUS_TOLERANCE_PP
    ok = low - tol <= forward.median() <= high + tol
    return Outcome(measured, _verdict(ok), f"criterion: median forward overhead within "
                   f"{low}-{high}% +/- {tol:g} pp")


# --------------------------------------------------------------------------- InPlace-ABN
#: Percentage points INPLACE-ABN I's overhead may exceed the paper's upper bound.
TIME_OVERHEAD_TOLERANCE_PP = 1.0
#: Percentage points the feature-map memory saving may differ from the claimed 50%.
MEMORY_SAVING_TOLERANCE_PP = 1.0


def _by_strategy(frame):
    return analysis.strategy_overhead(frame).set_index(["strategy", "module"])


@evaluates("iabn_time_overhead")
def _iabn_time_overhead(claim, frame):
    overhead = _by_strategy(frame).loc["inplace_abn_I", "overhead_pct"]
    measured = f"INPLACE-ABN I over STANDARD: {_span(overhead)} over {len(overhead)} modules"
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    bound = claim["value"][1] + TIME_OVERHEAD_TOLERANCE_PP
    return Outcome(measured, _verdict(overhead.max() <= bound),
                   f"criterion: overhead at most {bound:g}% in every module (the paper's upper "
                   f"bound + {TIME_OVERHEAD_TOLERANCE_PP:g} pp)")


@evaluates("iabn_checkpoint_doubles_overhead")
def _iabn_checkpoint_overhead(claim, frame):
    table = _by_strategy(frame)
    checkpoint = table.loc["checkpoint", "overhead_pct"]
    inplace = table.loc["inplace_abn_I", "overhead_pct"]
    measured = (f"CHECKPOINTING {_span(checkpoint)}, INPLACE-ABN I {_span(inplace)} over "
                "STANDARD")
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    return Outcome(measured, _verdict(bool((checkpoint > inplace).all())),
                   "criterion: CHECKPOINTING slower than INPLACE-ABN I in every module (the "
                   "ratio of two overheads of a few percent is too noisy to test '~2x')")


@evaluates("iabn_memory_saving")
def _iabn_memory_saving(claim, frame):
    table = _by_strategy(frame)
    saving = pd.concat([table.loc[s, "memory_saving_pct"]
                        for s in ("inplace_abn_I", "inplace_abn_II")])
    tol = MEMORY_SAVING_TOLERANCE_PP
    ok = bool((abs(saving - claim["value"]) <= tol).all())
    return Outcome(f"INPLACE-ABN I/II save {saving.min():.1f}-{saving.max():.1f}% of "
                   "STANDARD's feature-map bytes",
                   _verdict(ok), f"criterion: {claim['value']:g} +/- {tol:g}% less in every "
                   "module; feature-map buffers only, as the paper counts them (the "
                   "per-channel statistics are in the CSV); saved-tensor bytes are the same on "
                   "every device")


@evaluates("iabn_buffers_per_strategy")
def _iabn_buffers(claim, frame):
    buffers = _by_strategy(frame)["saved_buffers"]
    rounded = buffers.round().astype(int)
    wrong = [f"{s} {m}: {b:.2f}" for (s, m), b in buffers.items()
             if rounded[(s, m)] != claim["value"][s]]
    measured = ", ".join(f"{s} {b.min():.2f}-{b.max():.2f}"
                         for s, b in buffers.groupby(level="strategy", sort=False))
    return Outcome(measured, _verdict(not wrong),
                   "criterion: saved feature-map bytes / input bytes rounds to the paper's count in every "
                   "module" + (f"; differs: {'; '.join(wrong)}" if wrong else ""))


@evaluates("iabn_ii_faster_than_checkpoint_proposed")
def _iabn_ii_faster(claim, frame):
    table = _by_strategy(frame)
    ii = table.loc["inplace_abn_II", "median_ms"]
    proposed = table.loc["checkpoint_proposed", "median_ms"]
    difference = 100 * (ii / proposed - 1)
    measured = f"INPLACE-ABN II vs CHECKPOINTING (proposed): {_span(difference)} time"
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    return Outcome(measured, _verdict(bool((ii < proposed).all())),
                   "criterion: INPLACE-ABN II faster in every module")


# --------------------------------------------------------------------------- report
def load_claims(artifacts):
    """Every claim entry of the papers' YAML files, each with its ``paper`` added."""
    claims = []
    for name in PAPER_FILES:
        path = Path(artifacts) / "paper" / name
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        claims += [{**entry, "paper": document["paper"]} for entry in document["claims"]]
    return claims


def evaluate(claim, artifacts):
    """``[(run, device_name, Outcome)]`` for every run of the claim's experiment."""
    experiment = claim["experiment"]
    runs = paths.runs_of(experiment, artifacts)
    if not runs:
        return [("-", "-", Outcome("-", NOT_RUN, f"no {experiment} results yet"))]
    evaluator = EVALUATORS.get(claim["id"])
    if evaluator is None:
        raise LookupError(f"claim {claim['id']!r}: {experiment} has results ({runs}) but "
                          "experiments/claims.py has no evaluator for it")
    rows = []
    for run in runs:
        frame = pd.read_csv(paths.aggregate_csv(experiment, run, artifacts))
        device_name = ", ".join(sorted(set(frame["env_device_name"].fillna("unknown"))))
        rows.append((run, device_name, evaluator(claim, frame)))
    return rows


def _escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def report(artifacts):
    """The claims report for every run under ``artifacts``, as Markdown."""
    claims = load_claims(artifacts)
    lines = ["# The papers' claims beside this project's measurements", "",
             f"Generated by `python -m experiments.claims` from `{artifacts}` (the pipeline "
             "rewrites it; do not edit). The papers' numbers and their sources are in "
             "`artifacts/paper/`; each run is `<profile>-<device>`.", "",
             f"Verdicts: **{REPRODUCED}** / **{NOT_REPRODUCED}** (the stated criterion holds / "
             f"fails), **{NOT_MEASURABLE}** (the claim needs hardware or software the run did "
             f"not use), **{NOT_RUN}** (no results yet)."]
    header = ["claim", "the paper says", "source", "run", "device", "measured", "verdict",
              "why"]
    for paper in dict.fromkeys(c["paper"] for c in claims):
        lines += ["", f"## {paper}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        for claim in (c for c in claims if c["paper"] == paper):
            said = f"{claim['claimed']} ({claim['setting']})"
            for run, device_name, outcome in evaluate(claim, artifacts):
                cells = [f"`{claim['id']}`: {claim['statement']}", said, claim["source"], run,
                         device_name, outcome.measured, f"**{outcome.verdict}**",
                         outcome.reason]
                lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.claims",
                                     description="Write the claims report.")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"),
                        help="artifact root (default: artifacts)")
    parser.add_argument("--out", type=Path, default=Path("figures/claims.md"),
                        help="Markdown report (default: figures/claims.md)")
    args = parser.parse_args(argv)
    if not (args.artifacts / "paper").is_dir():
        parser.error(f"--artifacts {args.artifacts}: has no paper/ directory with the papers' "
                     "numbers")
    text = report(args.artifacts)
    with atomic_path(args.out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
