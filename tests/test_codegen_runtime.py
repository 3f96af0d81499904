"""The per-module native runtime (timer, cache flush, thread pool, metadata), tested through a
real shared library: the C runtime + a hand-written LLVM IR kernel compiled with llvmlite,
linked with the system cc, loaded with ctypes."""
from __future__ import annotations

import ctypes
import json
import os
import threading

import numpy as np
import pytest

from conftest import wait_until
from kernelrpc.deploy.toolchain import ToolchainError, create_shared, find_host_cc
from kernelrpc.compiler.build import link_module
from kernelrpc.compiler.codegen import compile_ir, metadata_ir
from kernelrpc.compiler.target import Target

# add_one(args): args[0] = float*, args[1] = int64* count; runs on the pool, one chunk per task,
# and returns 7 when the first element is negative (to test error propagation).
KERNEL = r"""
declare i32 @__kernelrpc_parallel_launch(ptr, ptr)
define internal i32 @body(ptr %ctx, i32 %task, i32 %ntasks) {
entry:
  %a = load ptr, ptr %ctx
  %cp = getelementptr ptr, ptr %ctx, i64 1
  %cnt = load i64, ptr %cp
  %n = sext i32 %ntasks to i64
  %t = sext i32 %task to i64
  %nm1 = add i64 %n, -1
  %pad = add i64 %cnt, %nm1
  %chunk = sdiv i64 %pad, %n
  %lo = mul i64 %chunk, %t
  %hi0 = add i64 %lo, %chunk
  %small = icmp slt i64 %hi0, %cnt
  %hi = select i1 %small, i64 %hi0, i64 %cnt
  br label %check
check:
  %i = phi i64 [ %lo, %entry ], [ %inext, %loop ]
  %c = icmp slt i64 %i, %hi
  br i1 %c, label %loop, label %done
loop:
  %q = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %q
  %w = fadd float %v, 1.0
  store float %w, ptr %q
  %inext = add i64 %i, 1
  br label %check
done:
  ret i32 0
}
define i32 @__kernelrpc_fn_add_one(ptr %args) {
  %ctx = alloca [2 x i64]
  %a = load ptr, ptr %args
  %first = load float, ptr %a
  %neg = fcmp olt float %first, 0.0
  br i1 %neg, label %fail, label %run
fail:
  ret i32 7
run:
  store ptr %a, ptr %ctx
  %np = getelementptr ptr, ptr %args, i64 1
  %nslot = load ptr, ptr %np
  %cnt = load i64, ptr %nslot
  %p = getelementptr ptr, ptr %ctx, i64 1
  store i64 %cnt, ptr %p
  %r = call i32 @__kernelrpc_parallel_launch(ptr @body, ptr %ctx)
  ret i32 %r
}
"""

METADATA = {"format": "kernelrpc.module", "version": 1, "producer": "test",
            "entry": "add_one", "note": "quote \" backslash \\ and ünïcode",
            "functions": [{"name": "add_one", "symbol": "__kernelrpc_fn_add_one",
                           "args": [{"name": "A", "kind": "tensor", "dtype": "float32",
                                     "shape": [1000]},
                                    {"name": "n", "kind": "scalar", "dtype": "int64"}]}]}


class Lib:
    def __init__(self, path):
        cdll = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)

        def sym(name, restype, *argtypes):
            function = getattr(cdll, "__kernelrpc_" + name)
            function.restype, function.argtypes = restype, list(argtypes)
            return function

        self.metadata = sym("metadata", ctypes.c_char_p)
        self.time = sym("time", ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.cache_flush = sym("cache_flush", None, ctypes.c_void_p, ctypes.c_int64)
        self.set_num_threads = sym("set_num_threads", ctypes.c_int32, ctypes.c_int32)
        self.fn = sym("fn_add_one", ctypes.c_int32, ctypes.c_void_p)
        self.fn_address = ctypes.cast(self.fn, ctypes.c_void_p).value

    def args(self, array, count=None):
        count = ctypes.c_int64(array.size if count is None else count)
        argv = (ctypes.c_void_p * 2)(array.ctypes.data, ctypes.addressof(count))
        argv._keep = (array, count)
        return argv


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    target = Target()
    obj = compile_ir([KERNEL], target)
    path = tmp_path_factory.mktemp("rt") / "k.so"
    link_module(path, obj.object_code, dict(METADATA, target=target.to_dict()), target)
    return Lib(path)


def test_metadata_is_the_json_document(lib):
    doc = json.loads(lib.metadata().decode("utf-8"))
    assert doc["note"] == METADATA["note"]
    assert doc["target"]["triple"] == Target().triple
    assert doc["functions"][0]["symbol"] == "__kernelrpc_fn_add_one"


def test_parallel_kernel_covers_every_element_once(lib):
    for n in (0, 1, 3, 1000, 100_003):
        a = np.zeros(n + 1, np.float32)
        a[n] = 5.0
        assert lib.fn(lib.args(a, count=n)) == 0
        np.testing.assert_array_equal(a[:n], np.ones(n, np.float32))
        assert a[n] == 5.0


def test_timer_counts_calls_and_reports_errors_negative(lib):
    a = np.zeros(4096, np.float32)
    args = lib.args(a)
    elapsed = lib.time(lib.fn_address, args, 50)
    assert elapsed > 0
    np.testing.assert_array_equal(a, np.full(4096, 50, np.float32))
    assert lib.time(lib.fn_address, args, 0) >= 0
    a[0] = -1.0
    assert lib.time(lib.fn_address, args, 10) == -7
    assert a[1] == 50  # the loop stopped at the first failing call


def test_set_num_threads(lib):
    try:
        assert lib.set_num_threads(1) == 1
        a = np.zeros(10_000, np.float32)
        assert lib.fn(lib.args(a)) == 0 and a.min() == 1
        assert lib.set_num_threads(3) == 3
        assert lib.fn(lib.args(a)) == 0 and a.min() == 2 and a.max() == 2
    finally:
        assert lib.set_num_threads(0) == min(len(os.sched_getaffinity(0)), 64)


def test_cache_flush_keeps_contents(lib):
    a = np.arange(100_000, dtype=np.float32)
    lib.cache_flush(a.ctypes.data + 4, a.nbytes - 8)
    lib.cache_flush(a.ctypes.data, 0)
    np.testing.assert_array_equal(a, np.arange(100_000, dtype=np.float32))


def test_concurrent_launches_from_python_threads(lib):
    """ctypes drops the GIL: two threads launching at once must both complete correctly
    (the second runs on its own thread while the pool is busy)."""
    lib.set_num_threads(2)
    arrays = [np.zeros(50_000, np.float32) for _ in range(4)]
    errors = []

    def work(a):
        for _ in range(200):
            if lib.fn(lib.args(a)) != 0:
                errors.append("rc")

    threads = [threading.Thread(target=work, args=(a,)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a in arrays:
        np.testing.assert_array_equal(a, np.full(a.size, 200, np.float32))


def native_thread_states():
    """State letter (R running, S sleeping, ...) of each thread of this process that Python did not start."""
    python = {t.native_id for t in threading.enumerate()}
    states = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                states[int(tid)] = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            pass                                    # the thread ended meanwhile
    return {tid: state for tid, state in states.items() if tid not in python}


def test_idle_pool_sleeps(lib):
    """After a launch, the workers spin briefly and then sleep on a condition variable: an idle
    pool burns no CPU (bench/runtime.py --parallel-launch measures the CPU it uses)."""
    lib.set_num_threads(2)
    a = np.zeros(1000, np.float32)
    assert lib.fn(lib.args(a)) == 0
    assert native_thread_states(), "the launch started no pool worker"
    wait_until(lambda: all(state == "S" for state in native_thread_states().values()), timeout=10,
               what="every pool worker asleep")


def test_many_back_to_back_launches(lib):
    """The timing loop launches the pool thousands of times in a row (no lost wake-ups)."""
    a = np.zeros(64, np.float32)
    assert lib.time(lib.fn_address, lib.args(a), 5000) > 0
    np.testing.assert_array_equal(a, np.full(64, 5000, np.float32))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_in_a_forked_child(lib):
    a = np.zeros(1000, np.float32)
    lib.fn(lib.args(a))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            b = np.zeros(100_000, np.float32)
            if lib.fn(lib.args(b)) == 0 and b.min() == 1 and b.max() == 1:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_toolchain_reports_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "definitely-not-a-compiler-kernelrpc")
    with pytest.raises(ToolchainError, match="not on PATH"):
        find_host_cc()
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match="no C compiler found"):
        find_host_cc()


def test_toolchain_reports_link_errors(tmp_path):
    bad = tmp_path / "bad.o"
    bad.write_bytes(b"not an object file")
    with pytest.raises(ToolchainError, match="linking out.so failed"):
        create_shared(tmp_path / "out.so", [bad])


def test_metadata_ir_for_other_architectures_compiles():
    for text, arch in (("llvm -mtriple=aarch64-unknown-linux-gnu", "aarch64"),
                       ("llvm -mtriple=riscv64-unknown-linux-gnu -mattr=+m,+a,+f,+d,+c",
                        "riscv64")):
        target = Target(text)
        obj = compile_ir([metadata_ir("{}"), KERNEL], target)
        assert obj.object_code[:4] == b"\x7fELF", arch
        assert "__kernelrpc_metadata" in obj.assembly()
