"""Deleting only what this project created: folders carry a marker file the tool wrote.

A folder the project's tools create for themselves (a training point's ``--work-dir``, a
generated data set, the fork server's socket folder) gets a marker file, :data:`MARKER`, when
it is created. A tool removes a folder only through :func:`remove`, which refuses a folder
without the marker: a path that names a user's folder by mistake (``--work-dir .``, a profile's
data root pointing at a real data set) is never emptied. :func:`claim` is how a tool takes a
folder it is given: a new or empty folder becomes its own, a marked folder is its own from an
earlier run (a resume), and a folder holding anything else is refused before anything is
written.

The marker says whether the tool made the folder or adopted an existing empty one: a made
folder is removed whole, an adopted one keeps existing and loses only the files the tool names
as its own (:func:`remove`'s ``own``), because the folder itself is the user's.
"""
import json
import shutil
from pathlib import Path

#: The marker file's name, in the folder it marks.
MARKER = ".created-by-experiments.json"


class NotOwnedError(FileExistsError):
    """A folder holds files and no marker: it was not created here, so it is left alone."""


def is_marked(directory):
    """Whether ``directory`` holds this project's marker."""
    return (Path(directory) / MARKER).is_file()


def mark(directory, tool, *, made=True):
    """Write the marker into the existing folder ``directory``: ``tool`` created it (``made``)
    or adopted it empty. Returns ``directory`` as a :class:`Path`."""
    directory = Path(directory)
    (directory / MARKER).write_text(json.dumps({"tool": tool, "made": made}) + "\n",
                                    encoding="utf-8")
    return directory


def refusal(directory, argument):
    """The :class:`NotOwnedError` for a folder ``argument`` names that holds files it did not
    create, naming the folder, some of its entries and what is allowed."""
    entries = sorted(p.name for p in Path(directory).iterdir())
    shown = ", ".join(entries[:5]) + (f" (+{len(entries) - 5} more)" if len(entries) > 5 else "")
    return NotOwnedError(
        f"{argument} {directory}: a folder this tool did not create holds files ({shown}); "
        f"it would not be removed, nor written into. Give a new or empty folder, or one this "
        f"tool created (it holds {MARKER})")


def check_claimable(directory, argument):
    """Raise :func:`refusal`'s error unless ``directory`` is absent, empty, or marked: the
    check :func:`claim` makes, for callers that must refuse before anything is written."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotOwnedError(f"{argument} {directory}: is a file, expected a folder")
    if directory.is_dir() and not is_marked(directory) and any(directory.iterdir()):
        raise refusal(directory, argument)


def claim(directory, tool, argument):
    """Make ``directory`` this tool's (create and mark it, or mark it if it is empty; a marked
    folder is kept as it is) or raise :class:`NotOwnedError` naming ``argument``. Returns
    ``directory`` as a :class:`Path`."""
    directory = Path(directory)
    check_claimable(directory, argument)
    if is_marked(directory):
        return directory
    made = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    return mark(directory, tool, made=made)


def remove(directory, own=()):
    """Remove the marked folder ``directory``: whole if the tool made it, else only the marker
    and the entries named in ``own`` (the tool's files in a folder it adopted). An absent folder
    is left absent; an unmarked one raises :class:`NotOwnedError` and nothing is removed."""
    directory = Path(directory)
    if not directory.exists():
        return
    marker = directory / MARKER
    if not marker.is_file():
        raise NotOwnedError(f"{directory}: not removed, it holds no {MARKER} (this project did "
                            "not create it)")
    try:
        made = json.loads(marker.read_text(encoding="utf-8")).get("made", False)
    except (ValueError, AttributeError):
        made = False  # an unreadable marker proves nothing beyond itself
    if made:
        shutil.rmtree(directory)
        return
    for name in own:
        (directory / name).unlink(missing_ok=True)
    marker.unlink()


__all__ = ["MARKER", "NotOwnedError", "check_claimable", "claim", "is_marked", "mark",
           "refusal", "remove"]
