"""Writing experiment artifacts so that a reader never sees a half-written file.

:func:`write_json_atomic` serialises into a temporary file in the destination's directory and
renames it over the destination with :func:`os.replace`, which is atomic on POSIX and Windows
when both paths are on one file system (hence the same directory). If serialising or writing
fails, the temporary file is removed and the destination is left as it was (absent, or its
previous content). :func:`atomic_path` does the same for any writer that takes a path (CSV
tables, figures, reports).
"""
import contextlib
import json
import os
import tempfile
from pathlib import Path


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; rename it over ``path`` when the block succeeds.

    Parent directories are created. If the block raises, the temporary file is removed and
    ``path`` is left as it was. The file gets the usual permissions (``0o666`` less the umask),
    not the private ones of a temporary file. The temporary name ends in ``.tmp``, so writers
    that infer a format from the suffix need it given explicitly.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path, obj, *, indent=2, allow_nan=False, sort_keys=False):
    """Write ``obj`` as JSON to ``path`` atomically; return ``path`` as a :class:`Path`.

    Parent directories are created. ``allow_nan=False`` (the default) keeps the file strict
    JSON: a NaN or infinite float raises ``ValueError`` (store ``None`` instead), and nothing is
    written.
    """
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, allow_nan=allow_nan, sort_keys=sort_keys)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


__all__ = ["atomic_path", "write_json_atomic"]
