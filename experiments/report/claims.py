"""The claims report: every quantitative claim of both papers beside what each run measured.

Run as ``python -m experiments.report.claims [--artifacts DIR] [--out figures/claims.md]``.

The claims are the entries of ``artifacts/paper/*.yaml`` (the papers' numbers, with their
sources); each names the experiment that measures it. For every run of that experiment found
under ``--artifacts`` (an aggregated ``<experiment>.<run>.csv``), the claim's evaluator - one
function per claim, registered with :func:`evaluates` - reads the CSV and returns what was
measured, a verdict and its reason (the criterion). The report opens with the count of each
verdict per paper and, for the claims no run judged yet, what judging them takes at the paper
profile (:func:`to_judge`: device, data sets, GPU-hours estimated from the profile's wall-time
requests, the `snakemake` target). A claim that no point of the pipeline measures says so in
its YAML (``not_planned``: why, and what judging it would take) and is "not measured at the
claimed setting" with that text (:func:`not_planned`). Verdicts:

* ``reproduced`` / ``not reproduced``: the evaluator's stated criterion holds / fails; a
  criterion is two-sided wherever the paper gives a number or a factor, one-sided only where
  it states a bound or an order;
* ``holds by construction``: the criterion holds, and what it counts is the method's own
  accounting (the buffers it keeps), the same on every device, not a measurement of the
  paper's hardware;
* ``consistent at small scale``: the criterion holds in a scaled-down run (narrow bodies, a
  small memory budget), which is consistent with the claim but does not reproduce it;
* ``not measurable on this device``: the claim is about hardware or software the run did not
  use (e.g. GPU timings measured on a CPU); the measured numbers are still shown;
* ``not measured at the claimed setting``: the run did not measure the claim's setting (e.g. a
  depth it names, a memory budget, or the paper's LuaTorch: :data:`LUATORCH_RULE`); what it
  did measure is shown;
* ``not run``: the experiment exists (its module ``experiments/<id>.py``) but no run of it has
  results yet;
* ``not implemented``: the experiment has no module yet (so no rule: an experiment is a module
  and a rule), see :func:`implemented`.

Adding an experiment's claims: add the entries to the paper's YAML and one evaluator per claim
here (the training experiments': in :mod:`.training_claims`, InPlace-ABN Table 2's in
:mod:`.segmentation_claims`), registered with
:func:`.verdicts.evaluates`. A claim whose experiment has results but no evaluator is an error, not a silent gap.

Two last sections hold this project's own goals, not the papers' claims: the memory of the
one-storage DenseNet (:func:`memory_goal`, per run and depth from the Fig. 4 CSVs) and the
kernel benchmark's speed goals (:func:`speed_goals`, per run, shape and dtype, as read from
each run's ``artifacts/bench_kernels/<run>.json``).
"""
import argparse
import decimal
from pathlib import Path

import pandas as pd
import yaml

from . import analysis, bench_kernels
from . import segmentation_claims, training_claims  # noqa: F401  (register evaluators)
from . import whole_step_claims
from .verdicts import (BY_CONSTRUCTION, CONSISTENT_SMALL_SCALE, EVALUATORS, NOT_IMPLEMENTED,
                       NOT_MEASURABLE, NOT_MEASURED, NOT_REPRODUCED, NOT_RUN, REPRODUCED,
                       VERDICTS, Outcome, evaluates, verdict)
from ..records import paths
from ..records.atomic import atomic_path

PAPER_FILES = ("memory_efficient_densenets.yaml", "inplace_abn.yaml")
#: Where the experiment modules are: ``experiments/<id>.py``.
EXPERIMENTS_DIR = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- helpers
def _device(frame):
    """The run's device type (``cpu``/``cuda``) from its CSV (its simulated points, which run
    on the meta device whatever the run's device, aside, unless the run has no other)."""
    real = analysis.measured_points(frame)
    devices = set((frame if real.empty else real)["device"])
    if len(devices) != 1:
        raise ValueError(f"one run mixes devices {sorted(devices)}")
    return devices.pop()


def _span(values):
    """``"+1.2% to +3.4%"`` (or one value) for a series of percentages."""
    low, high = values.min(), values.max()
    return f"{low:+.1f}%" if low == high else f"{low:+.1f}% to {high:+.1f}%"


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
    return Outcome(measured, verdict(ok), f"criterion: median forward overhead within "
                   f"{low}-{high}% +/- {tol:g} pp")


# --------------------------------------------------------------------------- DenseNet Figs. 4, 5
#: "Roughly N times": within this factor of N, either side.
ROUGHLY_FACTOR = 1.5
#: Share of a quadratic fit's d^2 term in the saved bytes at the deepest depth: at most
#: LINEAR_SHARE is growth linear in depth, at least QUADRATIC_SHARE is quadratic growth.
LINEAR_SHARE = 0.05
QUADRATIC_SHARE = 0.5
#: Percentage points shared storage's PyTorch time overhead may lie from the paper's "roughly"
#: 20%, either side: the gap between it and LuaTorch's 15%.
DENSENET_TIME_TOLERANCE_PP = 5.0
GIB = 2.0 ** 30
SAVED_BYTES = ("bytes autograd keeps for backward (saved-tensor hooks, plus the shared "
               "storages), the same on every device")


#: Why a verdict on simulated points is only that.
SIMULATED_NOTE = ("judged on simulated tensor memory (training steps on the meta device, no "
                  "GPU): not the CUDA caching allocator's rounding and fragmentation, cuDNN "
                  "workspaces or the CUDA context, so a GPU fits somewhat less; a GPU run judges "
                  "real allocation")


#: Why the paper's LuaTorch memory totals get no verdict from this project's PyTorch runs (the
#: naive method's growth with depth, a property of its quadratic operations, is judged:
#: ``densenet_naive_memory_160_vs_40``).
LUATORCH_RULE = ("not judged, by one rule for the paper's LuaTorch memory totals (a share of "
                 "the naive implementation's memory, a depth that fits 12 GB): the number is "
                 "what LuaTorch's allocator held in all (parameters, gradients, workspaces, "
                 "feature maps), and this project runs PyTorch, which the paper finds leaner "
                 "(Fig. 4) and which shares gradient storage automatically (its reason for "
                 "having no PyTorch naive implementation), so a PyTorch measurement on either "
                 "side of the number says nothing of it; the PyTorch measurement is shown "
                 "beside it")


def _fitting(frame):
    """``densenet_fig4_memory`` rows whose step ran, indexed by ``(impl, depth)``."""
    table = analysis.memory_vs_depth(frame)
    return table[table["status"] == analysis.FITS].set_index(["impl", "depth"])


def _others(values, impls=("checkpoint", "torchvision"), fmt="{:.1f}%"):
    """``" (checkpoint 1.0%, torchvision 2.0%)"`` for those of ``impls`` in ``values``."""
    shown = [f"{impl} {fmt.format(values[impl])}" for impl in impls if impl in values]
    return f" ({', '.join(shown)})" if shown else ""


def _peak_ratio(frame, impl, depth, base_impl="naive", base_depth=None):
    """``peak(impl, depth) / peak(base_impl, base_depth)``, or ``None`` if not measured."""
    peaks = analysis.measured_points(frame).set_index(["impl", "depth"])["peak_bytes"]
    try:
        ratio = peaks[(impl, depth)] / peaks[(base_impl, base_depth or depth)]
    except KeyError:
        return None
    return None if pd.isna(ratio) else ratio


def _deepest_fitted(frame, impl):
    """``(deepest depth whose step fitted or None, first depth out of memory or NaN)`` of
    ``impl`` among the run's real points."""
    fitted = _fitting(frame).reset_index().groupby("impl")["depth"].max()
    table = analysis.memory_vs_depth(frame)
    out = table[(table["impl"] == impl) & (table["status"] != analysis.FITS)]["depth"].min()
    return fitted.get(impl), out


def _deepest_common(fits, impls):
    """The deepest depth at which every one of ``impls`` fitted, or ``None``."""
    depths = fits.reset_index().groupby("impl")["depth"].apply(set)
    common = set.intersection(*(depths.get(impl, set()) for impl in impls))
    return max(common) if common else None


@evaluates("densenet_memory_160_layers")
def _shared_share_of_naive(claim, frame):
    depth = claim["depth"]
    fits = _fitting(frame)
    pct = fits["saved_vs_baseline_pct"]
    if ("naive", depth) not in pct.index or ("shared", depth) not in pct.index:
        common = _deepest_common(fits, ("naive", "shared"))
        measured = ("-" if common is None else f"saved for backward at {common} layers (the "
                    f"deepest both fitted): shared {pct[('shared', common)]:.1f}% of naive")
        return Outcome(measured, NOT_MEASURED, f"naive and shared were not both measured "
                       f"(and fitted) at the claim's {depth} layers")
    at_depth = pct.xs(depth, level="depth")
    peak = _peak_ratio(frame, "shared", depth)
    measured = (f"saved for backward at {depth} layers: shared {at_depth['shared']:.1f}% of "
                f"naive{_others(at_depth)}" + ("" if peak is None else
                                                 f"; peak: shared {100 * peak:.1f}% of naive"))
    return Outcome(measured, NOT_MEASURED, f"{LUATORCH_RULE}; measured: {SAVED_BYTES}")


@evaluates("densenet_naive_memory_160_vs_40")
def _naive_growth(claim, frame):
    shallow, deep = claim["depths"]
    saved = _fitting(frame)["saved_mib"]
    if ("naive", shallow) not in saved.index or ("naive", deep) not in saved.index:
        naive = saved[saved.index.get_level_values("impl") == "naive"]
        measured = ", ".join(f"{d} layers {mib:.0f} MiB" for (_, d), mib in naive.items())
        return Outcome(f"naive saved for backward: {measured or '-'}", NOT_MEASURED,
                       f"naive was not measured (and fitted) at both {shallow} and {deep} "
                       "layers")
    ratio = saved[("naive", deep)] / saved[("naive", shallow)]
    peak = _peak_ratio(frame, "naive", deep, "naive", shallow)
    measured = (f"naive saved for backward: {deep} layers {ratio:.1f}x {shallow} layers "
                f"({saved[('naive', deep)]:.0f} vs {saved[('naive', shallow)]:.0f} MiB)"
                + ("" if peak is None else f"; peak {peak:.1f}x"))
    low, high = claim["value"] / ROUGHLY_FACTOR, claim["value"] * ROUGHLY_FACTOR
    return Outcome(measured, verdict(low <= ratio <= high),
                   f"criterion: ratio within {low:.1f}-{high:.1f}x ('roughly "
                   f"{claim['value']:g}x' as within a factor {ROUGHLY_FACTOR:g}); {SAVED_BYTES}; "
                   "judged on PyTorch although the paper's naive numbers are LuaTorch's: the "
                   "ratio is the growth of the maps the naive method stores, which the paper "
                   "puts down to its four quadratic operations, not a LuaTorch total")


@evaluates("densenet_memory_linear_vs_quadratic")
def _growth_order(claim, frame):
    growth = analysis.growth_with_depth(frame).set_index("impl")
    fitted = growth.dropna(subset=["quadratic_share"])
    if not {"naive", "shared"} <= set(fitted.index):
        counts = ", ".join(f"{impl} {n}" for impl, n in growth["depths"].items())
        return Outcome(f"depths that fitted: {counts or '-'}", NOT_MEASURED,
                       "the fit needs at least three depths of both naive and shared")
    share = 100 * fitted["quadratic_share"].round(6) + 0.0  # no "-0.00%" from rounding noise
    deepest = sorted(set(fitted.loc[["naive", "shared"], "deepest"]))
    measured = (f"d^2 term of a quadratic fit of the saved bytes, as a share of them at the "
                f"deepest depth ({' / '.join(map(str, deepest))} layers): naive "
                f"{share['naive']:.1f}%, shared {share['shared']:.2f}%"
                f"{_others(share, fmt='{:.2f}%')}; naive over {fitted.loc['naive', 'depths']}, "
                f"shared over {fitted.loc['shared', 'depths']} depths")
    ok = (share["shared"] <= 100 * LINEAR_SHARE and share["naive"] >= 100 * QUADRATIC_SHARE)
    return Outcome(measured, verdict(ok),
                   f"criterion: least-squares fit a + b d + c d^2 over the depths (c = half the "
                   f"second difference over the squared spacing); linear: c D^2 at most "
                   f"{100 * LINEAR_SHARE:g}% of the saved bytes at the deepest depth D, "
                   f"quadratic: at least {100 * QUADRATIC_SHARE:g}%; {SAVED_BYTES}")


#: "Nearly 500 layers" is the paper's depth limit: the deepest depth that fits the budget lies
#: within this fraction of it, either side. Below, because "nearly" puts the paper's deepest
#: model a little short of 500 and the paper gives no finer figure; above by as much, because
#: tensor memory (the simulated points) leaves out the CUDA allocator's rounding and cuDNN's
#: workspaces and so fits a little deeper than the paper's GPU. A limit outside the band is a
#: memory model unlike the paper's, whichever side it falls.
NEARLY_BAND = 0.1
#: How a depth limit was judged: by the measured depths alone, or by the memory model's fit.
SETTLED = "settled by the measured depths (the deepest that fitted, the first that did not)"


def _depth_band(claim):
    """``(low, high)``: the depths within :data:`NEARLY_BAND` of the claim's limit."""
    return (1 - NEARLY_BAND) * claim["value"], (1 + NEARLY_BAND) * claim["value"]


def _limit_criterion(claim, limit_gib):
    """The criterion of ``densenet_pytorch_500_layers``, as the report quotes it."""
    low, high = _depth_band(claim)
    return (f"criterion: the deepest DenseNet-BC with shared storage that fits {limit_gib} GiB "
            f"has {low:g}-{high:g} layers (the paper's limit, 'nearly {claim['value']:g}', +/- "
            f"{100 * NEARLY_BAND:g}%: short of it by 'nearly', beyond it by as much for the "
            "memory a GPU has and tensor memory leaves out)")


def _optional_depth(depth):
    """``depth`` as an ``int``, ``None`` for a missing one (``None`` or NaN)."""
    return None if depth is None or pd.isna(depth) else int(depth)


def _judge_limit(claim, fits, fails, estimate):
    """``(verdict, how)`` of the depth limit within :func:`_depth_band`: ``fits`` is the
    deepest depth that fitted and ``fails`` the first deeper one that did not (``None``: none
    did, or none was tried); where they do not settle it, ``estimate`` (the fit's limit,
    :func:`.analysis.depth_at_budget`, or ``None``) does."""
    low, high = _depth_band(claim)
    at_least = fits or 0
    at_most = float("inf") if fails is None else fails - analysis.DEPTH_STEP
    if at_most < low or at_least > high:
        return NOT_REPRODUCED, SETTLED
    if at_least >= low and at_most <= high:
        return REPRODUCED, SETTLED
    bracket = f"{at_least}-{at_most}" if fails is not None else f"{at_least} or more"
    if estimate is None:
        return NOT_MEASURED, (f"the measured depths put the limit at {bracket} layers, across "
                              "the band's edge, and are too few (under three) for the memory "
                              "model's fit")
    # The fit extends the measurements; where it contradicts them, the measurements stand.
    estimate = min(max(estimate, at_least), at_most)
    return verdict(low <= estimate <= high), (
        f"the measured depths put the limit at {bracket} layers, so the memory model judges: "
        f"a least-squares quadratic of the peak over the depths that fitted meets the budget "
        f"at {_limit_text(estimate)}")


def _limit_text(estimate):
    """``"496 layers"``, or what an endless fit means."""
    if estimate == float("inf"):
        return "no depth (the fitted peak never reaches it)"
    return f"{estimate} layers"


@evaluates("densenet_pytorch_500_layers")
def _deepest_that_fits(claim, frame):
    fits = _fitting(frame)
    fitted = fits.reset_index().groupby("impl")["depth"].max()
    shared, first_out = _deepest_fitted(frame, "shared")
    measured = ("shared storage: fitted at no depth" if shared is None else
                f"shared storage: deepest that fitted {shared} layers "
                f"({fits.loc[('shared', shared), 'param_count'] / 1e6:.1f}M parameters)")
    measured += ("; none out of memory" if pd.isna(first_out)
                 else f"; out of memory from {int(first_out)} layers")
    measured += ("; deepest that fitted: "
                 + ", ".join(f"{impl} {d}" for impl, d in fitted.items() if impl != "shared")
                 + f"; batch {analysis.measured_points(frame)['batch'].iloc[0]}")
    simulated = analysis.simulated_deepest(frame).set_index("impl")
    if _device(frame) != "cuda":
        if "shared" not in simulated.index:
            return Outcome(measured, NOT_MEASURABLE, "the claim is about what fits one 12 GB "
                           "GPU; on the CPU the budget is not enforced and memory is not a "
                           "GPU's (a simulated_shared point would judge it)")
        return _deepest_simulated(claim, simulated, frame)
    budget = claim["budget_gib"]
    real = analysis.measured_points(frame)
    enforced = real["budget_enforced"].astype(bool).all()
    limit = (real["memory_budget_gib"].max() if enforced
             else real["device_memory_bytes"].max() / GIB)
    if limit > budget * (1 + 1e-6):
        return Outcome(measured, NOT_MEASURED, f"the run's memory limit is {limit:.1f} GiB, "
                       f"more than the claim's {budget:g} GB; set memory_budget_gib: {budget:g}")
    points = fits.xs("shared", level="impl") if shared is not None else fits.iloc[:0]
    estimate = analysis.depth_at_budget(points.index, points["peak_mib"] * analysis.MIB,
                                        limit * GIB)
    outcome, how = _judge_limit(claim, _optional_depth(shared), _optional_depth(first_out),
                                estimate)
    if how != SETTLED:
        how += " (each depth's peak: a step's allocation above the memory held before it)"
    return Outcome(measured, outcome, f"{_limit_criterion(claim, f'{limit:.1f}')}; {how}")


def _deepest_simulated(claim, simulated, frame):
    """The verdict of ``densenet_pytorch_500_layers`` on the simulated points (tensor memory of
    training steps simulated on the meta device, at the paper's batch): the search's deepest
    fitting depth, or where it stopped short of the limit (``capped``), the fit over the
    simulated depths."""
    row = simulated.loc["shared"]
    batch = frame.loc[analysis.simulated_rows(frame), "batch"].iloc[0]

    def deepest(r):
        if pd.isna(r["depth"]):
            return "no depth"
        return f"{'at least ' if r['capped'] else ''}{int(r['depth'])} layers"

    measured = (f"simulated tensor memory, batch {batch}, {row['budget_gib']:g} GiB: shared "
                f"storage fits {deepest(row)}"
                + ("" if pd.isna(row["depth"]) else
                   f" ({row['param_count'] / 1e6:.1f}M parameters, {row['peak_gib']:.2f} GiB)")
                + "".join(f"; {impl} {deepest(r)}" for impl, r in simulated.iterrows()
                          if impl != "shared"))
    budget = claim["budget_gib"]
    if row["budget_gib"] > budget * (1 + 1e-6):
        return Outcome(measured, NOT_MEASURED, f"the simulated budget is {row['budget_gib']:g} "
                       f"GiB, more than the claim's {budget:g} GB")
    depths = analysis.simulated_memory_vs_depth(frame)
    depths = depths[depths["impl"] == "shared"]
    estimate = analysis.depth_at_budget(depths["depth"], depths["peak_gib"], row["budget_gib"])
    fails = _optional_depth(row["first_failing_depth"])
    outcome, how = _judge_limit(claim, _optional_depth(row["depth"]), fails, estimate)
    if fails is None and estimate is not None:
        measured += f"; the fit of its peaks over depth meets the budget at {_limit_text(estimate)}"
    criterion = _limit_criterion(claim, f"{row['budget_gib']:g}")
    return Outcome(measured, outcome, f"{criterion}; {how}; {SIMULATED_NOTE}")


def _simulated_limit(frame, impl):
    """``"simulated tensor memory, 12 GiB: PyTorch naive fits 268 layers, not 274"`` from the
    run's simulated search of ``impl``, or ``"-"`` without one."""
    simulated = analysis.simulated_deepest(frame).set_index("impl")
    if impl not in simulated.index:
        return "-"
    row = simulated.loc[impl]
    fitted = "no depth" if pd.isna(row["depth"]) else f"{int(row['depth'])} layers"
    return (f"simulated tensor memory, {row['budget_gib']:g} GiB: PyTorch {impl} fits "
            f"{'at least ' if row['capped'] else ''}{fitted}"
            + ("" if pd.isna(row["first_failing_depth"]) else
               f", not {int(row['first_failing_depth'])}"))


@evaluates("densenet_naive_over_12gb_beyond_160_layers")
def _naive_depth_limit(claim, frame):
    if _device(frame) == "cuda":
        deepest, first_out = _deepest_fitted(frame, "naive")
        measured = (f"PyTorch naive: deepest that fitted {deepest} layers; "
                    + ("none out of memory" if pd.isna(first_out)
                       else f"out of memory from {int(first_out)} layers"))
        return Outcome(measured, NOT_MEASURED, LUATORCH_RULE)
    return Outcome(_simulated_limit(frame, "naive"), NOT_MEASURED, LUATORCH_RULE)


@evaluates("densenet_luatorch_340_layers")
def _luatorch_340_layers(claim, frame):
    return not_planned(claim, _simulated_limit(frame, "shared"))


def _time_overhead(claim, frame):
    """``(measured, shared storage's overhead over naive in %)`` at the claim's depth, or
    ``(what was timed, None)`` where naive and shared were not both timed there."""
    depth = claim["depth"]
    table = analysis.time_vs_baseline(frame)
    at_depth = table[table["depth"] == depth].set_index("impl")["overhead_pct"]
    if "shared" not in at_depth.index:
        return f"depths timed: {sorted(set(table['depth']))}", None
    batch = frame.loc[frame["depth"] == depth, "batch"].iloc[0]
    return (f"DenseNet-BC-{depth}, batch {batch}: shared storage {at_depth['shared']:+.1f}% "
            f"time over naive{_others(at_depth, fmt='{:+.1f}%')}"), at_depth["shared"]


@evaluates("densenet_shared_time_overhead")
def _shared_time_overhead(claim, frame):
    measured, overhead = _time_overhead(claim, frame)
    if overhead is None:
        return Outcome(measured, NOT_MEASURED, f"naive and shared were not both timed at the "
                       f"claim's {claim['depth']} layers")
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    tol = DENSENET_TIME_TOLERANCE_PP
    low, high = claim["value"] - tol, claim["value"] + tol
    return Outcome(measured, verdict(low <= overhead <= high),
                   f"criterion: overhead within {low:g}-{high:g}% (the paper's 'roughly' "
                   f"{claim['value']:g}% on PyTorch +/- {tol:g} pp, the gap between it and "
                   "LuaTorch's 15%: a speed-up or a far larger cost is not the paper's)")


@evaluates("densenet_luatorch_time_overhead")
def _luatorch_time_overhead(claim, frame):
    return not_planned(claim, f"PyTorch: {_time_overhead(claim, frame)[0]}")


def _within_last_digit(measured, claimed):
    """``(ok, unit)``: whether ``measured`` is within one unit of ``claimed``'s last digit,
    either side: how the paper's counts and ratios (160K, 1.8M, 73M, 6x) are judged. Rounding
    alone would allow half a unit, but the paper's figures are looser than rounding (a 55.6M
    model written 55M)."""
    unit = 10.0 ** decimal.Decimal(str(claimed)).as_tuple().exponent
    return abs(measured - claimed) <= unit * (1 + 1e-9), unit


def _parameters(spec):
    """The parameter count of ``spec`` (``{builder, args}``: a constructor of
    :mod:`layers.densenet` and its arguments), built on the meta device (no memory, exact)."""
    import torch  # the report needs torch only for these counts

    from layers import densenet

    with torch.device("meta"):
        model = getattr(densenet, spec["builder"])(**spec["args"])
    return sum(p.numel() for p in model.parameters())


PARAMETERS_BASIS = ("the parameters of this project's DenseNet-BC (layers.densenet: the "
                    "torchvision / Huang et al. layout, bottleneck 4k, compression 0.5), "
                    "counted exactly: the architecture's arithmetic, the same on every device")


@evaluates("densenet_parameters_fig4")
@evaluates("densenet_parameters_imagenet")
def _parameter_counts(claim, frame):
    counts = {name: _parameters(spec) / 1e6 for name, spec in claim["models"].items()}
    checks = {name: _within_last_digit(counts[name], claimed)
              for name, claimed in claim["value"].items()}
    measured = ", ".join(f"{name} {counts[name]:.3f}M" for name in claim["value"])
    wrong = [f"{name} {counts[name]:.3f}M vs {claim['value'][name]:g}M" for name, (ok, _)
             in checks.items() if not ok]
    return Outcome(measured, verdict(not wrong, BY_CONSTRUCTION),
                   f"criterion: each count within one unit of the paper's last digit (e.g. "
                   f"1.8M: 1.7-1.9M), the paper's figures being rounded; {PARAMETERS_BASIS}"
                   + (f"; differs: {'; '.join(wrong)}" if wrong else ""))


def _weighted_layers(blocks):
    """The depth of a DenseNet-BC with dense blocks of ``blocks`` layers, as Huang et al.
    count it: two convolutions per dense layer, the stem convolution, one per transition and
    the classifier (DenseNet-121's 6-12-24-16: 121)."""
    return 2 * sum(blocks) + len(blocks) + 1


#: A depth named after its blocks may be one off the weighted layers: Huang et al.'s own
#: DenseNet-264 (6-12-64-48) has 265.
NAMED_DEPTH_SLACK = 1


@evaluates("densenet_footnote10_blocks")
def _footnote_blocks(claim, frame):
    implied = {name: _weighted_layers(spec["blocks"]) for name, spec in claim["value"].items()}
    measured = "; ".join(f"{name} with blocks {'-'.join(map(str, spec['blocks']))}: "
                         f"{implied[name]} weighted layers" for name, spec in
                         claim["value"].items())
    ok = all(abs(implied[name] - spec["depth"]) <= NAMED_DEPTH_SLACK
             for name, spec in claim["value"].items())
    return Outcome(measured, verdict(ok, BY_CONSTRUCTION),
                   f"criterion: each block configuration has the model's depth within "
                   f"{NAMED_DEPTH_SLACK} (2 x the dense layers + the stem, the transitions and "
                   "the classifier; Huang et al.'s DenseNet-264, 6-12-64-48, has 265): the "
                   "architecture's arithmetic. layers.densenet builds 6-12-64-48 and "
                   "6-12-48-48, whose parameters match the paper's 33M, 73M and 55M "
                   "(densenet_parameters_imagenet)")


@evaluates("densenet_340_layers_parameters")
def _parameter_ratio(claim, frame):
    deep, shallow = (claim["models"][key] for key in ("deep", "shallow"))
    ratios = {"depth_ratio": deep["args"]["depth"] / shallow["args"]["depth"],
              "parameter_ratio": _parameters(deep) / _parameters(shallow)}
    checks = {key: _within_last_digit(ratios[key], claimed)
              for key, claimed in claim["value"].items()}
    measured = (f"{deep['args']['depth']} vs {shallow['args']['depth']} layers: "
                f"{ratios['depth_ratio']:.2f}x as deep, {ratios['parameter_ratio']:.2f}x the "
                "parameters")
    return Outcome(measured, verdict(all(ok for ok, _ in checks.values()), BY_CONSTRUCTION),
                   "criterion: each ratio within one unit of the paper's last digit ("
                   + ", ".join(f"{claim['value'][k]:g} +/- {unit:g}"
                               for k, (_, unit) in checks.items())
                   + f"); {PARAMETERS_BASIS}")


#: The parameters grow as the square of the depth, so "14M parameters" is judged by the depth
#: band of "nearly 500 layers" (:data:`NEARLY_BAND`) squared.
def _parameter_band(value):
    return value * (1 - NEARLY_BAND) ** 2, value * (1 + NEARLY_BAND) ** 2


@evaluates("densenet_params_single_gpu")
def _params_single_gpu(claim, frame):
    simulated = analysis.simulated_deepest(frame).set_index("impl")
    missing = sorted(set(claim["value"]) - set(simulated.index))
    if missing:
        return Outcome("-", NOT_MEASURED, f"the run has no simulated search of {missing} "
                       "(the depth limit within the budget, at the paper's batch)")
    parts, oks, unsettled = [], [], []
    for impl, claimed in claim["value"].items():
        row = simulated.loc[impl]
        millions = 0.0 if pd.isna(row["depth"]) else row["param_count"] / 1e6
        low, high = _parameter_band(claimed)
        depth = "no depth" if pd.isna(row["depth"]) else f"{int(row['depth'])} layers"
        parts.append(f"{impl}: {'at least ' if row['capped'] else ''}{depth}, "
                     f"{millions:.1f}M parameters (the paper: {claimed:g}M, band "
                     f"{low:.1f}-{high:.1f}M)")
        if row["capped"] and millions <= high:
            unsettled.append(impl)  # the search stopped within or below the band: no limit
        oks.append(low <= millions <= high and not row["capped"])
    budget = simulated["budget_gib"].max()
    reason = (f"criterion: the parameters of the deepest DenseNet-BC (k = 12) that fits "
              f"{budget:g} GiB within the paper's figure x (1 -/+ {NEARLY_BAND:g})^2, each "
              "implementation (the depth band of 'nearly 500 layers', squared, as the "
              f"parameters grow as the depth squared); {SIMULATED_NOTE}")
    if abs(budget - claim["budget_gib"]) > 1e-6 * claim["budget_gib"]:
        return Outcome("; ".join(parts), NOT_MEASURED, f"the simulated budget is {budget:g} "
                       f"GiB, not the claim's {claim['budget_gib']:g} GB")
    if unsettled:
        return Outcome("; ".join(parts), NOT_MEASURED, f"{reason}; the search of "
                       f"{unsettled} stopped at max_depth, short of the band's end (raise it)")
    return Outcome("; ".join(parts), verdict(all(oks)), reason)


# --------------------------------------------------------------------------- InPlace-ABN
#: Percentage points INPLACE-ABN I's overhead may lie outside the paper's 0.8-2%, either side.
TIME_OVERHEAD_TOLERANCE_PP = 1.0
#: "Almost twice": the ratio of the overheads within this factor of 2, either side.
ALMOST_FACTOR = 1.25
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
    tol = TIME_OVERHEAD_TOLERANCE_PP
    low, high = claim["value"][0] - tol, claim["value"][1] + tol
    return Outcome(measured, verdict(low <= overhead.min() and overhead.max() <= high),
                   f"criterion: overhead within {low:g}-{high:g}% in every module (the paper's "
                   f"{claim['value'][0]:g}-{claim['value'][1]:g}% +/- {tol:g} pp)")


@evaluates("iabn_checkpoint_doubles_overhead")
def _iabn_checkpoint_overhead(claim, frame):
    table = _by_strategy(frame)
    checkpoint = table.loc["checkpoint", "overhead_pct"]
    inplace = table.loc["inplace_abn_I", "overhead_pct"]
    measured = (f"CHECKPOINTING {_span(checkpoint)}, INPLACE-ABN I {_span(inplace)} over "
                "STANDARD")
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    low, high = claim["value"] / ALMOST_FACTOR, claim["value"] * ALMOST_FACTOR
    criterion = (f"criterion: the median of CHECKPOINTING's overheads over the modules within "
                 f"{low:.2f}-{high:.2f}x INPLACE-ABN I's ('almost {claim['value']:g}x' as "
                 f"within a factor {ALMOST_FACTOR:g} either side: the ratio of two overheads "
                 "of a few percent carries their timing noise)")
    if inplace.median() <= 0:
        return Outcome(measured, NOT_REPRODUCED, f"{criterion}; INPLACE-ABN I has no overhead "
                       "to double")
    ratio = checkpoint.median() / inplace.median()
    return Outcome(f"{measured}; median ratio {ratio:.2f}x", verdict(low <= ratio <= high),
                   criterion)


@evaluates("iabn_memory_saving")
def _iabn_memory_saving(claim, frame):
    table = _by_strategy(frame)
    saving = pd.concat([table.loc[s, "memory_saving_pct"]
                        for s in ("inplace_abn_I", "inplace_abn_II")])
    tol = MEMORY_SAVING_TOLERANCE_PP
    ok = bool((abs(saving - claim["value"]) <= tol).all())
    return Outcome(f"INPLACE-ABN I/II save {saving.min():.1f}-{saving.max():.1f}% of "
                   "STANDARD's feature-map bytes",
                   verdict(ok, BY_CONSTRUCTION), f"criterion: {claim['value']:g} +/- {tol:g}% "
                   "less in every module; feature-map buffers only, as the paper counts them "
                   "(the per-channel statistics are in the CSV): the bytes the method keeps, "
                   "the same on every device, not a measurement of the paper's GPU")


@evaluates("iabn_buffers_per_strategy")
def _iabn_buffers(claim, frame):
    buffers = _by_strategy(frame)["saved_buffers"]
    rounded = buffers.round().astype(int)
    wrong = [f"{s} {m}: {b:.2f}" for (s, m), b in buffers.items()
             if rounded[(s, m)] != claim["value"][s]]
    measured = ", ".join(f"{s} {b.min():.2f}-{b.max():.2f}"
                         for s, b in buffers.groupby(level="strategy", sort=False))
    return Outcome(measured, verdict(not wrong, BY_CONSTRUCTION),
                   "criterion: saved feature-map bytes / input bytes rounds to the paper's count "
                   "in every module (the buffers the method keeps, the same on every device)"
                   + (f"; differs: {'; '.join(wrong)}" if wrong else ""))


@evaluates("iabn_fig1_residual_block_buffers")
def _iabn_residual_block_buffers(claim, frame):
    buffers = _by_strategy(frame)["saved_buffers"].round().astype(int) * claim["units"]
    counts = {strategy: buffers.loc[strategy] for strategy in claim["value"]}
    measured = ", ".join(f"{s} {sorted(set(c))}" for s, c in counts.items())
    ok = all((c == claim["value"][s]).all() for s, c in counts.items())
    return Outcome(f"buffers per block of {claim['units']} units: {measured}",
                   verdict(ok, BY_CONSTRUCTION),
                   f"criterion: {claim['units']} x a unit's saved feature-map bytes / input "
                   "bytes (rounded, every module of the timing run) equals the paper's count "
                   "for STANDARD (BN + in-place activation) and INPLACE-ABN I and II: the "
                   "buffers the method keeps, the same on every device")


@evaluates("iabn_ii_faster_than_checkpoint_proposed")
def _iabn_ii_faster(claim, frame):
    table = _by_strategy(frame)
    ii = table.loc["inplace_abn_II", "median_ms"]
    proposed = table.loc["checkpoint_proposed", "median_ms"]
    difference = 100 * (ii / proposed - 1)
    measured = f"INPLACE-ABN II vs CHECKPOINTING (proposed): {_span(difference)} time"
    if _device(frame) != "cuda":
        return Outcome(measured, NOT_MEASURABLE, GPU_TIMING)
    return Outcome(measured, verdict(bool((ii < proposed).all())),
                   "criterion: INPLACE-ABN II faster in every module")


# --------------------------------------------------------------------------- InPlace-ABN Table 2
CAPACITY_BODIES = {"resnext101": "ResNeXt-101", "wideresnet38": "WideResNet-38"}
CAPACITY_MODES = {"fixed_crop": "FIXED CROP", "fixed_batch": "FIXED BATCH"}
CAPACITY_DATASETS = {"cityscapes": "Cityscapes", "cocostuff": "COCO-Stuff"}
#: Table 2's bracket cells, each a claim of ``iabn_table2_capacity``: claim id -> (body, data
#: set, mode). The headline "+75%" is ResNeXt-101's FIXED CROP bracket on Cityscapes.
CAPACITY_CLAIMS = {
    "iabn_segmentation_data_increase": ("resnext101", "cityscapes", "fixed_crop"),
    **{f"iabn_capacity_{body}_{dataset}_{mode}": (body, dataset, mode)
       for body in CAPACITY_BODIES for dataset in CAPACITY_DATASETS for mode in CAPACITY_MODES
       if (body, dataset, mode) != ("resnext101", "cityscapes", "fixed_crop")}}
#: The paper's scale: full-width bodies and a 12 GB GPU's memory per device.
PAPER_BUDGET_MIB = 12 * 1024


def _capacity_summary(table, frame):
    """``"ResNeXt-101 FIXED CROP: 3 x 512^2 -> 6 x 512^2 (+100%); ... (scale)"`` of one kind of
    memory (``table``: :func:`capacity_gain` rows of it, ``frame``: its CSV rows), data set by
    data set."""
    cells = []
    for dataset, rows in table.groupby("dataset", sort=False):
        indexed = rows.set_index(["body", "mode", "norm"])
        prefix = f"{CAPACITY_DATASETS.get(dataset, dataset)} " if dataset else ""
        for (body, mode, norm), row in indexed.iterrows():
            if norm == "iabn" and (body, mode, "bn") in indexed.index:
                base = indexed.loc[(body, mode, "bn")]
                cells.append(f"{prefix}{CAPACITY_BODIES[body]} {CAPACITY_MODES[mode]}: "
                             f"{base['crops']} x {base['crop_size']}^2 -> {row['crops']} x "
                             f"{row['crop_size']}^2 ({row['gain_pct']:+.0f}%)")
    setting = frame.iloc[0]
    scale = (f"{', '.join(sorted(set(table['method'])))}, width {setting['width']:g}, "
             f"{setting['budget_mib']:g} MiB per device")
    return "; ".join(cells) + f" ({scale})", scale


def _capacity_parts(frame):
    """``{"real"|"simulated": (capacity_gain rows, CSV rows)}`` of the kinds of memory the run
    has, and which of them judges: real allocation on a GPU, else the simulated paper-scale
    points where there are any."""
    from ..iabn_table2_capacity import capacity_gain  # imports torch; move to analysis.py to avoid

    table = capacity_gain(frame)
    simulated = table["memory"] == analysis.SIMULATED
    simulated_frame = analysis.simulated_rows(frame)
    parts = {name: (table[rows].reset_index(drop=True), frame[frame_rows])
             for name, rows, frame_rows in (("real", ~simulated, ~simulated_frame),
                                            ("simulated", simulated, simulated_frame))
             if rows.any()}
    judged = "real" if _device(frame) == "cuda" or "simulated" not in parts else "simulated"
    return parts, judged


def _at_paper_scale(frame):
    """Whether every point of ``frame`` had a full-width body and a 12 GB budget per device."""
    return bool((frame["width"] == 1.0).all()
                and (frame["budget_mib"] >= PAPER_BUDGET_MIB * (1 - 1e-6)).all())


def _data_increase(claim, frame):
    """A Table 2 bracket (:data:`CAPACITY_CLAIMS`): INPLACE-ABN's pixels per batch over
    STD-BN's in one body, data set and mode, within the tolerance of the paper's, either side."""
    body, dataset, mode = CAPACITY_CLAIMS[claim["id"]]
    parts, judged = _capacity_parts(frame)
    summaries = {name: _capacity_summary(*part) for name, part in parts.items()}
    measured = "; ".join(f"{name}: {summaries[name][0]}" for name in parts)
    table, judged_frame = parts[judged]
    # Points without a data set label are the run's own, taken for Cityscapes (the headline's).
    labels = (dataset, "") if dataset == "cityscapes" else (dataset,)
    cells = table[table["dataset"].isin(labels)].set_index(["body", "mode", "norm"])
    name = f"{CAPACITY_BODIES[body]} {CAPACITY_MODES[mode]} on {CAPACITY_DATASETS[dataset]}"
    if (body, mode, "iabn") not in cells.index or (body, mode, "bn") not in cells.index:
        return Outcome(measured, NOT_RUN, f"no {name} pair (STD-BN and InPlace-ABN) among the "
                       f"{judged} points of this run")
    gain = cells.loc[(body, mode, "iabn"), "gain_pct"]
    tol = segmentation_claims.BRACKET_TOLERANCE_PP
    low, high = claim["value"] - tol, claim["value"] + tol
    scale = summaries[judged][1]
    paper_scale = _at_paper_scale(judged_frame)
    how = (SIMULATED_NOTE if judged == "simulated" else
           "real allocation at the paper's scale" if paper_scale else
           f"judged at the run's scale ({scale}), the paper's is full width and 12 GB per GPU")
    held = REPRODUCED if judged == "simulated" or paper_scale else CONSISTENT_SMALL_SCALE
    return Outcome(f"{name}: {gain:+.0f}%; {measured}", verdict(low <= gain <= high, held),
                   f"criterion: {name}, InPlace-ABN's pixels per batch over STD-BN's within "
                   f"+{low:g}% to +{high:g}% (the paper's +{claim['value']:g}% +/- {tol:g} pp), "
                   f"{judged} points ({scale}); {how}")


for _claim_id in CAPACITY_CLAIMS:
    evaluates(_claim_id)(_data_increase)


# --------------------------------------------------------------------------- report
def load_claims(artifacts):
    """Every claim entry of the papers' YAML files, each with its ``paper`` added."""
    claims = []
    for name in PAPER_FILES:
        path = Path(artifacts) / "paper" / name
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        claims += [{**entry, "paper": document["paper"]} for entry in document["claims"]]
    return claims


def implemented(experiment):
    """Whether ``experiment`` exists: its module ``experiments/<experiment>.py`` does (the
    Snakefile's rule runs it)."""
    return (EXPERIMENTS_DIR / f"{experiment}.py").is_file()


def not_planned(claim, measured="-"):
    """The outcome of a claim no point of the pipeline measures (its YAML's ``not_planned``
    says why, and what judging it takes), beside what the run did measure (``measured``)."""
    return Outcome(measured, NOT_MEASURED, f"no planned point measures it: "
                   f"{claim['not_planned']}")


def _unplanned(claim, frame):
    """The evaluator of a claim with ``not_planned`` and none of its own: the run's points say
    nothing of it, so nothing of them is shown as its measurement."""
    return not_planned(claim)


def evaluate(claim, artifacts):
    """``[(run, device_name, Outcome)]`` for every run of the claim's experiment; a claim
    with ``not_planned`` and no evaluator of its own gets :func:`not_planned`."""
    experiment = claim["experiment"]
    runs = paths.runs_of(experiment, artifacts)
    if not runs:
        if not implemented(experiment):
            return [("-", "-", Outcome("-", NOT_IMPLEMENTED, f"no experiments/{experiment}.py "
                                       "(and so no Snakemake rule) yet"))]
        return [("-", "-", Outcome("-", NOT_RUN, f"no {experiment} results yet"))]
    evaluator = EVALUATORS.get(claim["id"], _unplanned if "not_planned" in claim else None)
    if evaluator is None:
        raise LookupError(f"claim {claim['id']!r}: {experiment} has results ({runs}) but "
                          "experiments/report/claims.py has no evaluator for it")
    rows = []
    for run in runs:
        frame = pd.read_csv(paths.aggregate_csv(experiment, run, artifacts))
        device_name = ", ".join(sorted(set(frame["env_device_name"].fillna("unknown"))))
        rows.append((run, device_name, evaluator(claim, frame)))
    return rows


def _escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


#: The project's goal for ``impl="shared_inplace"``: saved bytes at most this many times the
#: lower bound, at every depth.
SHARED_INPLACE_GOAL = 1.15
#: ``densenet_fig4_memory``'s ``excess_*`` columns, as the memory goal names them.
EXCESS_PARTS = {"excess_shared_storage_bytes": "storage",
                "excess_per_channel_bytes": "per-channel states",
                "excess_feature_map_bytes": "feature maps",
                "excess_not_saved_bytes": "bound maps not saved"}


def _excess(row):
    """``"storage 1.5 + per-channel states 0.1 MiB"``: the nonzero parts of a point's excess."""
    parts = [f"{name} {row[column] / analysis.MIB:.2f}" for column, name in EXCESS_PARTS.items()
             if column in row and pd.notna(row[column]) and row[column]]
    return " + ".join(parts) + " MiB" if parts else "-"


def memory_goal(artifacts):
    """The one-storage DenseNet's saved bytes over the lower bound per run and depth, beside
    the paper's two-storage method's, as Markdown lines (the project's goal, not a paper's)."""
    lines = ["", "## DenseNet memory goal: one shared storage with InPlace-ABN", "",
             "From `artifacts/densenet_fig4_memory.<run>.csv` (`snakemake --cores 2 "
             "densenet_fig4_memory`): the bytes autograd keeps for backward plus the shared "
             "storages, over the lower bound (convolution and pooling outputs, two vectors per "
             "normalization channel), for `impl='shared_inplace'` (`norm='iabn'`: one "
             "storage, in place) beside the paper's two-storage `shared` (`nn.BatchNorm2d`), "
             "on the same architecture. This project's goal, not a paper's: at most "
             f"{SHARED_INPLACE_GOAL:g}x at every depth. The excess is the point's "
             "`excess_*` fields."]
    header = ["run", "device", "depth", "shared_inplace", "shared (paper)", "excess of "
              "shared_inplace", "goal", "met"]
    rows = []
    for run in paths.runs_of("densenet_fig4_memory", artifacts):
        frame = analysis.measured_points(
            pd.read_csv(paths.aggregate_csv("densenet_fig4_memory", run, artifacts)))
        points = frame[(frame["impl"] == "shared_inplace") & (frame["status"] == analysis.FITS)]
        paper = frame[(frame["impl"] == "shared") & (frame["status"] == analysis.FITS)]
        paper = (paper["saved_bytes"] / paper["lower_bound_bytes"]).set_axis(paper["depth"])
        for _, point in points.sort_values("depth").iterrows():
            ratio = point["saved_bytes"] / point["lower_bound_bytes"]
            theirs = paper.get(point["depth"])
            rows.append([run, point["env_device_name"], int(point["depth"]), f"{ratio:.3f}",
                         "-" if theirs is None else f"{theirs:.3f}", _excess(point),
                         f"<= {SHARED_INPLACE_GOAL:g}",
                         "**yes**" if ratio <= SHARED_INPLACE_GOAL else "**no**"])
    if not rows:
        return lines + ["", "No `shared_inplace` point yet."]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(_escape(c) for c in cells) + " |" for cells in rows]


def speed_goals(artifacts):
    """The kernel benchmark's speed goals (not the papers' claims: the project's own, see
    experiments/bench_kernels.py) per run, shape and dtype, as Markdown lines."""
    lines = ["", "## Kernel speed goals", "",
             "From `artifacts/bench_kernels/<run>.json` (`snakemake --cores 2 bench_kernels`; "
             "its figure: `figures/<run>/bench_kernels.png`): InPlace-ABN II forward + backward "
             "against `F.batch_norm` + `F.leaky_relu` and against 3.5 copies of the tensor, the "
             "forward against one copy, every contender timed interleaved in one process. "
             "Beside each goal, the copy's effective bandwidth in that row (2 x the tensor's "
             "bytes / its median time), which the copy-relative goals are judged against: on a "
             "shared machine the memory may run at different speeds from run to run, and a "
             "slower copy makes those goals easier to meet."]
    found = bench_kernels.runs(artifacts)
    if not found:
        return lines + ["", "No kernel benchmark yet."]
    header = ["run", "machine", "threads", "shape", "dtype", "goal", "measured", "copy (GB/s)",
              "met"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for run in found:
        report = bench_kernels.load(run, artifacts)
        for goal in bench_kernels.goals(report).itertuples(index=False):
            cells = [run, report["machine"], report["threads"], goal.shape, goal.dtype,
                     f"`{goal.goal}` {goal.comparison} {goal.threshold:g}", f"{goal.value:.2f}",
                     "not timed" if pd.isna(goal.copy_gbps) else f"{goal.copy_gbps:.1f}",
                     "**yes**" if goal.met else "**no**"]
            lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    return lines + crossover_lines(artifacts, found)


def crossover_lines(artifacts, found):
    """Markdown lines: per run, dtype and family of shapes measured at several batch sizes,
    the sizes between which InPlace-ABN overtakes the composite
    (:func:`experiments.report.bench_kernels.crossover`)."""
    header = ["run", "dtype", "shapes (C x H x W)", "sizes", "composite faster up to",
              "InPlace-ABN at least as fast from",
              "empty Python autograd function / composite, smallest size",
              "InPlace-ABN on ATen operators / composite, smallest size",
              "whole-step operators alone / composite, smallest size"]
    rows = []
    for run in found:
        for point in bench_kernels.crossover(bench_kernels.load(run, artifacts)).itertuples():
            rows.append([run, point.dtype, point.family, point.sizes,
                         point.slower_up_to or "none measured",
                         point.faster_from or "none measured",
                         *("not timed" if ratio is None else f"{ratio:.2f}"
                           for ratio in (point.python_floor_at_smallest,
                                         point.aten_inplace_at_smallest,
                                         point.whole_steps_at_smallest))])
    if not rows:
        return []
    lines = ["", "The crossover: the same channels and maps at several batch sizes (figure: "
             "the last panel of `figures/<run>/bench_kernels.png`). Below it the fixed cost of "
             "a call (the layer's Python, its per-channel steps and autograd function, waking "
             "the OpenMP threads of the kernels' parallel loops) outweighs the memory traffic "
             "saved. The last three columns, at "
             "the smallest size, over the composite's time: an in-place Python autograd "
             "function that does nothing, forward + backward (the part of the composite's time "
             "that the layer spends before any kernel runs), the same in-place layer "
             "written with ATen operators (above 1, no faster path to dispatch small tensors "
             "to), and the layer's two whole-step operators alone in such a function (above 1, "
             "no trimming of the layer's Python around the operators makes it as fast as the "
             "composite; the operators' own Python, their eager call and the backend's "
             "preparation of the compiled kernels' arguments, is still in it).", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(_escape(c) for c in cells) + " |" for cells in rows]


#: What each verdict says, for the report's legend.
LEGEND = {
    REPRODUCED: "measured at the claim's setting (or simulated at its scale, as the reason "
                "says) and the stated criterion holds",
    BY_CONSTRUCTION: "the criterion holds by construction of the method: the method's own "
                     "accounting (buffers kept), the same on every device, not a measurement "
                     "of the paper's hardware",
    CONSISTENT_SMALL_SCALE: "the criterion holds in a scaled-down run: consistent with the "
                            "claim, not a reproduction of it",
    NOT_REPRODUCED: "the stated criterion fails",
    NOT_MEASURABLE: "the claim needs hardware or software the run did not use",
    NOT_MEASURED: "the run did not cover the claim's setting (e.g. its depth, its framework, "
                  "its data set)",
    NOT_RUN: "no results yet",
    NOT_IMPLEMENTED: "no experiment measures it yet",
}


def _table_row(claim, run, device_name, outcome):
    """One Markdown row of the claims table."""
    cells = [f"`{claim['id']}`: {claim['statement']}", f"{claim['claimed']} ({claim['setting']})",
             claim["source"], run, device_name, outcome.measured, f"**{outcome.verdict}**",
             outcome.reason]
    return "| " + " | ".join(_escape(c) for c in cells) + " |"


def verdict_counts(rows):
    """Markdown lines: a table of how many rows of each paper got each verdict (``rows``:
    ``[(paper, Outcome)]``)."""
    papers = list(dict.fromkeys(paper for paper, _ in rows))
    header = ["paper", *VERDICTS, "rows"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for paper in papers:
        verdicts = [outcome.verdict for p, outcome in rows if p == paper]
        lines.append("| " + " | ".join([paper, *(str(verdicts.count(v)) for v in VERDICTS),
                                        str(len(verdicts))]) + " |")
    return lines


#: The verdicts of a claim not judged yet: what a reader with GPUs could change.
NOT_JUDGED = (NOT_MEASURABLE, NOT_MEASURED, NOT_RUN, NOT_IMPLEMENTED)
#: The profile at the papers' sizes, whose jobs judge the claims not judged yet.
PAPER_PROFILE = EXPERIMENTS_DIR / "config" / "paper.yaml"
#: The measurement experiments' GPU jobs in a profile section, one GPU each (their simulated
#: points run on the meta device, no GPU): how many.
MEASUREMENT_JOBS = {
    "densenet_fig2_contiguous": lambda s: len(s["in_channels"]),
    "iabn_table1_timing": lambda s: len(s["modules"]),
    "densenet_fig4_memory": lambda s: len(s["impls"]) * len(s["depths"]),
    "densenet_fig5_time": lambda s: len(s["depths"]),
    "iabn_table2_capacity": lambda s: 2 * len(s["modes"]) * sum(
        len(spec["crops"]) for spec in s["datasets"].values()),
    "iabn_digits_on_par": lambda s: len(s["seeds"]),
}
TRAINING_EXPERIMENTS = ("densenet_fig2_preact", "densenet_fig6_imagenet", "iabn_table1_imagenet")


def paper_jobs(profile):
    """``{experiment: [(GPUs, wall-time request in minutes, data set or None)]}``, one entry
    per GPU job of ``profile`` (a profile's mapping, e.g. the paper profile's), as the
    Snakefile's rules plan them."""
    from ..train import plan, seg_plan  # the planners of the training rules

    jobs = {experiment: [(1, profile[experiment]["cluster"]["runtime_min"], None)] * count(
        profile[experiment]) for experiment, count in MEASUREMENT_JOBS.items()}
    training = {e: plan.point_specs(profile[e]) for e in TRAINING_EXPERIMENTS}
    for experiment, specs in training.items():
        jobs[experiment] = [(s["nproc"], s["cluster"]["runtime_min"], s["dataset"])
                            for s in specs.values()]
    parity = profile["iabn_table1_imagenet"]["parity"]
    jobs["iabn_table1_imagenet"] += [(1, parity["cluster"]["runtime_min"], None)] * len(
        parity["models"])
    segmentation = seg_plan.point_specs(profile["iabn_table2_segmentation"],
                                        training["iabn_table1_imagenet"])
    jobs["iabn_table2_segmentation"] = [(s["devices"], s["cluster"]["runtime_min"],
                                         s["dataset"]) for s in segmentation.values()]
    return jobs


#: What the GPU-hours of :func:`to_judge` are.
GPU_HOURS_BASIS = ("an upper estimate, not a measurement: per job, the paper profile's "
                   "wall-time request (`cluster.runtime_min`, set with room to spare for the "
                   "papers' schedules: their epochs, data sets and GPUs) times its GPUs, summed "
                   "over the experiment's jobs")


def to_judge(rows, profile_path=PAPER_PROFILE):
    """Markdown lines: for the claims no run judged yet (``rows``: ``[(claim, Outcome)]``), per
    experiment what judging them takes at the paper profile (device, data sets, GPU-hours,
    the `snakemake` target), and the claims no planned point measures, with what it takes."""
    verdicts = {}
    for claim, outcome in rows:
        verdicts.setdefault(claim["id"], (claim, set()))[1].add(outcome.verdict)
    open_claims = [claim for claim, seen in verdicts.values() if seen <= set(NOT_JUDGED)]
    unplanned = [claim for claim in open_claims if "not_planned" in claim]
    by_experiment = {}
    for claim in open_claims:
        if "not_planned" not in claim:
            by_experiment.setdefault(claim["experiment"], []).append(claim["id"])
    profile = yaml.safe_load(Path(profile_path).read_text(encoding="utf-8"))
    jobs = paper_jobs(profile)
    lines = ["", "### What judging the claims not judged yet takes", "",
             f"Per experiment, at the paper profile (`{Path(profile_path).name}`): the device "
             f"its jobs ask for, the data sets, and GPU-hours ({GPU_HOURS_BASIS}). Run with "
             "`snakemake --cores all --resources gpu=<GPUs> --config profile=paper <target>` "
             "(the training experiments read the data sets from `datasets.<name>.root`). A "
             "target runs what it chains first: `iabn_table2_segmentation` its ImageNet bodies "
             "(`iabn_table1_imagenet`'s points) and its crops (`iabn_table2_capacity`'s), whose "
             "GPU-hours are in their own rows.", "",
             "| experiment (target) | claims not judged | device | data sets | jobs | "
             "GPU-hours (estimate) |", "|---|---|---|---|---|---|"]
    for experiment, ids in by_experiment.items():
        planned = jobs.get(experiment, [])
        gpus = sorted({g for g, _, _ in planned})
        datasets = sorted({d for _, _, d in planned if d}) or ["none (generated tensors)"]
        hours = sum(g * minutes for g, minutes, _ in planned) / 60
        device = (f"{profile['device']}, {' or '.join(map(str, gpus))} GPU(s) per job"
                  if planned else "-")
        cells = [f"`{experiment}`", f"{len(ids)}: " + ", ".join(f"`{i}`" for i in ids), device,
                 ", ".join(datasets), str(len(planned)) if planned else "not in the profile",
                 f"{hours:,.1f}" if planned else "-"]
        lines.append("| " + " | ".join(_escape(c) for c in cells) + " |")
    if unplanned:
        lines += ["", "No planned point measures these; what judging them takes:", ""]
        lines += [f"- `{claim['id']}`: {claim['not_planned']}" for claim in unplanned]
    return lines


def report(artifacts):
    """The claims report for every run under ``artifacts``, as Markdown."""
    claims = load_claims(artifacts)
    rows = [(claim, run, device_name, outcome) for claim in claims
            for run, device_name, outcome in evaluate(claim, artifacts)]
    lines = ["# The papers' claims beside this project's measurements", "",
             f"Generated by `python -m experiments.report.claims` from `{artifacts}` (the pipeline "
             "rewrites it; do not edit). The papers' numbers and their sources are in "
             "`artifacts/paper/`; each run is `<profile>-<device>`.", "",
             "Verdicts, one per claim and run, counted per paper:", "",
             *verdict_counts([(claim["paper"], outcome) for claim, _, _, outcome in rows]), "",
             "; ".join(f"**{v}**: {LEGEND[v]}" for v in VERDICTS) + ". A judged row's \"why\" "
             "states the criterion it was judged by.",
             *to_judge([(claim, outcome) for claim, _, _, outcome in rows])]
    header = ["claim", "the paper says", "source", "run", "device", "measured", "verdict",
              "why"]
    for paper in dict.fromkeys(c["paper"] for c in claims):
        lines += ["", f"## {paper}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        lines += [_table_row(*row) for row in rows if row[0]["paper"] == paper]
    lines += (memory_goal(artifacts) + speed_goals(artifacts)
              + whole_step_claims.goal_lines(artifacts))
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.report.claims",
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
