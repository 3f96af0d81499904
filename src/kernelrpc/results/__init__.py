"""Measurements kept: the results database the model command writes (``--db``), and
``python -m kernelrpc.results`` to list, compare and watch them for regressions.

:mod:`.store` is standard library only (the tracker's status page reads the database with it);
``plot_boards`` draws the boards side by side in a notebook.
"""
from .store import ResultsError, default_path, open_db

__all__ = ["ResultsError", "default_path", "open_db", "plot_boards"]


def __getattr__(name: str):
    if name == "plot_boards":            # matplotlib's side: not loaded by the tracker's reader
        from .plot import plot_boards
        return plot_boards
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
