"""Whether the running environment is the locked one (``requirements.lock``) or another.

A run is reproducible from its record only if the record says which versions it ran with:
the lock's exact versions (``pip install -c requirements.lock -e '.[dev]'``), or whatever
pyproject.toml's ranges resolved to on that day. :func:`describe_install` compares every pin
of the lock with the installed distribution; ``python -m experiments.records.lock`` prints the
differences and exits non-zero when there are any (CI runs it after installing the lock).
"""
import argparse
import functools
import sys
from importlib import metadata
from pathlib import Path

from .paths import REPO_ROOT

LOCK_FILE = REPO_ROOT / "requirements.lock"


def read_pins(path=LOCK_FILE):
    """The lock's ``name==version`` lines as ``{name: version}``; comments and blanks skipped.

    Raises ``ValueError`` naming the file and line for anything else (a range, a URL), which
    a lock made by ``pip freeze`` never holds."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{number}: expected 'name==version', got {line!r}")
        pins[name.strip()] = version.strip()
    return pins


def differences(pins):
    """``["name: installed X, locked Y", ...]`` for every pin the installed packages miss."""
    found = []
    for name, locked in sorted(pins.items(), key=lambda item: item[0].lower()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "none"
        if installed != locked:
            found.append(f"{name}: installed {installed}, locked {locked}")
    return found


@functools.cache
def describe_install(path=LOCK_FILE):
    """``{"lock_file", "matches_lock", "differs_from_lock"}`` for a run's record.

    ``matches_lock`` is ``True`` when every locked package is installed at its locked version
    (the reproduction install), ``False`` otherwise (the ranges' install: the record then lists
    what differs), ``None`` where no lock file is at hand (the package installed elsewhere)."""
    if not path.is_file():
        return {"lock_file": None, "matches_lock": None, "differs_from_lock": None}
    found = differences(read_pins(path))
    return {"lock_file": path.name, "matches_lock": not found, "differs_from_lock": found}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m experiments.records.lock",
        description="Compare the installed packages with requirements.lock.")
    parser.add_argument("--lock", type=Path,
                        default=LOCK_FILE, help="the lock file (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.lock.is_file():
        parser.error(f"--lock: no such file: {args.lock}")
    found = differences(read_pins(args.lock))
    for line in found:
        print(line)
    print(f"{args.lock.name}: {len(found)} package(s) differ from the lock")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
