"""Timing a callable: warm-up runs, then repeated timed runs summarised as median/min/max.

On CPU each run is timed with :func:`time.perf_counter`. On CUDA it is timed with a pair of
``torch.cuda.Event`` recorded on the current stream around the call, after synchronising, so
the time covers the device work the call queued and not the host's launch time alone.

:func:`time_callable` times one callable; :func:`time_interleaved` times several in rounds (each
runs once per round, in a shuffled order), so that load which drifts while they are measured
(other jobs, thermal throttling) and the state each call leaves to the next reach all of them
alike, and their ratios stay fair.
"""
import random
import statistics
import time

import torch


def _is_cuda(device):
    return torch.device(device).type == "cuda"


def _check_counts(warmup, repeats):
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    if int(warmup) != warmup or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")


def _timer(device):
    """``run_once(fn, setup) -> seconds``: ``setup`` (if any) untimed, then ``fn`` timed."""
    cuda = _is_cuda(device)
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} needs CUDA, which is not available")

    def run_once(fn, setup):
        args = () if setup is None else (setup(),)
        if cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        start = time.perf_counter()
        fn(*args)
        return time.perf_counter() - start

    return run_once


def _summary(times):
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "repeats": len(times),
    }


def time_callable(fn, warmup, repeats, device="cpu", setup=None):
    """Time ``fn`` ``repeats`` times after ``warmup`` untimed calls.

    If ``setup`` is given it runs, untimed, before every call (warm-up ones included) and its
    return value is passed to ``fn``: ``fn(setup())``; otherwise ``fn()`` is called. Returns
    ``dict(median_s, min_s, max_s, repeats)`` in seconds.
    """
    _check_counts(warmup, repeats)
    run_once = _timer(device)
    for _ in range(int(warmup)):
        run_once(fn, setup)
    return _summary([run_once(fn, setup) for _ in range(int(repeats))])


def time_interleaved(fns, warmup, repeats, device="cpu", setups=None, seed=0):
    """Time every callable of ``fns`` (``{name: fn}``) in ``warmup + repeats`` rounds.

    Each round calls every ``fn`` once, in an order drawn afresh for the round (a permutation
    from ``random.Random(seed)``: the same orders on every run), so no callable is always the
    first, or always the one after the same neighbour. What a call leaves behind reaches all of
    them alike: a warm or a cold cache, or a thread pool gone to sleep or still spinning (on a
    CPU, torch's operators and numba's loops each run on an OpenMP pool of their own, two
    copies of libgomp in one process; a pool's threads spin for a while after their work and
    then sleep, and the next parallel call pays for waking them, or shares the cores with the
    other pool's spinning threads, a cost that a fixed order would charge to one contender
    only). The first ``warmup`` rounds are not
    timed. ``setups`` (``{name: setup}``, optional per name) works as ``setup`` of
    :func:`time_callable`. Returns ``{name: dict(median_s, min_s, max_s, repeats)}`` in the
    order of ``fns``.
    """
    _check_counts(warmup, repeats)
    if not fns:
        raise ValueError("fns is empty: give at least one callable to time")
    setups = dict(setups or {})
    unknown = sorted(set(setups) - set(fns))
    if unknown:
        raise ValueError(f"setups names {unknown}, which are not in fns {list(fns)}")
    run_once = _timer(device)
    names = list(fns)
    order = random.Random(seed)
    times = {name: [] for name in names}
    for r in range(int(warmup) + int(repeats)):
        for name in order.sample(names, len(names)):
            seconds = run_once(fns[name], setups.get(name))
            if r >= warmup:
                times[name].append(seconds)
    return {name: _summary(times[name]) for name in names}


__all__ = ["time_callable", "time_interleaved"]
