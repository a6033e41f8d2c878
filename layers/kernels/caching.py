"""numba's on-disk kernel cache, keyed on every source file a kernel compiles.

numba caches a compiled function (``cache=True``) under a stamp of the one file that defines it
(numba's ``get_source_stamp``: a hash of its contents, or its modification time and size) plus
the function's own bytecode. The kernels of ``cpu.py`` and ``cuda.py`` also compile the
activation maths of ``common.py`` (inlined), so an edit of ``common.py`` alone would leave
stale machine code in the cache, silently used by the next process.

:func:`jit` and :func:`with_dependencies` give a dispatcher a cache whose stamp is numba's own
stamp of the defining file together with a SHA-256 digest of the contents of the listed
dependencies: when one of them changes, the stored index no longer matches and numba compiles
again (and overwrites the stale entries), with no manual step. Everything else is numba's:
where the cache lives (the ``__pycache__`` next to the source, the user-wide cache directory if
that is not writable, ``NUMBA_CACHE_DIR``), its file names and its index key (signature, target,
bytecode). It works the same for ``numba.njit`` (CPU) and ``numba.cuda.jit`` dispatchers;
dispatchers without a disk cache (``cache=False``, the CUDA simulator) are left alone.
"""
import functools
import hashlib
import os


@functools.lru_cache(maxsize=None)
def _file_digest(path, mtime_ns, size):
    # mtime and size are part of the key so that a file edited in this process is hashed again
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def dependency_digest(paths):
    """SHA-256 digest of the contents of the files ``paths`` (in order, with their names)."""
    digest = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        digest.update(os.path.basename(path).encode())
        digest.update(_file_digest(os.path.abspath(path), stat.st_mtime_ns,
                                   stat.st_size).encode())
    return digest.hexdigest()


class DependencyLocator:
    """A numba cache locator: ``locator`` (numba's choice) with a source stamp that also covers
    the contents of ``dependencies``.

    Index files written with it store ``(numba's stamp, dependency digest)``; numba discards an
    index whose stamp differs from the current one, so a changed dependency recompiles.
    """

    def __init__(self, locator, dependencies):
        self._locator = locator
        self.dependencies = tuple(os.path.abspath(path) for path in dependencies)

    def get_source_stamp(self):
        return self._locator.get_source_stamp(), dependency_digest(self.dependencies)

    def __getattr__(self, name):  # the directory, disambiguator, ... are numba's locator's
        if name == "_locator":
            raise AttributeError(name)
        return getattr(self._locator, name)


@functools.lru_cache(maxsize=None)
def _cache_class(cache_class, dependencies):
    """A subclass of numba's cache class ``cache_class`` whose locator is a DependencyLocator."""

    class Impl(cache_class._impl_class):
        def __init__(self, py_func):
            super().__init__(py_func)
            self._locator = DependencyLocator(self._locator, dependencies)

    Impl.__name__ = Impl.__qualname__ = f"Dependency{cache_class._impl_class.__name__}"
    name = f"Dependency{cache_class.__name__}"
    return type(name, (cache_class,), {"_impl_class": Impl, "__module__": __name__,
                                       "__qualname__": name})


def with_dependencies(dispatcher, dependencies):
    """Re-key ``dispatcher``'s disk cache on ``dependencies`` too; returns ``dispatcher``.

    ``dispatcher`` is a ``numba.njit(cache=True)`` or ``numba.cuda.jit(cache=True)`` function
    that has not compiled yet; one without a disk cache is returned unchanged.
    """
    cache = getattr(dispatcher, "_cache", None)
    if cache is None or not hasattr(type(cache), "_impl_class"):  # NullCache, simulator
        return dispatcher
    if isinstance(cache._impl.locator, DependencyLocator):
        cache_class = type(cache).__mro__[1]
    else:
        cache_class = type(cache)
    paths = tuple(os.path.abspath(path) for path in dependencies)
    dispatcher._cache = _cache_class(cache_class, paths)(dispatcher.py_func)
    return dispatcher


def jit(decorator, dependencies, **options):
    """``decorator(cache=True, **options)`` (e.g. ``numba.njit``) with its disk cache keyed
    on ``dependencies`` too (:func:`with_dependencies`)."""

    def wrap(function):
        return with_dependencies(decorator(cache=True, **options)(function), dependencies)

    return wrap


def dependencies_of(dispatcher):
    """The dependency files ``dispatcher``'s cache is keyed on (``()`` if none)."""
    cache = getattr(dispatcher, "_cache", None)
    locator = getattr(getattr(cache, "_impl", None), "locator", None)
    return locator.dependencies if isinstance(locator, DependencyLocator) else ()


__all__ = ["jit", "with_dependencies", "dependencies_of", "dependency_digest",
           "DependencyLocator"]
