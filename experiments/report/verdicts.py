"""The verdicts of the claims report and the registry of claim evaluators.

An evaluator is a function ``fn(claim, frame) -> Outcome`` for one claim id, registered with
:func:`evaluates`; :mod:`experiments.report.claims` (the measurement experiments' evaluators and
the report), :mod:`experiments.report.training_claims` (the classification training
experiments') and :mod:`experiments.report.segmentation_claims` (InPlace-ABN Table 2's) all
register here, so the report finds every evaluator however it is started.
"""
import dataclasses

#: Measured at the claim's setting (or simulated at its scale, which the reason says) and the
#: criterion holds.
REPRODUCED = "reproduced"
#: The criterion holds by construction of the method: what is counted is the method's own
#: accounting (buffers it keeps, arithmetic it performs), the same on every device, not a
#: measurement of the paper's hardware.
BY_CONSTRUCTION = "holds by construction"
#: The criterion holds in a scaled-down run (narrower bodies, smaller budgets): consistent
#: with the claim, not a reproduction of it.
CONSISTENT_SMALL_SCALE = "consistent at small scale"
NOT_REPRODUCED = "not reproduced"
NOT_MEASURABLE = "not measurable on this device"
NOT_MEASURED = "not measured at the claimed setting"
NOT_RUN = "not run"
NOT_IMPLEMENTED = "not implemented"


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


def verdict(ok, held=REPRODUCED):
    """``held`` (the kind of success: :data:`REPRODUCED`, :data:`BY_CONSTRUCTION` or
    :data:`CONSISTENT_SMALL_SCALE`) if ``ok`` else :data:`NOT_REPRODUCED`."""
    return held if ok else NOT_REPRODUCED


#: Every verdict, in the order the report's legend and counts list them.
VERDICTS = (REPRODUCED, BY_CONSTRUCTION, CONSISTENT_SMALL_SCALE, NOT_REPRODUCED, NOT_MEASURABLE,
            NOT_MEASURED, NOT_RUN, NOT_IMPLEMENTED)


__all__ = ["REPRODUCED", "BY_CONSTRUCTION", "CONSISTENT_SMALL_SCALE", "VERDICTS", "NOT_REPRODUCED", "NOT_MEASURABLE", "NOT_MEASURED", "NOT_RUN",
           "NOT_IMPLEMENTED", "Outcome", "EVALUATORS", "evaluates", "verdict"]
