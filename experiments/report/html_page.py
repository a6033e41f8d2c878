"""A Markdown file (a notebook's table, the claims report, the run record) as one standalone
HTML page, for ``snakemake --report``: the report displays an HTML result in a frame, but offers
a Markdown file only as a download.

Run as ``python -m experiments.report.html_page IN.md --out OUT.html [--title TITLE]``. The page
holds its own style (no external resources), so it displays the same inside the report's
self-contained HTML file and on its own. Markdown tables (GitHub's pipe syntax, as every table
of this project is written) become ``<table>`` elements.
"""
import argparse
import html
import sys
from pathlib import Path

import mistune

from ..records.atomic import atomic_path

#: Tables readable at a glance: borders, padding, a shaded header row, numbers not wrapped.
STYLE = """
body { font-family: sans-serif; margin: 1.5em; line-height: 1.4; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""

_MARKDOWN = mistune.create_markdown(plugins=["table"])


def markdown_to_html(markdown, title):
    """``markdown`` rendered as a complete HTML document titled ``title``."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a str, got {type(markdown).__name__}")
    return ("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n{_MARKDOWN(markdown)}</body>\n</html>\n")


def write_html(markdown_path, out, title=None):
    """Write ``markdown_path`` rendered by :func:`markdown_to_html` to ``out`` atomically (a
    reader never sees half a page); the title defaults to the Markdown file's stem."""
    markdown_path = Path(markdown_path)
    if not markdown_path.is_file():
        raise FileNotFoundError(f"{markdown_path} does not exist: nothing to render as HTML")
    page = markdown_to_html(markdown_path.read_text(encoding="utf-8"),
                            title or markdown_path.stem)
    with atomic_path(Path(out)) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return Path(out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.report.html_page",
                                     description="Render a Markdown file as an HTML page.")
    parser.add_argument("markdown", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    parser.add_argument("--title", default=None, help="the page title (default: file stem)")
    args = parser.parse_args(argv)
    if not args.markdown.is_file():
        parser.error(f"{args.markdown}: no such file")
    write_html(args.markdown, args.out, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
