"""BuiltModule: export_library follows docs/module-format.md, loads with the stdlib-only runtime
in a fresh process, runs locally through the same runtime, and records the target identity."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.te import Target
from kernelrpc.compiler.codegen import CodegenError
from kernelrpc.compiler.target import TargetError


@pytest.fixture(scope="module")
def scaled_add():
    n = 100
    A = te.placeholder((n,), name="A")
    alpha = te.var("alpha", "float32")
    B = te.compute((n,), lambda i: A[i] * alpha + 1.0, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=16)
    s[B].vectorize(xi)
    return kernelrpc.build(s, [A, alpha, B], target="llvm", name="scaled_add")


def test_metadata_describes_functions_and_target(scaled_add):
    meta = scaled_add.metadata
    assert meta["format"] == "kernelrpc.module" and meta["version"] == 1
    assert meta["entry"] == "scaled_add"
    (fn,) = meta["functions"]
    assert fn["symbol"] == "__kernelrpc_fn_scaled_add"
    assert fn["args"] == [
        {"name": "A", "kind": "tensor", "dtype": "float32", "shape": [100]},
        {"name": "alpha", "kind": "scalar", "dtype": "float32"},
        {"name": "B", "kind": "tensor", "dtype": "float32", "shape": [100]}]
    host = Target()
    assert meta["target"] == host.to_dict()
    assert meta["target"]["cpu"] == host.cpu and meta["target"]["features"]


def test_local_call_and_time_evaluator_go_through_the_runtime(scaled_add):
    dev = kernelrpc.cpu(0)
    a = np.arange(100, dtype="float32")
    ta, tb = nd.array(a, dev), nd.empty((100,), "float32", dev)
    scaled_add(ta, 2.5, tb)
    np.testing.assert_allclose(tb.numpy(), a * 2.5 + 1.0, rtol=1e-6)
    scaled_add["scaled_add"](ta, 0.0, tb)
    np.testing.assert_array_equal(tb.numpy(), np.ones(100, "float32"))
    assert scaled_add.entry_name == "scaled_add"
    result = scaled_add.time_evaluator("scaled_add", dev, number=5, repeat=3)(ta, 1.0, tb)
    assert len(result.results) == 3 and result.mean > 0
    assert result.target["triple"] == Target().triple
    with pytest.raises(TypeError):
        scaled_add(ta, tb)


def test_exported_library_loads_in_a_fresh_process(scaled_add, tmp_path):
    path = scaled_add.export_library(tmp_path / "scaled_add.so")
    script = (
        "import json, struct, sys\n"
        "from kernelrpc import runtime\n"
        "mod = runtime.load_module(sys.argv[1])\n"
        "dev = runtime.cpu(0)\n"
        "a, b = runtime.empty((100,), 'float32', dev), runtime.empty((100,), 'float32', dev)\n"
        "a.copyfrom(struct.pack('100f', *range(100)))\n"
        "mod['scaled_add'](a, 3.0, b)\n"
        "print(json.dumps({'b': struct.unpack('100f', bytes(b.buffer)), "
        "'entry': mod.entry_name, 'cpu': mod.metadata['target']['cpu'], "
        "'numpy': 'numpy' in sys.modules}))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         text=True, env=env, timeout=60, check=True)
    doc = json.loads(out.stdout)
    assert doc["entry"] == "scaled_add" and doc["cpu"] == Target().cpu
    assert doc["b"] == [3.0 * i + 1.0 for i in range(100)]
    assert not doc["numpy"]  # the device side needs nothing but the standard library
    deps = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    for line in deps.splitlines():
        name = line.split()[0]
        assert any(ok in name for ok in ("linux-vdso", "libc.so", "libm.so", "libpthread",
                                          "ld-linux")), line


def test_sources_and_object(scaled_add, tmp_path):
    assert "define i32 @__kernelrpc_fn_scaled_add" in scaled_add.get_source("ll")
    assert "__kernelrpc_fn_scaled_add:" in scaled_add.get_source("asm")
    assert "scaled_add" in scaled_add.get_source("lowered")
    assert scaled_add.save_object(tmp_path / "x.o").read_bytes()[:4] == b"\x7fELF"
    with pytest.raises(ValueError, match="unknown source format"):
        scaled_add.get_source("ptx")


def test_several_functions_in_one_module(tmp_path):
    n = 8
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((n,), lambda i: A[i] * 2.0, name="C")
    f1 = te.lower(te.create_schedule(B.op), [A, B], name="inc")
    f2 = te.lower(te.create_schedule(C.op), [A, C], name="dbl")
    module = kernelrpc.build([f1, f2])
    assert [f["name"] for f in module.metadata["functions"]] == ["inc", "dbl"]
    dev = kernelrpc.cpu(0)
    ta, out = nd.array(np.arange(n, dtype="float32"), dev), nd.empty((n,), "float32", dev)
    module["dbl"](ta, out)
    np.testing.assert_array_equal(out.numpy(), np.arange(n) * 2.0)
    module(ta, out)  # the entry is the first function
    np.testing.assert_array_equal(out.numpy(), np.arange(n) + 1.0)
    with pytest.raises(CodegenError, match="unique"):
        kernelrpc.build([f1, f1])


def test_cross_target_builds_and_links_with_fcompile(tmp_path):
    n = 16
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(B.op.axis[0])
    module = kernelrpc.build(s, [A, B], target="llvm -mtriple=aarch64-linux-gnu", name="dbl")
    assert module.metadata["target"]["triple"] == "aarch64-linux-gnu"
    assert "fmul" in module.get_source("asm") or "fadd" in module.get_source("asm")
    with pytest.raises(RuntimeError, match="cannot run code for aarch64"):
        module(None)
    linked = []
    module.export_library(tmp_path / "dbl.so", fcompile=lambda out, objs: linked.append(objs))
    assert linked and linked[0][0].endswith(".o")


@pytest.mark.parametrize("text,message", [
    ("cuda", "must start with 'llvm'"),
    ("llvm -mcpu", "unknown target option"),
    ("llvm -foo=bar", "unknown target option"),
    ("llvm -mattr=avx2", r"use \+feature"),
    ("llvm -mtriple=nonsense-arch-os", "does not know the triple"),
    ("llvm -cores=4", "unknown target option"),
])
def test_bad_targets(text, message):
    with pytest.raises(TargetError, match=message):
        Target(text)


def test_target_parsing():
    host = Target()
    assert host.is_host and host.cpu and host.features.startswith("+")
    explicit = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -mattr=+avx2,+fma")
    assert (explicit.triple, explicit.cpu, explicit.features) == (
        "x86_64-linux-gnu", "haswell", "+avx2,+fma")
    assert str(explicit) == "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -mattr=+avx2,+fma"
    assert Target(str(explicit)) == explicit and Target(explicit) == explicit
    cross = Target("llvm -mtriple=aarch64-linux-gnu")
    assert cross.cpu == "generic" and not cross.is_host and cross.features == ""
