"""Learning-rate schedules of the papers' recipes, as pure functions and as checkpointable
optimizer schedulers stepped once per iteration.

:func:`make_schedule` builds a :class:`Schedule`: ``schedule(epoch, fraction)`` is the learning
rate at ``fraction`` (in ``[0, 1)``) of the way through the 0-based ``epoch``, and
``schedule.at_step(step)`` the same at a global iteration. :func:`make_scheduler` wraps one in a
:class:`ScheduledLR` (a ``torch.optim.lr_scheduler.LRScheduler``) that the engine steps after
every optimizer step, so iteration ``k`` runs at ``schedule.at_step(k)`` and the scheduler's
``state_dict`` (just the step count and the schedule's description) goes into checkpoints.

Schedules (``name``; parameters with defaults):

- ``"step"`` (``gamma=0.1``, ``step_epochs=30``): ``base_lr * gamma ** (epoch // step_epochs)``,
  constant within an epoch. InPlace-ABN §4.1's ResNeXt/DenseNet-264 recipe ("reducing the
  learning rate every 30 epochs by a factor of 10"); fb.resnet.torch's
  ``floor((epoch - 1) / 30)`` with its 1-based epochs.
- ``"linear"`` (``final_lr=1e-6``): ``base_lr + (final_lr - base_lr) * p`` with training
  progress ``p = (epoch + fraction) / epochs``, per iteration, reaching ``final_lr`` as training
  ends. InPlace-ABN §4.1's WideResNet-38 ("a linear learning rate decay from 0.1 to 1e-6").
- ``"cosine"``: DenseNet (memory-efficient report) §5, "the learning rate of epoch t set to
  0.05 cos(t(π/100)) + 1" for 100 epochs. Taken literally that would stay within
  ``[0.95, 1.05]``, contradicting the text ("starts off with a large learning rate, and quickly
  (but smoothly) anneals the learning rate to a small value") and the 0.1 initial rate of the
  procedure it follows; the intended formula is ``0.05 (cos(t π / 100) + 1)``, i.e.
  ``base_lr / 2 * (cos(π t / epochs) + 1)`` with ``base_lr = 0.1``: 0.1 at ``t = 0``, falling
  to near 0. As the paper writes it, the rate is set per *epoch* (``t`` is the 0-based epoch;
  constant within an epoch), not per iteration.
- ``"cifar"`` (``gamma=0.1``, ``milestones=(0.5, 0.75)``): ``base_lr`` multiplied by ``gamma``
  once for each milestone fraction ``m`` with ``epoch >= m * epochs``. DenseNet's CIFAR recipe
  ("divided by 10 at 50% and 75% of the total number of training epochs"; 300 epochs, batch
  64): with 0-based epochs the rate drops after exactly 150 and 225 completed epochs.
- ``"poly"`` (``power=0.9``): ``base_lr * (1 - iter / max_iter) ** power`` per iteration with
  ``max_iter = epochs * steps_per_epoch`` (InPlace-ABN §4.2, following DeepLab).

Bad names or parameters raise ``ValueError`` naming the argument and what is allowed.
"""
import math
from dataclasses import dataclass, field

from torch.optim.lr_scheduler import LRScheduler

#: Each schedule's parameters and their defaults.
DEFAULTS = {
    "step": {"gamma": 0.1, "step_epochs": 30},
    "linear": {"final_lr": 1e-6},
    "cosine": {},
    "cifar": {"gamma": 0.1, "milestones": (0.5, 0.75)},
    "poly": {"power": 0.9},
}
SCHEDULES = tuple(DEFAULTS)


def _lr_step(base_lr, epochs, epoch, fraction, *, gamma, step_epochs):
    return base_lr * gamma ** (epoch // step_epochs)


def _lr_linear(base_lr, epochs, epoch, fraction, *, final_lr):
    return base_lr + (final_lr - base_lr) * ((epoch + fraction) / epochs)


def _lr_cosine(base_lr, epochs, epoch, fraction):
    return base_lr / 2 * (math.cos(math.pi * epoch / epochs) + 1)


def _lr_cifar(base_lr, epochs, epoch, fraction, *, gamma, milestones):
    drops = sum(1 for m in milestones if epoch >= m * epochs)
    return base_lr * gamma ** drops


def _lr_poly(base_lr, epochs, epoch, fraction, *, power):
    return base_lr * (1 - (epoch + fraction) / epochs) ** power


_FORMULAS = {"step": _lr_step, "linear": _lr_linear, "cosine": _lr_cosine, "cifar": _lr_cifar,
             "poly": _lr_poly}


def _check_params(name, params):
    unknown = sorted(set(params) - set(DEFAULTS[name]))
    if unknown:
        raise ValueError(f"schedule_params={params!r}: {name!r} takes "
                         f"{sorted(DEFAULTS[name]) or 'no parameters'}, not {unknown}")
    merged = {**DEFAULTS[name], **params}
    for key in ("gamma", "final_lr", "power"):
        if key in merged and not (isinstance(merged[key], (int, float))
                                  and math.isfinite(merged[key]) and merged[key] >= 0):
            raise ValueError(f"schedule_params[{key!r}]={merged[key]!r}: expected a finite "
                             f"number >= 0")
    if "step_epochs" in merged and not (isinstance(merged["step_epochs"], int)
                                        and merged["step_epochs"] >= 1):
        raise ValueError(f"schedule_params['step_epochs']={merged['step_epochs']!r}: expected "
                         f"an integer >= 1")
    if "milestones" in merged:
        ms = merged["milestones"]
        if not (isinstance(ms, (list, tuple)) and all(isinstance(m, (int, float)) and 0 < m < 1
                                                      for m in ms)):
            raise ValueError(f"schedule_params['milestones']={ms!r}: expected fractions of the "
                             f"epochs in (0, 1)")
        merged["milestones"] = tuple(float(m) for m in ms)
    return merged


@dataclass(frozen=True)
class Schedule:
    """The learning rate as a function of training progress (see the module docstring)."""

    name: str
    base_lr: float
    epochs: int
    steps_per_epoch: int
    params: dict = field(default_factory=dict)

    def __call__(self, epoch, fraction=0.0):
        """The learning rate at ``fraction`` of the way through the 0-based ``epoch``."""
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"epoch={epoch!r}: expected 0 <= epoch < epochs={self.epochs}")
        if not 0 <= fraction < 1:
            raise ValueError(f"fraction={fraction!r}: expected 0 <= fraction < 1")
        return float(_FORMULAS[self.name](self.base_lr, self.epochs, epoch, fraction,
                                          **self.params))

    def at_step(self, step):
        """The learning rate of global iteration ``step`` (0-based) of training.

        Steps past the end of training (the scheduler is stepped once more after the last
        iteration) keep the last iteration's rate.
        """
        step = min(int(step), self.epochs * self.steps_per_epoch - 1)
        epoch, within = divmod(step, self.steps_per_epoch)
        return self(epoch, within / self.steps_per_epoch)

    def describe(self):
        """A plain dict naming the schedule (stored in scheduler checkpoints and fingerprints)."""
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}
        return {"name": self.name, "base_lr": float(self.base_lr), "epochs": self.epochs,
                "steps_per_epoch": self.steps_per_epoch, "params": params}


def make_schedule(name, base_lr, epochs, steps_per_epoch, **params):
    """The :class:`Schedule` ``name`` (one of :data:`SCHEDULES`) for a run of ``epochs`` epochs
    of ``steps_per_epoch`` iterations starting at ``base_lr``; ``params`` override
    :data:`DEFAULTS`."""
    if name not in DEFAULTS:
        raise ValueError(f"schedule={name!r}: expected one of {list(SCHEDULES)}")
    if not (isinstance(base_lr, (int, float)) and math.isfinite(base_lr) and base_lr > 0):
        raise ValueError(f"base_lr={base_lr!r}: expected a finite number > 0")
    for arg, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"{arg}={value!r}: expected an integer >= 1")
    return Schedule(name, float(base_lr), epochs, steps_per_epoch, _check_params(name, params))


class ScheduledLR(LRScheduler):
    """Sets every parameter group's rate to ``initial_lr * schedule.at_step(k) / base_lr`` at
    iteration ``k``; call :meth:`step` after every optimizer step.

    Its ``state_dict`` holds the step count and ``schedule.describe()``; loading one written for
    a different schedule raises ``ValueError`` naming both, so a checkpoint never silently
    continues under another schedule.
    """

    def __init__(self, optimizer, schedule, last_epoch=-1):
        self.schedule = schedule
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        factor = self.schedule.at_step(self.last_epoch) / self.schedule.base_lr
        return [initial * factor for initial in self.base_lrs]

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "schedule")}
        state["schedule"] = self.schedule.describe()
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("schedule", None)
        if saved != self.schedule.describe():
            raise ValueError(f"scheduler state for schedule {saved!r} does not match this "
                             f"run's schedule {self.schedule.describe()!r}")
        self.__dict__.update(state)


def make_scheduler(optimizer, schedule):
    """A :class:`ScheduledLR` driving ``optimizer`` along ``schedule`` (the optimizer's rates
    are the schedule's ``base_lr``; groups with another initial rate are scaled alike)."""
    return ScheduledLR(optimizer, schedule)


__all__ = ["DEFAULTS", "SCHEDULES", "Schedule", "ScheduledLR", "make_schedule",
           "make_scheduler"]
