"""The TVM-named helpers user code reaches through ``import kernelrpc as tvm``: ``tvm.target``,
``tvm.testing``, ``tvm.tir``, ``tvm.contrib.cc`` / ``utils`` and ``Module.save``."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kernelrpc as tvm
from kernelrpc import te


def test_importing_kernelrpc_loads_no_compiler_and_lists_the_new_names():
    script = ("import sys, kernelrpc\n"
              "assert {'target', 'testing', 'tir', 'contrib'} <= set(dir(kernelrpc))\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "{'numpy', 'llvmlite'} or m.startswith('kernelrpc.compiler')))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_target_as_the_tutorial_spells_it():
    tgt = tvm.target.Target(target="llvm", host="llvm")
    assert tgt.kind.name == "llvm" and tgt.kind == "llvm"
    assert tgt.host_string.startswith("llvm -mtriple=")
    generic = tvm.target.Target("llvm -mcpu=generic")
    assert generic.cpu == "generic" and generic.kind.name == "llvm"
    assert tvm.device(tgt.kind.name, 0) == tvm.cpu(0)
    with pytest.raises(tvm.target.TargetError, match="must start with 'llvm'"):
        tvm.target.Target(target="cuda", host="llvm")


def test_assert_allclose_takes_tensors_and_refuses_broadcasting():
    x = tvm.nd.array(np.arange(4, dtype="float32"))
    tvm.testing.assert_allclose(x, np.arange(4, dtype="float32"))
    with pytest.raises(AssertionError, match="shapes differ"):
        tvm.testing.assert_allclose(np.zeros((1, 4)), np.zeros(4))
    with pytest.raises(AssertionError):
        tvm.testing.assert_allclose(x, np.arange(4) + 1e-3)
    tvm.testing.assert_allclose(x.numpy() + 1e-3, x, atol=1e-2)


def test_tir_index_helpers_are_the_floor_operations():
    A = te.placeholder((10,), name="A", dtype="int32")
    C = te.compute((10,), lambda i: A[tvm.tir.indexmod(i + 7, 10)] + tvm.tir.indexdiv(i, 3),
                   name="C")
    f = tvm.build(te.create_schedule(C.op), [A, C])
    a = tvm.nd.array(np.arange(10, dtype="int32") * 5)
    c = tvm.nd.empty((10,), "int32")
    f(a, c)
    i = np.arange(10)
    np.testing.assert_array_equal(c.numpy(), a.numpy()[(i + 7) % 10] + i // 3)


def test_saved_object_links_into_a_loadable_module_with_create_shared():
    from kernelrpc.contrib import cc, utils

    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    f = tvm.build(te.create_schedule(B.op), [A, B], name="double")
    with utils.tempdir() as temp:
        f.save(temp.relpath("double.o"))
        f.save(temp.relpath("double.ll"))
        assert "__kernelrpc_fn_double" in open(temp.relpath("double.ll")).read()
        cc.create_shared(temp.relpath("double.so"), temp.relpath("double.o"))
        loaded = tvm.runtime.load_module(temp.relpath("double.so"))
        a = tvm.nd.array(np.arange(7, dtype="float32"))
        b = tvm.nd.empty((7,), "float32")
        loaded(a, b)
        np.testing.assert_array_equal(b.numpy(), a.numpy() * 2)
        assert loaded.entry_name == "double"
        with pytest.raises(ValueError, match="cannot save a module as 'bin'"):
            f.save(temp.relpath("double.bin"))
        path = temp.path
    assert not os.path.exists(path)
