"""Cross-built modules run on emulated boards: aarch64, armv7 (with and without NEON), riscv64.

Each kernel is built on this host for the board's triple, exported with the toolchain
kernelrpc picks (zig cc here), checked on the file (ELF header, recorded target), then
loaded and run by ``kernelrpc.runtime`` in the board's own Python under qemu-user
(``tests/cross_driver.py``), and its outputs are compared with numpy on the host.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import kernelrpc
from kernelrpc import te
from kernelrpc.compiler import recipes
from kernelrpc.deploy import toolchain
from kernelrpc.runtime import compat

import cross_rootfs

pytestmark = [pytest.mark.cross,
              pytest.mark.skipif(not toolchain.zig_installed(),
                                 reason="needs the cross extra: pip install '.[cross]'")]

#: name -> (board, target, emulated CPU or None for the board's default)
TARGETS = {
    "aarch64": ("aarch64", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", None),
    "armv7-neon": ("armv7", "llvm -mtriple=armv7-linux-gnueabihf -mattr=+neon", None),
    # a CPU with VFPv3-D16 and no NEON, like Raspberry Pi OS's baseline: NEON code traps
    "armv7-vfp3d16": ("armv7", "llvm -mtriple=armv7-linux-gnueabihf -mattr=+vfp3d16,-neon",
                      "cortex-r5f"),
    "riscv64": ("riscv64", "llvm -mtriple=riscv64-linux-gnu", None),
}
#: (e_machine, ELF class bits, e_flags that must be set)
ELF = {"aarch64": (183, 64, 0), "armv7": (40, 32, 0x5000400), "riscv64": (243, 64, 0x5)}
GEMM = (64, 48, 40)     # M, N, K: not multiples of the tutorial's 32x32 blocks


def _kernels():
    """(name, schedule, args, numpy reference from the inputs) of each kernel."""
    rng = np.random.default_rng(7)
    out = []
    n = 1000
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + te.exp(A[i] * 0.5), name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=8)
    s[C].parallel(xo)
    s[C].vectorize(xi)
    a, b = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    out.append(("fma_exp", s, [A, B, C], [a, b, None],
                lambda a, b: a * b + np.exp(a * np.float32(0.5)), 1e-5))

    m = 257
    X = te.placeholder((m,), name="X", dtype="int64")
    Y = te.compute((m,), lambda i: X[i] // 7 + X[i] % 5 * (X[i] // 1000003), name="Y")
    s = te.create_schedule(Y.op)
    x = rng.integers(-(1 << 40), 1 << 40, m, dtype=np.int64)

    def div_ref(x):
        q = np.floor_divide(x, 7)
        return q + np.mod(x, 5) * np.floor_divide(x, 1000003)
    out.append(("int64_divmod", s, [X, Y], [x, None], div_ref, 0))

    big = 40_000        # > 64 KiB intermediate: a heap allocation (the pool, size_t)
    P = te.placeholder((big,), name="P")
    Q = te.compute((big,), lambda i: P[i] * 2.0, name="Q")
    R = te.compute((big,), lambda i: Q[i] + Q[big - 1 - i], name="R")
    s = te.create_schedule(R.op)
    s[R].parallel(R.op.axis[0])
    p = rng.standard_normal(big, np.float32)
    out.append(("heap_stage", s, [P, R], [p, None], lambda p: p * 2 + (p * 2)[::-1], 1e-6))

    M, N, K = GEMM
    s, args = recipes.tutorial_schedule("parallel", M, N, K)
    ga = rng.standard_normal((M, K), np.float32)
    gb = rng.standard_normal((K, N), np.float32)
    out.append(("gemm", s, args, [ga, gb, None], lambda a, b: a @ b, 1e-4))
    return out


@pytest.fixture(scope="module", params=sorted(TARGETS))
def board(request, tmp_path_factory):
    """Build and export every kernel for one target, run them all on its emulated board."""
    arch, target, cpu = TARGETS[request.param]
    try:
        cross_rootfs.rootfs(arch)
    except cross_rootfs.Unavailable as exc:
        pytest.skip(str(exc))
    work = tmp_path_factory.mktemp(request.param)
    jobs, built = [], []
    for name, s, args, inputs, reference, tol in _kernels():
        module = kernelrpc.build(s, args, target=target, name=name)
        path = module.export_library(work / f"{name}.so")
        specs = []
        declared = module.metadata["functions"][0]["args"]
        for k, (arg, value) in enumerate(zip(declared, inputs)):
            spec = {"dtype": arg["dtype"], "shape": arg["shape"], "input": None, "output": None}
            if value is not None:
                spec["input"] = str(work / f"{name}.in{k}")
                value.tofile(spec["input"])
            else:
                spec["output"] = str(work / f"{name}.out{k}")
            specs.append(spec)
        jobs.append({"module": str(path), "function": name, "args": specs})
        built.append((name, module, path, inputs, reference, tol, specs))
    proc = cross_rootfs.run_in_rootfs(arch, [str(cross_rootfs.SRC.parent / "tests" /
                                                 "cross_driver.py")],
                                      stdin=json.dumps({"kernels": jobs}), timeout=600,
                                      cpu=cpu)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, arch, target, built, json.loads(proc.stdout), cpu


def test_exported_file_is_an_elf_for_the_board(board):
    name, arch, target, built, _, cpu = board
    machine, bits, flags = ELF[arch]
    for kernel, module, path, *_ in built:
        with open(path, "rb") as f:
            info = compat.read_elf(f, with_sections=True)
            record = compat._target_record(compat._section_bytes(f, info, b"kernelrpc_metadata"))
        assert (info.machine, info.bits, info.little_endian, info.elf_type) == (
            machine, bits, True, 3), kernel
        assert info.flags & flags == flags, hex(info.flags)
        assert record["triple"] == module.target.triple and record["toolchain"] == "zig cc"
        assert record["libc"] == ("glibc>=2.27" if arch == "riscv64" else "glibc>=2.17")
        assert record["pointer_bits"] == bits
    if arch == "riscv64":
        assert record["abi"] == "lp64d" and record["features"] == "+m,+a,+f,+d,+c"


def test_kernels_compute_on_the_board_what_numpy_does(board):
    name, arch, _, built, report, _ = board
    assert report["machine"] == {"armv7": "armv7l"}.get(arch, arch)
    for (kernel, module, path, inputs, reference, tol, specs), result in zip(built,
                                                                             report["results"]):
        expected = reference(*[v for v in inputs if v is not None])
        spec = specs[-1]
        got = np.fromfile(spec["output"], dtype=spec["dtype"]).reshape(spec["shape"])
        if tol:
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=kernel)
        else:
            np.testing.assert_array_equal(got, expected, err_msg=kernel)
        assert result["same_serial"], f"{kernel}: pool and serial results differ"
        assert result["seconds"] > 0 and result["flushed_seconds"] > 0
        assert result["target"]["triple"] == module.target.triple
        assert result["native_cache_flush"] == (arch == "aarch64")   # dc civac; else scratch
        assert result["repeats_in_one_call"]      # the module runtime's __kernelrpc_time_repeats
        assert result["threads"] >= 1


def test_gemm_uses_the_pool_and_heap_paths(board):
    _, _, _, built, _, _ = board
    sources = {kernel: module.get_source() for kernel, module, *_ in built}
    assert "@__kernelrpc_parallel_launch" in sources["gemm"]
    assert "@__kernelrpc_workspace_alloc" in sources["heap_stage"]


def test_a_module_for_another_board_is_refused_before_dlopen(board, tmp_path):
    """On the emulated board: a module built for another architecture, and one needing
    CPU features the board lacks, are refused with typed errors naming both sides."""
    name, arch, target, built, _, cpu = board
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    other = "llvm -mtriple=riscv64-linux-gnu" if arch != "riscv64" else \
        "llvm -mtriple=aarch64-linux-gnu"
    wrong = kernelrpc.build(s, [A, B], target=other, name="inc").export_library(
        tmp_path / "wrong.so")
    paths = [str(wrong)]
    lacking = {"aarch64": "+sve",          # the board is a Cortex-A72: no SVE
               "armv7-vfp3d16": "+neon"}.get(name)   # ... and a Cortex-R5F: no NEON
    if lacking:
        base = target.split(" -mattr=")[0]
        needy = kernelrpc.build(s, [A, B], target=f"{base} -mattr={lacking}", name="inc")
        paths.append(str(needy.export_library(tmp_path / "needy.so")))
    script = ("import sys, json\nfrom kernelrpc import runtime\nout = []\n"
              "for p in sys.argv[1:]:\n"
              "    try:\n        runtime.load_module(p); out.append(['loaded', ''])\n"
              "    except runtime.IncompatibleModuleError as e:\n"
              "        out.append([type(e).__name__, str(e)])\n"
              "print(json.dumps(out))\n")
    proc = cross_rootfs.run_in_rootfs(arch, ["-c", script, *paths], cpu=cpu)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcomes = json.loads(proc.stdout)
    assert outcomes[0][0] == "WrongArchitectureError"
    assert f"built for {other.split('=')[1]}" in outcomes[0][1]
    assert f"this device is {({'armv7': 'armv7l'}).get(arch, arch)}" in outcomes[0][1]
    if lacking:
        assert outcomes[1][0] == "MissingCPUFeaturesError"
        assert f"needs CPU features {lacking} that this device lacks" in outcomes[1][1]
