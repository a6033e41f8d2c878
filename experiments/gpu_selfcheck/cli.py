"""``python -m experiments.gpu_selfcheck [--out DIR] [--quick] [--jobs N]``: the self-check's
command line.

Without a CUDA GPU it prints that there is nothing to check and exits with status 0, writing
nothing. With one it runs, on the current CUDA device:

1. the numerical checks (:mod:`.checks`), which compile every kernel (numba caches them on
   disk: a later run skips the compilation); with ``--jobs N`` (N > 1) in N worker processes
   at once (:mod:`.parallel`, each with a numba cache of its own, dropped afterwards), while
   the layer tests run beside them;
2. the layer tests on CUDA tensors (:mod:`.layer_tests`), in a pytest subprocess;
3. the timings (:mod:`.timing`), the GPU otherwise idle;

and writes ``DIR/<gpu name>.json`` (settings, environment, every check, the layer tests'
summary, every timing) and ``DIR/<gpu name>.md`` (:mod:`.report`), each atomically (a
temporary file renamed), ``DIR`` defaulting to ``artifacts/gpu_selfcheck``. It exits with
status 1 if a check or a layer test failed or a timing point could not run (the files are
written all the same), else 0; timing goals missed are reported, not errors.
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..records.atomic import atomic_path, write_json_atomic
from ..records.environment import describe_environment
from . import checks, layer_tests, parallel, report, timing

NO_GPU_MESSAGE = ("gpu_selfcheck: no CUDA GPU on this machine (torch.cuda.is_available() is "
                  "False): nothing to check, nothing written")
DEFAULT_OUT = Path("artifacts") / "gpu_selfcheck"
#: The ResNeXt-101 3x3-convolution inputs of the four stages (batch 32, 224x224 images), and a
#: small tensor.
TIMING_SHAPES = ((32, 256, 56, 56), (32, 512, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7),
                 (8, 64, 28, 28))
TIMING_DTYPES = ("float32", "float16", "bfloat16")
#: The layer tests' time limit (they take well under a minute on a GPU once compiled).
LAYER_TESTS_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one self-check runs."""

    quick: bool
    check_shape: tuple             # (N, C, H, W) of the numerical checks
    check_dtypes: tuple
    timing_shapes: tuple
    timing_dtypes: tuple
    timing_layouts: tuple
    warmup: int
    repeats: int


FULL = Settings(quick=False, check_shape=(16, 32, 37, 41), check_dtypes=tuple(checks.DTYPES),
                timing_shapes=TIMING_SHAPES, timing_dtypes=TIMING_DTYPES,
                timing_layouts=tuple(checks.LAYOUTS), warmup=5, repeats=25)
QUICK = Settings(quick=True, check_shape=(4, 16, 9, 11), check_dtypes=tuple(checks.DTYPES),
                 timing_shapes=(TIMING_SHAPES[0], TIMING_SHAPES[-1]),
                 timing_dtypes=TIMING_DTYPES, timing_layouts=("contiguous",), warmup=2,
                 repeats=10)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.gpu_selfcheck",
        description="On a CUDA GPU: run the layer tests on CUDA tensors, compare the CUDA "
                    "kernels with the CPU kernels and with PyTorch's batch norm, time them "
                    "against a copy and against F.batch_norm + activation, and write "
                    "DIR/<gpu name>.json and .md. Without a GPU: say so and exit 0.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"directory of the two files (default: {DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller check tensor, 2 timing shapes, contiguous only, "
                             "fewer repeats")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run the checks in N processes at once, the layer tests beside "
                             "them (the kernels compile in N processes; those compiled for "
                             "the checks are not cached for a later run; default 1)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be at least 1")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out}: is a file, expected a directory")
    return args


def gpu_info(device):
    """The GPU's properties and cuDNN's version (``None`` on a CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "index": torch.cuda.current_device() if device.index is None else device.index,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "memory_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_enabled": torch.backends.cudnn.enabled,
    }


def _progress(desc):
    return lambda items: tqdm(items, desc=desc, file=sys.stderr, mininterval=2)


def run_selfcheck(settings, device="cuda", run_layer_tests=True, jobs=1):
    """Run everything of ``settings`` on ``device``; return the result (the JSON's dict).

    ``run_layer_tests=False`` leaves the layer tests out (``layer_tests: None``); where they
    cannot run (no pytest, no tests/ directory) they are recorded as skipped, with the reason.
    ``jobs`` > 1 runs the checks in that many processes (:mod:`.parallel`) and the layer tests
    at the same time.
    """
    start = time.perf_counter()
    durations = {}
    tests, tests_result = None, None
    if run_layer_tests:
        reason = layer_tests.unavailable()
        if reason is not None:
            tests_result = layer_tests.not_run(reason, device)
        elif jobs > 1:
            # Beside the checks' workers, which compile into caches of their own: the tests
            # are then the only process writing numba's usual cache.
            tests = layer_tests.Run(device, timeout=LAYER_TESTS_TIMEOUT_S)
    case_list = checks.cases(dtypes=settings.check_dtypes)
    check_progress = _progress("gpu_selfcheck checks")
    if jobs > 1:
        records = parallel.run_checks(settings.check_shape, device, case_list, jobs,
                                      progress=check_progress)
    else:
        records = checks.run_checks(settings.check_shape, device, case_list,
                                    progress=check_progress)
    durations["checks"] = time.perf_counter() - start

    # In one process (jobs 1), after the checks, not beside them: the checks compile every
    # kernel the tests use into numba's usual cache, and two processes compiling different
    # signatures of one kernel into one disk cache at once can leave an index entry naming
    # the other's machine code.
    if run_layer_tests and tests_result is None:
        if tests is None:
            print("gpu_selfcheck: the layer tests on CUDA tensors (pytest)", file=sys.stderr,
                  flush=True)
            tests = layer_tests.Run(device, timeout=LAYER_TESTS_TIMEOUT_S)
        tests_result = tests.result()
        durations["layer_tests"] = tests_result["duration_s"]

    gpu = gpu_info(device)
    timing_start = time.perf_counter()
    timings = timing.run_timings(settings.timing_shapes, settings.timing_dtypes,
                                 settings.timing_layouts, device, settings.warmup,
                                 settings.repeats, l2_bytes=gpu and gpu["l2_cache_bytes"],
                                 progress=_progress("gpu_selfcheck timing"))
    durations["timings"] = time.perf_counter() - timing_start
    durations["total"] = time.perf_counter() - start

    environment = describe_environment(device)
    environment["gpu"] = gpu
    result = {
        "selfcheck": "gpu_selfcheck",
        "settings": {
            **{k: list(v) if isinstance(v, tuple) else v
               for k, v in dataclasses.asdict(settings).items()},
            "device": str(device),
            "jobs": jobs,
            "tolerances": {dtype: {"atol": a, "rtol": r}
                           for dtype, (a, r) in checks.TOLERANCES.items()},
            "bounds": {name: {"floor": floor, "goal": goal}
                       for name, (floor, goal) in timing.BOUNDS.items()},
        },
        "environment": environment,
        "summary": None,  # below: report.summarize's counts
        "layer_tests": tests_result,
        "checks": records,
        "timings": timings,
        "durations_s": durations,
    }
    result["summary"] = {k: v for k, v in report.summarize(result).items() if k != "layer_tests"}
    return result


def write_artifacts(result, out_dir):
    """Write ``<out_dir>/<gpu name>.json`` and ``.md`` (each atomically); return both paths.

    The report is rendered and the JSON serialised before either file is written, so a result
    that cannot be written (a NaN, which strict JSON refuses) leaves no file at all.
    """
    stem = report.artifact_stem(result["environment"].get("device_name"))
    json_path, md_path = Path(out_dir) / f"{stem}.json", Path(out_dir) / f"{stem}.md"
    markdown = report.render_markdown(result)
    json.dumps(result, allow_nan=False)  # raises here, before anything is written
    write_json_atomic(json_path, result)
    with atomic_path(md_path) as tmp:
        tmp.write_text(markdown, encoding="utf-8")
    return json_path, md_path


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, flush=True)
        return 0
    result = run_selfcheck(QUICK if args.quick else FULL, jobs=args.jobs)
    summary = report.summarize(result)
    json_path, md_path = write_artifacts(result, args.out)
    checks_count = summary["checks"]
    print(f"gpu_selfcheck on {result['environment']['device_name']}: "
          f"{'PASSED' if summary['ok'] else 'FAILED'}; checks {checks_count['pass']} passed, "
          f"{checks_count['fail'] + checks_count['error']} failed, {checks_count['skipped']} "
          f"skipped; timing goals met {summary['goals']['met']} of {summary['goals']['total']}")
    print(f"wrote {json_path} and {md_path}")
    return 0 if summary["ok"] else 1


__all__ = ["FULL", "NO_GPU_MESSAGE", "QUICK", "Settings", "main", "parse_args", "run_selfcheck",
           "write_artifacts"]
