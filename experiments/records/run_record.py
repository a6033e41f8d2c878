"""The record of one pipeline run: the machine, the code, the software, and how long the run
and each rule's jobs took, so a reader finds the run's numbers in its artifacts, not in notes.

Run as ``python -m experiments.records.run_record --run RUN --profile PROFILE --device DEVICE
--benchmarks DIR --out RECORD.json`` (the Snakefile's rule ``run_record``, the last job of
``all``). It writes ``RECORD.json`` and beside it ``RECORD.md`` (the same as tables) and
``RECORD.html`` (that page, for ``snakemake --report``).

What it holds:

- ``environment``: what every point record holds (:func:`.environment.describe_environment`:
  versions, whether the install matches ``requirements.lock``, CPU model, cores, commit), plus
  the host name, the memory, the GPUs torch sees, whether the checkout had uncommitted changes,
  and Snakemake's version.
- ``invocation``: the wall time since the ``snakemake`` process that runs the pipeline started,
  and the CPU time of it and every process it started on this machine (finished or still
  running, e.g. the fork server), read from the process ``--snakemake-pid`` names (the
  Snakefile passes its own). ``None`` without one (a record written by hand).
- ``rules``: per rule, from Snakemake's ``benchmark:`` files of this run
  (``<benchmarks>/<rule>/<run>/<job>.tsv``, :func:`.paths.job_benchmark`): the jobs, their total
  and longest wall time, their CPU time and largest resident set. A job that did not run in
  this invocation keeps the file of its last run. Snakemake measures the process it started:
  with the fork server that is the client, so a rule's CPU time and memory then miss the job's
  own work (its wall time is the job's). ``fork_server`` says whether the jobs ran so (the
  server's socket is in the job's environment, :data:`.forkserver.SOCKET_ENV`).
"""
import argparse
import csv
import math
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import psutil
import torch

from ..report.html_page import markdown_to_html
from . import forkserver, paths
from .atomic import atomic_path, write_json_atomic
from .environment import describe_environment, git_output
from .paths import REPO_ROOT

#: The columns of a Snakemake benchmark file the record reads: wall seconds, CPU seconds and
#: peak resident set (MB); Snakemake writes ``NA`` for the last two when it could not sample
#: the process (it ended first).
BENCHMARK_COLUMNS = ("s", "cpu_time", "max_rss")
_MISSING = "NA"


def read_benchmark(path):
    """The rows of one Snakemake benchmark file as ``[{"s", "cpu_time", "max_rss"}]`` floats
    (``None`` where Snakemake wrote ``NA``; a ``repeat()`` benchmark has one row per repeat).

    Raises ``ValueError`` naming the file (and line) for a file that is not one: no header with
    the columns, no row, a value that is no number, or a negative or missing wall time."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t")
        missing = [c for c in BENCHMARK_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a Snakemake benchmark file: no column(s) {missing} "
                             f"in its header {reader.fieldnames}")
        rows = []
        for number, row in enumerate(reader, start=2):
            values = {}
            for column in BENCHMARK_COLUMNS:
                text = (row[column] or "").strip()
                if text == _MISSING and column != "s":
                    values[column] = None
                    continue
                try:
                    values[column] = float(text)
                except ValueError:
                    raise ValueError(f"{path}:{number}: column {column!r} is {text!r}, "
                                     "not a number") from None
                if not math.isfinite(values[column]) or values[column] < 0:
                    raise ValueError(f"{path}:{number}: column {column!r} is {text!r}, "
                                     "not a finite number >= 0")
            rows.append(values)
    if not rows:
        raise ValueError(f"{path}: a benchmark file without a row (the job wrote no time)")
    return rows


def _total(values):
    """The sum of ``values``, or ``None`` when one is missing (a partial sum would mislead)."""
    return None if any(v is None for v in values) else round(sum(values), 3)


def _largest(values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


def rule_times(benchmarks, run):
    """``{rule: {"jobs", "wall_s", "wall_s_max", "cpu_s", "max_rss_mb"}}`` of the benchmark
    files of ``run`` under ``benchmarks`` (``<benchmarks>/<rule>/<run>/<job>.tsv``), rules
    sorted by name. ``wall_s``/``cpu_s`` sum every row of every job (``cpu_s`` is ``None`` if a
    row has none); ``wall_s_max`` is the longest row, ``max_rss_mb`` the largest known."""
    benchmarks = Path(benchmarks)
    if not benchmarks.is_dir():
        raise FileNotFoundError(f"benchmarks={str(benchmarks)!r} is not a directory")
    rules = {}
    for path in sorted(benchmarks.glob(f"*/{run}/*.tsv")):
        rules.setdefault(path.parent.parent.name, []).append(read_benchmark(path))
    times = {}
    for rule, jobs in rules.items():
        rows = [row for job in jobs for row in job]
        times[rule] = {
            "jobs": len(jobs),
            "wall_s": _total([r["s"] for r in rows]),
            "wall_s_max": max(r["s"] for r in rows),
            "cpu_s": _total([r["cpu_time"] for r in rows]),
            "max_rss_mb": _largest([r["max_rss"] for r in rows]),
        }
    return times


def invocation_times(pid):
    """``{"wall_s", "cpu_s"}`` of the process ``pid`` and the processes it started, or ``None``
    when ``pid`` is ``None`` or no process.

    CPU time counts the process, its finished children (which the kernel adds to it when they
    are reaped) and every live descendant with its own finished children."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
        started = root.create_time()
    except psutil.NoSuchProcess:
        return None
    cpu = 0.0
    for process in processes:
        try:
            t = process.cpu_times()
        except psutil.NoSuchProcess:  # ended while we looked: its parent counts it now
            continue
        cpu += t.user + t.system + t.children_user + t.children_system
    return {"wall_s": round(time.time() - started, 3), "cpu_s": round(cpu, 3)}


def _git_dirty(root=REPO_ROOT):
    """Whether tracked files of the checkout differ from its commit; ``None`` without git."""
    status = git_output(["status", "--porcelain", "--untracked-files=no"], root, timeout=30)
    return None if status is None else bool(status)


def _gpus():
    """The names of the CUDA GPUs torch sees (``[]`` without any)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def describe_machine(device):
    """:func:`.environment.describe_environment` with what a run record adds to a point's."""
    return {
        **describe_environment(device),
        "host": platform.node() or None,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": _gpus(),
        "git_dirty": _git_dirty(),
        "snakemake": metadata.version("snakemake"),
    }


def make_record(run, profile, device, benchmarks, snakemake_pid=None):
    """The record (a JSON-serialisable dict) of ``run``: see the module's docstring."""
    return {
        "run": run,
        "profile": profile,
        "environment": describe_machine(device),
        "invocation": invocation_times(snakemake_pid),
        "fork_server": forkserver.SOCKET_ENV in os.environ,
        "rules": rule_times(benchmarks, run),
    }


def _cell(value):
    return "n/a" if value is None else str(value)


def to_markdown(record):
    """The record as Markdown: the machine and the run, then one row per rule."""
    env, invocation = record["environment"], record["invocation"] or {}
    install = env["install"]
    rules = record["rules"]
    facts = [
        ("run", record["run"]), ("profile", record["profile"]), ("host", env["host"]),
        ("CPU", env["cpu_model"]),
        ("cores (usable / all)", f"{env['cpu_count_usable']} / {env['cpu_count']}"),
        ("memory (GiB)", env["memory_gib"]), ("GPUs", ", ".join(env["gpus"]) or "none"),
        ("commit", f"{env['git_commit']}{' (uncommitted changes)' if env['git_dirty'] else ''}"),
        ("Python / torch / numba / numpy / Snakemake",
         " / ".join(str(env[k]) for k in ("python", "torch", "numba", "numpy", "snakemake"))),
        ("packages match requirements.lock", install["matches_lock"]),
        ("wall time of the run (s)", invocation.get("wall_s")),
        ("CPU time of the run (s)", invocation.get("cpu_s")),
        ("jobs' wall time, summed (s)", _total([t["wall_s"] for t in rules.values()])),
    ]
    lines = [f"# Run record: {record['run']}", "", "| | |", "|---|---|",
             *(f"| {name} | {_cell(value)} |" for name, value in facts)]
    if install["differs_from_lock"]:
        lines += ["", "Packages that differ from requirements.lock: "
                  + "; ".join(install["differs_from_lock"])]
    header = ["rule", "jobs", "wall (s)", "longest job (s)", "CPU (s)", "max RSS (MB)"]
    lines += ["", "## Jobs per rule (Snakemake benchmark files)", "",
              "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for rule, t in rules.items():
        cells = [rule, t["jobs"], t["wall_s"], t["wall_s_max"], t["cpu_s"], t["max_rss_mb"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if record["fork_server"]:
        lines += ["", "The jobs ran as forks of the fork server (the profile's `forkserver`): "
                  "Snakemake measured their clients, so the CPU and memory columns are the "
                  "clients'; the wall times are the jobs'."]
    return "\n".join(lines) + "\n"


def write_record(record, out):
    """Write ``out`` (JSON) and, beside it, the ``.md`` and ``.html`` pages; return the paths."""
    out = Path(out)
    markdown = to_markdown(record)
    written = [write_json_atomic(out, record)]
    for suffix, text in ((".md", markdown),
                         (".html", markdown_to_html(markdown, f"Run record {record['run']}"))):
        with atomic_path(out.with_suffix(suffix)) as tmp:
            tmp.write_text(text, encoding="utf-8")
        written.append(out.with_suffix(suffix))
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.records.run_record",
                                     description="Write the record of a pipeline run.")
    parser.add_argument("--run", required=True, help="the run, e.g. smoke-cpu")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--device", required=True, help="cpu or cuda")
    parser.add_argument("--benchmarks", type=Path, default=Path("artifacts") / "benchmarks",
                        help="the benchmark files' root (default: %(default)s)")
    parser.add_argument("--snakemake-pid", type=int, default=None,
                        help="the process id of the snakemake run whose wall and CPU time "
                             "the record holds (default: none, no such times)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON record (default: paths.run_record(RUN, 'json'))")
    args = parser.parse_args(argv)
    if not args.benchmarks.is_dir():
        parser.error(f"--benchmarks: no such directory: {args.benchmarks}")
    record = make_record(args.run, args.profile, args.device, args.benchmarks,
                         args.snakemake_pid)
    for path in write_record(record, args.out or paths.run_record(args.run, "json")):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
