"""The one error every data set raises for data that is not where, or not what, it should be.

A training run on a data set that is laid out wrongly (a missing folder, an empty class folder,
an unreadable image, a label outside the class list, a truncated pickle) must stop at once with
a message that names the offending path and the layout that was expected there, so the user can
fix the data rather than read a traceback. :class:`DatasetLayoutError` is a ``ValueError`` (the
data is a bad value of the ``root`` argument) and keeps the path and the expected layout as
attributes for programs that want them.
"""
from pathlib import Path


class DatasetLayoutError(ValueError):
    """A data set on disk is missing or does not have the expected layout.

    ``DatasetLayoutError(message)`` alone is valid too (the DataLoader re-raises a worker's
    exception in the main process by calling its class with one message string); use
    :meth:`at` to build one with the standard message.
    """

    def __init__(self, message, path=None, expected=None):
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.expected = expected

    @classmethod
    def at(cls, path, problem, expected):
        """The error ``<path>: <problem>. Expected layout: <expected>``, keeping both."""
        return cls(f"{path}: {problem}. Expected layout: {expected}", path, expected)


__all__ = ["DatasetLayoutError"]
