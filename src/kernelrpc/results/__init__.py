"""Measurements kept: the results database the model command writes (``--db``), and
``python -m kernelrpc.results`` to list, compare and watch them for regressions.

:mod:`.store` is standard library only (the tracker's status page reads the database with it).
"""
from .store import ResultsError, default_path, open_db

__all__ = ["ResultsError", "default_path", "open_db"]
