"""Toolchains that link compiled kernels into loadable shared libraries."""
from .toolchain import ToolchainError, create_shared, find_host_cc

__all__ = ["ToolchainError", "create_shared", "find_host_cc"]
