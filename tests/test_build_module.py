"""BuiltModule: export_library follows docs/module-format.md, loads with the stdlib-only runtime
in a fresh process, runs locally through the same runtime, and records the target identity."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te, tir
from kernelrpc.te import Target
from kernelrpc.compiler.codegen import CodegenError
from kernelrpc.compiler.libc_floor import glibc_floor
from kernelrpc.runtime import compat
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


def _needed_glibc_versions(path) -> list:
    """The GLIBC_x.y versions the file needs, as binutils' readelf lists them."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("needs readelf (binutils) to check the file independently")
    out = subprocess.run([readelf, "-V", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return sorted({tuple(int(p) for p in v.split(".")) for v in
                   re.findall(r"Name: GLIBC_(\d+(?:\.\d+)+)", out)})


def test_a_host_module_records_the_glibc_it_really_needs(scaled_add, tmp_path, monkeypatch):
    """The host cc links against the host's glibc: the record is the newest symbol version
    the file needs, and a device with an older glibc refuses the file before dlopen."""
    path = scaled_add.export_library(tmp_path / "m.so")
    needed = _needed_glibc_versions(path)
    floor = ".".join(map(str, needed[-1]))
    record = scaled_add.metadata["target"]
    assert record["libc"] == f"glibc>={floor}"
    assert glibc_floor(path) == floor
    with open(path, "rb") as f:     # what the file itself says, as the device reads it
        info = compat.read_elf(f, with_sections=True)
        assert compat._target_record(compat._section_bytes(f, info, b"kernelrpc_metadata"))[
            "libc"] == f"glibc>={floor}"
    older = ".".join(map(str, (*needed[-1][:-1], needed[-1][-1] - 1)))
    monkeypatch.setattr(compat, "glibc_version", lambda: older)
    with pytest.raises(compat.LibcTooOldError, match=rf"needs glibc>={floor}; this device has "
                                                      rf"glibc {older}"):
        kernelrpc.runtime.load_module(str(path))


def test_the_floor_follows_what_the_module_calls(tmp_path):
    """A C source that calls arc4random (glibc 2.36) raises the floor of that module only."""
    have = compat.glibc_version()
    if have is None or tuple(map(int, have.split("."))) < (2, 36):
        pytest.skip("needs a host glibc >= 2.36 (arc4random)")
    source = tmp_path / "rand.c"
    source.write_text("#include <stdlib.h>\n#include <stdint.h>\n"
                      "int32_t coin(void) { return (int32_t)(arc4random() & 1u); }\n")
    X = te.placeholder((4,), name="X", dtype="int32")
    Y = te.compute((4,), lambda i: X[i] * 0 + tir.call_extern("int32", "coin"), name="Y")
    module = kernelrpc.build(te.create_schedule(Y.op), [X, Y], name="coin", sources=[source])
    path = module.export_library(tmp_path / "coin.so")
    assert module.metadata["target"]["libc"] == "glibc>=2.36" == f"glibc>={glibc_floor(path)}"
    y = nd.empty((4,), "int32")
    module(nd.array(np.zeros(4, "int32")), y)
    assert set(y.numpy()) <= {0, 1}
    plain = te.compute((4,), lambda i: X[i] + 1, name="P")
    other = kernelrpc.build(te.create_schedule(plain.op), [X, plain], name="plain")
    other.export_library(tmp_path / "plain.so")
    assert other.metadata["target"]["libc"] == f"glibc>={glibc_floor(tmp_path / 'plain.so')}"
    assert other.metadata["target"]["libc"] != "glibc>=2.36"
