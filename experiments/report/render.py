"""Execute a figure notebook headless, top to bottom, against a given artifact set.

Run as ``python -m experiments.report.render figures/NAME.ipynb --run RUN [--artifacts DIR]
[--out DIR] [--timeout S]``. The notebook runs in a fresh ``python3`` kernel started in the
notebook's directory (as Jupyter would), with ``ARTIFACTS_DIR``, ``ARTIFACTS_RUN`` and
``FIGURES_DIR`` set (see :mod:`experiments.records.paths`); it writes its own figure and table files
atomically through :mod:`experiments.report.figure_io`. The notebook file is not modified. A failing
cell exits with status 1 and prints the cell's error. The table's Markdown is then also written as
an HTML page (:mod:`experiments.report.html_page`): ``snakemake --report`` shows it.
"""
import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from ..records import paths
from .html_page import write_html


def render(notebook, run, artifacts, out, timeout=600):
    """Execute ``notebook`` with the environment pointing at ``artifacts``/``run``/``out``."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise FileNotFoundError(f"notebook={str(notebook)!r} does not exist")
    env = {"ARTIFACTS_DIR": str(Path(artifacts).resolve()), "ARTIFACTS_RUN": run,
           "FIGURES_DIR": str(Path(out).resolve())}
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute(env={**os.environ, **env})  # the kernel's environment
    table = Path(out) / f"{notebook.stem}.md"
    write_html(table, table.with_suffix(".html"), title=notebook.stem)
    return nb


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.report.render",
                                     description="Execute a figure notebook headless.")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--run", required=True, help="run whose artifacts to plot, e.g. smoke-cpu")
    parser.add_argument("--artifacts", type=Path, default=paths.artifacts_dir(),
                        help="artifact root (default: $ARTIFACTS_DIR, else the artifacts/ of "
                             "the checkout holding the current directory)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where figures and tables go (default: $FIGURES_DIR, else "
                             "<checkout>/figures/<run>)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"notebook {args.notebook}: no such file")
    out = args.out or paths.figures_dir(args.run)
    try:
        render(args.notebook, args.run, args.artifacts, out, args.timeout)
    except CellExecutionError as error:
        print(f"{args.notebook}: a cell failed\n{error}", file=sys.stderr)
        return 1
    print(f"rendered {args.notebook} for run {args.run} into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
