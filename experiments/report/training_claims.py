"""Evaluators of the training experiments' claims (DenseNet Fig. 2 left and Fig. 6, InPlace-ABN
Table 1 left and "on par with STD-BN"), registered with :func:`experiments.report.verdicts.evaluates`
when :mod:`experiments.report.claims` imports this module.

A training claim is about the paper's recipe on the real data set: a run is at the claimed
setting only if it trained the paper's network for the paper's epochs on the full training set
(:data:`FULL_TRAIN_IMAGES`); otherwise the verdict is "not measured at the claimed setting" and
the measured numbers are still shown. "On par with STD-BN" is such a claim (Table 1's
ResNeXt-101 at batch 256); the float64 parity of InPlace-ABN and STD-BN + activation is a row
of its own, an exactness check of the implementation that holds by construction at any scale
and on any device, and says nothing of accuracy. Its accuracy part is also checked at small
scale on real images (:mod:`experiments.iabn_digits_on_par`): "consistent at small scale" or
not, beside the ImageNet row, never in its place.
"""
import json

from . import training
from ..train import parity
from .verdicts import (BY_CONSTRUCTION, CONSISTENT_SMALL_SCALE, NOT_MEASURED, Outcome,
                       evaluates, verdict)

#: Training images of the released data sets: a run on fewer (the generated smoke sets) is not
#: at the papers' setting.
FULL_TRAIN_IMAGES = {"cifar10": 50_000, "cifar100": 50_000, "imagenet": 1_281_167}
#: Percentage points a measured error or accuracy may differ from the paper's (run-to-run
#: spread of these trainings is a few tenths of a point).
TOLERANCE_PP = 0.5
#: Steps a parity point must train for its verdict.
PARITY_MIN_STEPS = 100


def _at_setting(rows, epochs, model_args=None):
    """Whether every row trained ``epochs`` epochs on the full data set (and, given
    ``model_args``, with those constructor arguments); ``(ok, why_not)``."""
    for row in rows.itertuples():
        if row.train_images != FULL_TRAIN_IMAGES[row.dataset]:
            return False, (f"trained on {int(row.train_images)} images of the generated "
                           f"{row.dataset}-format set (the paper: "
                           f"{FULL_TRAIN_IMAGES[row.dataset]})")
        if row.epochs != epochs:
            return False, f"trained {int(row.epochs)} epochs (the paper: {epochs})"
        args = json.loads(row.model_args)
        if model_args and any(args.get(k) != v for k, v in model_args.items()):
            return False, f"trained {row.model} with {args} (the paper: {model_args})"
    return True, ""


def _preact(claim, frame, dataset):
    table = training.preact_errors(frame)
    rows = table[table["dataset"] == dataset].set_index("activation_order")
    if set(rows.index) != {"pre-activation", "post-activation"}:
        return Outcome(f"{sorted(rows.index)} of {dataset}", NOT_MEASURED,
                       "the run lacks the pre- or the post-activation network")
    pre, post = rows.loc["pre-activation", "error_pct"], rows.loc["post-activation", "error_pct"]
    measured = f"{pre:.2f}% (pre) vs {post:.2f}% (post) on {dataset}"
    ok, why = _at_setting(frame[frame["dataset"] == dataset], 300,
                          {"depth": 100, "growth_rate": 12})
    if not ok:
        return Outcome(measured, NOT_MEASURED, why)
    claimed = claim["value"]
    good = (post > pre and abs(pre - claimed["preact"]) <= TOLERANCE_PP
            and abs(post - claimed["postact"]) <= TOLERANCE_PP)
    return Outcome(measured, verdict(good), f"criterion: post-activation error above "
                   f"pre-activation, each within {TOLERANCE_PP} pp of the paper's")


@evaluates("densenet_preact_error_cifar10")
def _preact_cifar10(claim, frame):
    return _preact(claim, frame, "cifar10")


@evaluates("densenet_preact_error_cifar100")
def _preact_cifar100(claim, frame):
    return _preact(claim, frame, "cifar100")


#: The points that judge the ImageNet accuracy claims: DenseNet Fig. 6's deepest cosine model,
#: and InPlace-ABN Table 1's STD-BN baseline and INPLACE-ABN at batch 512.
DENSENET_TOP1_POINT = "densenet264_k48_cosine"
IABN_TOP1_POINTS = ("resnext101_bn_256", "resnext101_iabn_512")


@evaluates("densenet_imagenet_top1")
def _densenet_imagenet_top1(claim, frame):
    table = training.imagenet_densenets(frame)
    measured = ", ".join(f"{r.network} k={r.growth_rate} {r.schedule}: {r.top1_error_pct:.2f}% "
                         f"({r.params_m:.1f}M)" for r in table.itertuples())
    rows = frame[frame["point"] == DENSENET_TOP1_POINT]
    if rows.empty:
        return Outcome(measured, NOT_MEASURED, "the run has no DenseNet-264 k=48 cosine point")
    ok, why = _at_setting(rows, 100, {"growth_rate": 48})
    if not ok:
        return Outcome(measured, NOT_MEASURED, why)
    error = rows["top1_error_pct"].iloc[0]
    return Outcome(measured, verdict(abs(error - claim["value"]) <= TOLERANCE_PP),
                   f"criterion: top-1 error within {TOLERANCE_PP} pp of {claim['value']}%")


def _table1_row(frame, point):
    """The Table 1 row of ``point`` (accuracies per evaluation), or ``None``."""
    table = training.table1(frame)
    rows = table[table["point"] == point]
    return None if rows.empty else rows.iloc[0]


def _accuracies(row, value):
    return ", ".join(f"{key} {row[key]:.2f}" for key in value if key in row.index)


@evaluates("iabn_imagenet_top1")
def _iabn_imagenet_top1(claim, frame):
    base, large = (_table1_row(frame, p) for p in IABN_TOP1_POINTS)
    if base is None or large is None:
        return Outcome("-", NOT_MEASURED, "the run lacks the STD-BN 256 or InPlace-ABN 512 row")
    measured = (f"{base['center224_top1']:.2f}% (STD-BN, batch {base['batch']}) -> "
                f"{large['center224_top1']:.2f}% (InPlace-ABN, batch {large['batch']})")
    points = frame[frame["point"].isin(IABN_TOP1_POINTS)]
    ok, why = _at_setting(points, 90)
    if not ok:
        return Outcome(measured, NOT_MEASURED, why)
    value = claim["value"]
    good = (large["center224_top1"] > base["center224_top1"]
            and abs(base["center224_top1"] - value["std_bn_256"]) <= TOLERANCE_PP
            and abs(large["center224_top1"] - value["inplace_abn_512"]) <= TOLERANCE_PP)
    return Outcome(measured, verdict(good), f"criterion: the batch-512 InPlace-ABN network "
                   f"more accurate, each within {TOLERANCE_PP} pp of the paper's")


def _table1_evaluator(point):
    def evaluate(claim, frame):
        row = _table1_row(frame, point)
        if row is None:
            return Outcome("-", NOT_MEASURED, f"the run has no {point} point")
        measured = (f"{_accuracies(row, claim['value'])} (batch {row['batch']}, "
                    f"{row['ranks']} rank(s), {row['params_m']:.1f}M parameters)")
        ok, why = _at_setting(frame[frame["point"] == point], 90)
        if not ok:
            return Outcome(measured, NOT_MEASURED, why)
        off = {k: abs(row[k] - v) for k, v in claim["value"].items() if k in row.index}
        missing = sorted(set(claim["value"]) - set(off))
        if missing:
            return Outcome(measured, NOT_MEASURED, f"the run did not evaluate {missing}")
        return Outcome(measured, verdict(max(off.values()) <= TOLERANCE_PP),
                       f"criterion: every accuracy within {TOLERANCE_PP} pp of the paper's")
    return evaluate


for _point in ("resnext101_bn_256", "resnext101_iabn_512", "resnext152_iabn_256",
               "wideresnet38_iabn_256", "densenet264_iabn_256", "resnext101_iabn_sync_256"):
    evaluates(f"iabn_table1_{_point}")(_table1_evaluator(_point))


#: The ResNeXt-101 points of Table 1 that "on par" compares: the same batch, STD-BN and
#: INPLACE-ABN^sync.
ON_PAR_POINTS = {"std_bn_256": "resnext101_bn_256",
                 "inplace_abn_sync_256": "resnext101_iabn_sync_256"}


@evaluates("iabn_trains_on_par")
def _trains_on_par(claim, frame):
    rows = {key: _table1_row(frame, point) for key, point in ON_PAR_POINTS.items()}
    criterion = (f"criterion: ResNeXt-101 INPLACE-ABN^sync's top-1 (224 centre) at most "
                 f"{TOLERANCE_PP} pp below STD-BN's at the same batch, both at the paper's "
                 "setting ('on par' bounds a loss of accuracy, not a gain)")
    if any(row is None for row in rows.values()):
        return Outcome("-", NOT_MEASURED, f"{criterion}; the run lacks "
                       f"{' or '.join(ON_PAR_POINTS.values())} (the float64 exactness check, "
                       "iabn_float64_parity, is no accuracy)")
    top1 = {key: row["center224_top1"] for key, row in rows.items()}
    measured = (f"{top1['std_bn_256']:.2f}% (STD-BN) vs {top1['inplace_abn_sync_256']:.2f}% "
                "(INPLACE-ABN^sync), batch 256")
    ok, why = _at_setting(frame[frame["point"].isin(ON_PAR_POINTS.values())], 90)
    if not ok:
        return Outcome(measured, NOT_MEASURED, f"{criterion}; {why}")
    return Outcome(measured, verdict(top1["inplace_abn_sync_256"]
                                     >= top1["std_bn_256"] - TOLERANCE_PP), criterion)


def on_par_seeds(frame):
    """Validation accuracy per norm over the seeds of an :mod:`experiments.iabn_digits_on_par`
    run (its aggregate CSV): one row per norm (``bn``, ``iabn``) with ``seeds``, ``mean``,
    ``std`` (sample standard deviation over the seeds), ``min`` and ``max``."""
    table = frame.groupby("norm")["val_accuracy"].agg(
        seeds="count", mean="mean", std="std", min="min", max="max")
    return table.reindex([n for n in ("bn", "iabn") if n in table.index])


def on_par_within_spread(table):
    """``(difference, bound, ok)``: InPlace-ABN's mean validation accuracy minus STD-BN's, the
    seeds' spread (the larger of the two norms' standard deviations over the seeds) and
    whether the difference lies within it on either side (two-sided: a gain beyond the spread
    is no more "on par" than a loss)."""
    difference = table.loc["iabn", "mean"] - table.loc["bn", "mean"]
    bound = max(table.loc["bn", "std"], table.loc["iabn", "std"])
    return difference, bound, abs(difference) <= bound


@evaluates("iabn_on_par_small_scale")
def _on_par_small_scale(claim, frame):
    table = on_par_seeds(frame)
    criterion = ("criterion: |mean InPlace-ABN - mean STD-BN validation accuracy| at most the "
                 "larger of the two norms' standard deviations over the seeds (two-sided), "
                 "the same seeds for both; a small-scale check beside iabn_trains_on_par, "
                 "whose ImageNet setting it does not replace")
    if set(table.index) != {"bn", "iabn"} or (table["seeds"] < 2).any():
        return Outcome("-", NOT_MEASURED, f"{criterion}; the run needs at least two seeds "
                       "of each norm")
    seeds = {norm: set(frame.loc[frame["norm"] == norm, "seed"]) for norm in table.index}
    if seeds["bn"] != seeds["iabn"]:
        return Outcome("-", NOT_MEASURED, f"{criterion}; the norms' seeds differ: "
                       f"{sorted(seeds['bn'])} vs {sorted(seeds['iabn'])}")
    difference, bound, ok = on_par_within_spread(table)
    epochs = ", ".join(str(int(e)) for e in sorted(set(frame["epochs"])))
    measured = "; ".join(
        f"{'STD-BN' if r.Index == 'bn' else 'INPLACE-ABN'} {100 * r.mean:.2f}% ± "
        f"{100 * r.std:.2f} [{100 * r.min:.2f}, {100 * r.max:.2f}]" for r in table.itertuples())
    measured += (f"; difference {100 * difference:+.2f} pp vs spread {100 * bound:.2f} pp "
                 f"({int(table.loc['bn', 'seeds'])} seeds, {epochs} epochs, real 8x8 digits)")
    return Outcome(measured, verdict(ok, CONSISTENT_SMALL_SCALE), criterion)


@evaluates("iabn_float64_parity")
def _float64_parity(claim, frame):
    table = training.parity(frame)
    if table.empty:
        return Outcome("-", NOT_MEASURED, "the run has no parity point")
    measured = "; ".join(
        f"{r.model}: {int(r.steps)} float64 steps, loss {r.first_loss:.4f} -> "
        f"{r.final_loss:.4f}; InPlace-ABN within rounding of STD-BN for "
        f"{int(r.steps_within_rounding_inplace_abn)} steps (largest relative difference "
        f"{r.max_loss_rel_diff_inplace_abn:.1e}), the rounding control for "
        f"{int(r.steps_within_rounding_control)} "
        f"({r.max_loss_rel_diff_control:.1e})" for r in table.itertuples())
    if (table["steps"] < PARITY_MIN_STEPS).any():
        return Outcome(measured, NOT_MEASURED, f"fewer than {PARITY_MIN_STEPS} steps")
    good = all(parity.keeps_pace(r.steps_within_rounding_inplace_abn,
                                 r.steps_within_rounding_control) for r in table.itertuples())
    return Outcome(measured, verdict(good, BY_CONSTRUCTION), (
        f"an exactness check of this implementation, not an accuracy: for every model, "
        f"InPlace-ABN's loss stays within a relative {parity.ROUNDING:g} of STD-BN's for as "
        f"many steps (less one) as STD-BN's own from weights perturbed by "
        f"{parity.CONTROL_PERTURBATION:g} (the rounding control: beyond that the training "
        "amplifies rounding errors whatever the implementation, so a model whose control "
        "diverges within a few steps checks only those steps)"))


def _table1_points(claim, frame, points):
    """``(rows, None)``: the Table 1 rows of ``points`` trained at the paper's setting, or
    ``(None, Outcome)`` saying which is missing or off the setting (with what was measured)."""
    rows = {point: _table1_row(frame, point) for point in points}
    missing = [point for point, row in rows.items() if row is None]
    if missing:
        return None, Outcome("-", NOT_MEASURED, f"the run has no {', '.join(missing)} point")
    measured = ", ".join(f"{p} {row['center224_top1']:.2f}%" for p, row in rows.items())
    ok, why = _at_setting(frame[frame["point"].isin(points)], 90)
    return (rows, None) if ok else (None, Outcome(measured, NOT_MEASURED, why))


@evaluates("iabn_table1_order_more_memory")
def _table1_order(claim, frame):
    points = list(dict.fromkeys(p for pair in claim["pairs"] for p in pair))
    rows, outcome = _table1_points(claim, frame, points)
    if outcome:
        return outcome
    gaps = [(high, low, rows[high]["center224_top1"] - rows[low]["center224_top1"])
            for high, low in claim["pairs"]]
    return Outcome("; ".join(f"{high} vs {low}: {gap:+.2f} pp" for high, low, gap in gaps),
                   verdict(all(gap > 0 for _, _, gap in gaps)),
                   f"criterion: in each of the {len(gaps)} pair(s), the first point's top-1 "
                   "(224 centre) above the second's, as in the paper's table (an order is a "
                   "bound: how far above is the rows' own criterion)")


@evaluates("iabn_table1_batch512_like_resnext152")
def _table1_similar(claim, frame):
    first, second = claim["similar"]
    rows, outcome = _table1_points(claim, frame, [first, second])
    if outcome:
        return outcome
    gap = rows[first]["center224_top1"] - rows[second]["center224_top1"]
    return Outcome(f"{first} {rows[first]['center224_top1']:.2f}% vs {second} "
                   f"{rows[second]['center224_top1']:.2f}% ({gap:+.2f} pp)",
                   verdict(abs(gap) <= TOLERANCE_PP),
                   f"criterion: top-1 (224 centre) within {TOLERANCE_PP} pp of each other "
                   "either side ('similar accuracy': the trainings' run-to-run spread)")
