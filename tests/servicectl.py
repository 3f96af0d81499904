"""The tests start services through :mod:`kernelrpc.launch`, as the demo does."""
from kernelrpc.launch import READY, SRC, Service, child_env

__all__ = ["READY", "SRC", "Service", "child_env"]
