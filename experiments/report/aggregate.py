"""Aggregate the point artifacts of one run of one experiment into a CSV, one row per record.

Run as ``python -m experiments.report.aggregate --out artifacts/<experiment>.<run>.csv POINT.json ...``.
A point ``artifacts/<experiment>/<run>/<point>.json`` holds ``config``, ``results`` (a list of
records) and ``environment`` (see :mod:`experiments.records.point`); each record becomes a row with
``experiment``, ``run`` and ``point`` (from the path), the point's ``config`` and the
environment's ``device_name``, ``cpu_count_usable``, ``torch``, ``git_commit`` and ``date_utc``
(prefixed ``env_``). A record may repeat a config key (``repeats``) only with the same value.
The CSV is written atomically.
"""
import argparse
import json
from pathlib import Path

import pandas as pd

from ..records.atomic import atomic_path

#: Environment entries copied into every row (prefixed ``env_``).
ENVIRONMENT_COLUMNS = ("device_name", "cpu_count_usable", "torch", "git_commit", "date_utc")
REQUIRED_KEYS = ("experiment", "config", "results", "environment")


def rows_of(path):
    """The CSV rows of one point artifact at ``path``."""
    path = Path(path)
    report = json.loads(path.read_text(encoding="utf-8"))
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
    frame = aggregate(args.points)
    with atomic_path(args.out) as tmp:
        frame.to_csv(tmp, index=False)
    print(f"wrote {args.out}: {len(frame)} rows from {len(args.points)} points")


if __name__ == "__main__":
    main()
