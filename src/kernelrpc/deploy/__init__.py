"""Getting kernels and services onto devices: the toolchains that link compiled kernels
(``toolchain``), root file systems and emulated boards (``rootfs``, ``emulate``), the device
bundle (``bundle``), and starting services locally as users do (``launch``)."""
from .toolchain import ToolchainError, create_shared, find_host_cc

__all__ = ["ToolchainError", "create_shared", "find_host_cc"]
