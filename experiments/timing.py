"""Timing a callable: warm-up runs, then repeated timed runs summarised as median/min/max.

On CPU each run is timed with :func:`time.perf_counter`. On CUDA it is timed with a pair of
``torch.cuda.Event`` recorded on the current stream around the call, after synchronising, so
the time covers the device work the call queued and not the host's launch time alone.
"""
import statistics
import time

import torch


def _is_cuda(device):
    return torch.device(device).type == "cuda"


def time_callable(fn, warmup, repeats, device="cpu", setup=None):
    """Time ``fn`` ``repeats`` times after ``warmup`` untimed calls.

    If ``setup`` is given it runs, untimed, before every call (warm-up ones included) and its
    return value is passed to ``fn``: ``fn(setup())``; otherwise ``fn()`` is called. Returns
    ``dict(median_s, min_s, max_s, repeats)`` in seconds.
    """
    if int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    if int(warmup) != warmup or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be an integer >= 0")
    cuda = _is_cuda(device)
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} needs CUDA, which is not available")

    def run_once():
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

    for _ in range(int(warmup)):
        run_once()
    times = [run_once() for _ in range(int(repeats))]
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "repeats": len(times),
    }


__all__ = ["time_callable"]
