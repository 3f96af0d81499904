"""The device server (``python -m kernelrpc.server``); imports only the standard library."""
from __future__ import annotations

from .config import ServerConfig
from .registry import register

__all__ = ["ServerConfig", "register"]
