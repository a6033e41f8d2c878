"""Writing experiment artifacts so that a reader never sees a half-written file.

:func:`write_json_atomic` serialises into a temporary file in the destination's directory and
renames it over the destination with :func:`os.replace`, which is atomic on POSIX and Windows
when both paths are on one file system (hence the same directory). If serialising or writing
fails, the temporary file is removed and the destination is left as it was (absent, or its
previous content).
"""
import json
import os
import tempfile
from pathlib import Path


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path, obj, *, indent=2, allow_nan=False, sort_keys=False):
    """Write ``obj`` as JSON to ``path`` atomically; return ``path`` as a :class:`Path`.

    Parent directories are created. ``allow_nan=False`` (the default) keeps the file strict
    JSON: a NaN or infinite float raises ``ValueError`` (store ``None`` instead), and nothing is
    written. The file gets the usual permissions (``0o666`` less the umask), not the private
    ones of a temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, allow_nan=allow_nan, sort_keys=sort_keys)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


__all__ = ["write_json_atomic"]
