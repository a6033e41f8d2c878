"""The self-check's numerical checks in several processes at once (``--jobs N``).

The checks compile every CPU and CUDA kernel variant they compare (every dtype, layout,
activation and mode), one after another: on a GPU machine that is minutes of one core's work,
longer than the checks themselves. :func:`run_checks` hands the cases to worker processes
(``python -m experiments.gpu_selfcheck.parallel SPEC OUT``), one slice of the case list each
(a dtype, layout and layer), at most ``jobs`` running at a time, and returns the records in the
order of the case list, as :func:`.checks.run_checks` would.

Each worker compiles into a numba disk cache of its own, in a temporary directory removed at
the end: two processes compiling signatures of one kernel into one cache at once can leave an
index entry that names the other's machine code. So the kernels compiled here are not kept for
a later run (the serial self-check, ``--jobs 1``, writes numba's usual cache).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..records.atomic import write_json_atomic
from ..records.paths import REPO_ROOT
from . import checks

#: The environment variable of numba's disk cache directory.
CACHE_VARIABLE = "NUMBA_CACHE_DIR"


def slices(case_list):
    """``case_list`` cut into slices of one dtype, layout and layer each, in order of first
    appearance (every case in exactly one slice)."""
    groups = {}
    for case in case_list:
        groups.setdefault((case.dtype, case.layout, case.layer, case.variant), []).append(case)
    return list(groups.values())


def _command(spec_path, out_path):
    return [sys.executable, "-m", "experiments.gpu_selfcheck.parallel", str(spec_path),
            str(out_path)]


def _failed_worker(case_list, message):
    """One error record per case of a worker that ended without writing its records (the
    record :func:`.checks.run_checks` makes of a case that raises)."""
    return [checks.record(case, "layer", "run", checks._outcome("error", message))
            for case in case_list]


class _Worker:
    """One slice's worker process, started at once; :meth:`records` waits for its records."""

    def __init__(self, index, shape, device, case_list, directory):
        self.case_list = case_list
        directory = Path(directory)
        spec = directory / f"slice{index}.json"
        self.out = directory / f"slice{index}.records.json"
        spec.write_text(json.dumps({"shape": list(shape), "device": str(device),
                                    "cases": [c.describe() for c in case_list]}))
        env = {**os.environ, CACHE_VARIABLE: str(directory / f"cache{index}")}
        self._log = open(directory / f"slice{index}.log", "w+", encoding="utf-8")
        self.process = subprocess.Popen(_command(spec, self.out), cwd=REPO_ROOT, env=env,
                                        stdout=self._log, stderr=subprocess.STDOUT, text=True)

    def records(self):
        code = self.process.wait()
        self._log.seek(0)
        output = self._log.read()
        self._log.close()
        if code == 0 and self.out.is_file():
            return json.loads(self.out.read_text())
        return _failed_worker(self.case_list, f"the worker process exited with status {code}"
                                              f": {output[-1500:]}")


def run_checks(shape, device, case_list, jobs, progress=None):
    """The records of :func:`.checks.run_checks` for ``case_list`` on ``device``, computed by
    at most ``jobs`` worker processes at a time (see the module docstring). A worker that ends
    without its records leaves one ``error`` record per case of its slice, with the end of its
    output. ``progress`` (optional) wraps the list of slices as they finish."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: must be at least 1")
    names = [case.name for case in case_list]
    if len(set(names)) != len(names):
        raise ValueError("case_list: every case must be named once (the records are put back "
                         "in its order by name)")
    parts = slices(case_list)
    results = [None] * len(parts)
    with tempfile.TemporaryDirectory(prefix="gpu_selfcheck_jobs_") as directory:
        running, waiting = [], list(enumerate(parts))
        finished = range(len(parts))  # one slice finishes per iteration
        try:
            for _ in (finished if progress is None else progress(finished)):
                while waiting and len(running) < jobs:
                    index, part = waiting.pop(0)
                    running.append((index, _Worker(index, shape, device, part, directory)))
                index, worker = running.pop(0)  # the oldest: slices take about as long
                results[index] = worker.records()
        finally:  # interrupted: no worker outlives its directory
            for _, worker in running:
                worker.process.kill()
                worker.records()  # waits for it, closes its log
    by_case = {}
    for part in results:
        for record in part:
            by_case.setdefault(record["case"]["name"], []).append(record)
    return [record for case in case_list for record in by_case[case.name]]


def main(argv=None):
    """The worker: ``SPEC`` (JSON: shape, device, cases) in, the records written to ``OUT``."""
    spec_path, out_path = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(spec_path).read_text())
    fields = [{k: v for k, v in case.items() if k != "name"} for case in spec["cases"]]
    records = checks.run_checks(spec["shape"], spec["device"], [checks.Case(**f) for f in fields])
    write_json_atomic(Path(out_path), records)


__all__ = ["CACHE_VARIABLE", "main", "run_checks", "slices"]

if __name__ == "__main__":
    main()
