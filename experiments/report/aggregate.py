"""Aggregate the point artifacts of one run of one experiment into a CSV, one row per record.

Run as ``python -m experiments.report.aggregate --out artifacts/<experiment>.<run>.csv POINT.json ...``.
A point ``artifacts/<experiment>/<run>/<point>.json`` holds ``config``, ``results`` (a list of
records) and ``environment`` (see :mod:`experiments.records.point`); each record becomes a row with
``experiment``, ``run`` and ``point`` (from the path), the point's ``config`` and the
environment's ``device_name``, ``cpu_count_usable``, ``torch``, ``git_commit`` and ``date_utc``
(prefixed ``env_``). A record may repeat a config key (``repeats``) only with the same value.
The CSV is written atomically, and only once every point has been read: a point that is not
valid JSON (a truncated or edited file) stops the command with one line naming the file and
the command that measures it again, and the previous CSV is left as it was.
"""
import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from ..records.atomic import atomic_path

#: Environment entries copied into every row (prefixed ``env_``).
ENVIRONMENT_COLUMNS = ("device_name", "cpu_count_usable", "torch", "git_commit", "date_utc")
REQUIRED_KEYS = ("experiment", "config", "results", "environment")


def load_point(path):
    """The point artifact at ``path`` as a dict; a ``ValueError`` naming the file, and how to
    measure it again, if it is not a JSON object."""
    path = Path(path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(
            f"{path}: not a readable point artifact ({type(error).__name__}: {error}); it is "
            f"truncated or was edited. Delete it and run `snakemake --cores all {path}`: the "
            "rule that wrote it measures the point again") from error
    if not isinstance(report, dict):
        raise ValueError(f"{path}: not a point artifact (a JSON {type(report).__name__}, "
                         "expected an object)")
    return report


def rows_of(path):
    """The CSV rows of one point artifact at ``path``."""
    path = Path(path)
    report = load_point(path)
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise ValueError(f"{path}: not a point artifact, missing {missing}")
    if not report["results"]:
        raise ValueError(f"{path}: 'results' is empty")
    head = {"experiment": report["experiment"], "run": path.parent.name, "point": path.stem,
            **report["config"],
            **{f"env_{key}": report["environment"].get(key) for key in ENVIRONMENT_COLUMNS}}
    clashes = sorted({key for record in report["results"] for key in record
                      if key in head and record[key] != head[key]})
    if clashes:
        raise ValueError(f"{path}: result keys {clashes} differ from the config/path keys of "
                         "the same name")
    return [{**head, **record} for record in report["results"]]


def aggregate(paths):
    """A :class:`pandas.DataFrame` of every record of the point artifacts ``paths``."""
    if not paths:
        raise ValueError("paths is empty: give at least one point artifact")
    return pd.DataFrame([row for path in paths for row in rows_of(path)])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.report.aggregate",
                                     description="Aggregate point artifacts into one CSV.")
    parser.add_argument("points", type=Path, nargs="+", help="point JSON artifacts")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    args = parser.parse_args(argv)
    try:
        frame = aggregate(args.points)
    except (OSError, ValueError) as error:
        sys.exit(f"{parser.prog}: error: {error}")
    with atomic_path(args.out) as tmp:
        frame.to_csv(tmp, index=False)
    print(f"wrote {args.out}: {len(frame)} rows from {len(args.points)} points")


if __name__ == "__main__":
    main()
