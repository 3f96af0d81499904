"""``logging.getLogger(name)`` for modules on a start-up path, with ``logging`` loaded on first use.

Importing ``logging`` (with ``re``, ``traceback``, ``threading``, ``string``, ``weakref``)
costs more than the whole first ``connect_tracker()`` of a process otherwise does, and the
tracker client logs only when something goes wrong or a wait is long. So its logger is a
:class:`LazyLogger`: every attribute is the real logger's (``logging.getLogger(name)``),
looked up when first asked for. Records come from the module's logger with the caller's file
and line (the caller calls the real logger's method), and configuring
``logging.getLogger(name)`` works as usual, before or after the first record.
"""
from __future__ import annotations


class LazyLogger:
    """Stands for ``logging.getLogger(name)``; ``logging`` is imported on the first attribute."""

    __slots__ = ("name", "_logger")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger = None

    def __getattr__(self, attr: str):
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self.name)
        return getattr(self._logger, attr)

    def __repr__(self) -> str:
        return f"<LazyLogger {self.name} ({'loaded' if self._logger is not None else 'logging not loaded yet'})>"

