"""Emulated boards for tests: a device server under qemu-user, started as users start it."""
import shutil

import pytest

from kernelrpc.deploy import rootfs
from servicectl import Service

BOARD_START_TIMEOUT = 180.0      # a cold cache downloads and unpacks the root first


def need_qemu(arch: str) -> None:
    if shutil.which(rootfs.arch_named(arch).qemu) is None:
        pytest.skip(f"{rootfs.arch_named(arch).qemu} is missing: {rootfs.QEMU_PACKAGE_HINT}")


def start_board(arch: str, tracker_port: int, key: str, *extra: str) -> Service:
    """``python -m kernelrpc.deploy emulate --arch ARCH ...``, registered with the tracker."""
    need_qemu(arch)
    rootfs.prepare(arch)     # outside the start timeout; errors surface here, typed
    board = Service("kernelrpc.deploy", ["emulate", "--arch", arch, "--tracker", f"127.0.0.1:{tracker_port}",
                                         "--key", key, "--port", "0", *extra], timeout=BOARD_START_TIMEOUT)
    board.wait_for_line(rf"registered key {key} ", timeout=60)
    return board
