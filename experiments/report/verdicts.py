"""The verdicts of the claims report and the registry of claim evaluators.

An evaluator is a function ``fn(claim, frame) -> Outcome`` for one claim id, registered with
:func:`evaluates`; :mod:`experiments.report.claims` (the measurement experiments' evaluators and
the report), :mod:`experiments.report.training_claims` (the classification training
experiments') and :mod:`experiments.report.segmentation_claims` (InPlace-ABN Table 2's) all
register here, so the report finds every evaluator however it is started.
"""
import dataclasses

REPRODUCED = "reproduced"
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


def verdict(ok):
    """:data:`REPRODUCED` if ``ok`` else :data:`NOT_REPRODUCED`."""
    return REPRODUCED if ok else NOT_REPRODUCED


__all__ = ["REPRODUCED", "NOT_REPRODUCED", "NOT_MEASURABLE", "NOT_MEASURED", "NOT_RUN",
           "NOT_IMPLEMENTED", "Outcome", "EVALUATORS", "evaluates", "verdict"]
