"""The vector math on the emulated boards: exp, log, tanh, erf, sigmoid and pow(x, 3) built for
aarch64, armv7 (NEON, and VFP only) and riscv64, run there under qemu-user by
``tests/cross_driver.py``, within the host's error bounds of numpy's float64.

armv7's NEON flushes subnormals to zero (ARMv7's Advanced SIMD is not IEEE there), so on the
NEON board inputs below 2^-120 (whose intermediates are subnormal: erf's x + 0.128 x is x)
and subnormal results are left out; the VFP-only board keeps them.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import kernelrpc
from kernelrpc import te
from kernelrpc.deploy import toolchain

import cross_rootfs
from test_cross_build import TARGETS
from test_vector_math import BOUNDS, FUNCTIONS, REFERENCES, SIGMOID_ZERO, SPECIAL, check

pytestmark = [pytest.mark.cross,
              pytest.mark.skipif(not toolchain.zig_installed(),
                                 reason="needs the cross extra: pip install '.[cross]'")]

KERNELS = {**FUNCTIONS, "cube": lambda v: te.power(v, 3.0)}
LANES = 4
_TINY = np.finfo(np.float32).tiny
_NEON_SMALLEST = 2.0 ** -120


def _samples(flush_subnormals: bool) -> np.ndarray:
    patterns = np.arange(0, 1 << 32, 1048573, dtype=np.uint64).astype(np.uint32).view(np.float32)
    dense = np.linspace(-110, 110, 20_001, dtype=np.float32)
    subnormal = np.arange(1, 1 << 23, 65521, dtype=np.uint32).view(np.float32)
    x = np.concatenate([patterns, dense, subnormal, -subnormal, SPECIAL])
    return x[(np.abs(x) >= _NEON_SMALLEST) | (x == 0) | np.isnan(x)] if flush_subnormals else x


def _build(name, fn, target, n):
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: fn(A[i]), name="B")
    s = te.create_schedule(B.op)
    _, inner = s[B].split(B.op.axis[0], factor=LANES)
    s[B].vectorize(inner)
    return kernelrpc.build(s, [A, B], target=target, name=name)


@pytest.mark.parametrize("board", sorted(TARGETS))
def test_vector_math_on_the_board_is_within_the_bounds(board, tmp_path):
    arch, target, cpu = TARGETS[board]
    try:
        cross_rootfs.rootfs(arch)
    except cross_rootfs.Unavailable as exc:
        pytest.skip(str(exc))
    neon = board == "armv7-neon"
    x = _samples(flush_subnormals=neon)
    x.tofile(tmp_path / "x.bin")
    jobs = []
    for name, fn in KERNELS.items():
        path = _build(name, fn, target, x.size).export_library(tmp_path / f"{name}.so")
        args = [{"dtype": "float32", "shape": [x.size], "input": str(tmp_path / "x.bin"),
                 "output": None},
                {"dtype": "float32", "shape": [x.size], "input": None,
                 "output": str(tmp_path / f"{name}.out")}]
        jobs.append({"module": str(path), "function": name, "args": args})
    proc = cross_rootfs.run_in_rootfs(arch, [str(cross_rootfs.SRC.parent / "tests" /
                                                 "cross_driver.py")],
                                      stdin=json.dumps({"kernels": jobs}), timeout=600, cpu=cpu)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.errstate(all="ignore"):
        wide = x.astype(np.float64)
        refs = {name: ref(wide) for name, ref in REFERENCES.items()}
        refs["cube"] = wide ** 3
    refs["sigmoid"] = np.where(x < SIGMOID_ZERO, 0.0, refs["sigmoid"])
    for name in KERNELS:
        got = np.fromfile(tmp_path / f"{name}.out", dtype=np.float32)
        keep = np.ones(x.size, bool)
        if neon:        # results the hardware flushes to zero
            with np.errstate(over="ignore"):
                keep = ~((np.abs(refs[name]) < _TINY) & (refs[name] != 0))
        check(f"{name} [{board}]", x[keep], got[keep], refs[name][keep],
              BOUNDS.get(name, 0.501))
