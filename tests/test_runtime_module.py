import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from fixtures.build import compile_module, module_source
from kernelrpc import nd
from kernelrpc.errors import KernelError, ModuleError
from kernelrpc.runtime import Device, empty, load_module


@pytest.fixture(scope="module")
def mod(fixture_module):
    return load_module(fixture_module)


def test_metadata_entry_and_target(mod):
    assert mod.metadata["format"] == "kernelrpc.module"
    assert mod.entry_name == "addone" and mod.entry_func is mod["addone"]
    assert mod.target["triple"] and mod.target["string"] == "c"
    assert "matmul" in mod and "nope" not in mod and mod.implements_function("vadd")
    assert mod.get_function("vadd") is mod["vadd"]
    with pytest.raises(AttributeError, match="has no function 'nope'; it has: addone, vadd"):
        mod["nope"]


def test_addone_vadd_matmul(mod):
    a = nd.array(np.arange(1024, dtype="float32"))
    b = nd.empty((1024,), "float32")
    mod["addone"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(1024) + 1)
    c = nd.empty((1024,), "float32")
    mod["vadd"](a, b, c)
    np.testing.assert_array_equal(c.numpy(), 2 * np.arange(1024) + 1)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((2, 64, 64)).astype("float32")
    out = nd.empty((64, 64))
    mod["matmul"](nd.array(x), nd.array(y), out)
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4, atol=1e-4)


def test_scalar_arguments(mod):
    x = nd.array(np.ones(1024, dtype="float32"))
    y = nd.array(np.full(1024, 2.0, dtype="float32"))
    mod["axpy"](0.5, x, y, 10)
    np.testing.assert_array_equal(y.numpy()[:12], [2.5] * 10 + [2.0] * 2)
    out = nd.empty((4, 8), "int64")
    mod["iota_i64"](out, -(1 << 40))
    assert out.numpy().ravel().tolist() == [-(1 << 40) + i for i in range(32)]


def test_every_scalar_dtype_lands_at_offset_0_of_its_slot(mod):
    values = [True, -5, -300, -70000, -(1 << 40), 250, 65000, (1 << 32) - 1, (1 << 64) - 1,
              1.5, -2.25, 1e300]
    dtypes = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]
    out = nd.empty((12,), "uint64")
    mod["echo_scalars"](out, *values)
    expected = [int.from_bytes(np.array(v, dtype=d).tobytes(), sys.byteorder)
                for v, d in zip(values, dtypes)]
    assert out.numpy().tolist() == expected


def test_kernel_error_code_names_the_function(mod):
    mod["error_code"](0)
    with pytest.raises(KernelError, match="'error_code' failed with error code 5") as info:
        mod["error_code"](5)
    assert isinstance(info.value, RuntimeError) and info.value.code == 5
    with pytest.raises(KernelError, match="'axpy' failed with error code 22"):
        mod["axpy"](1.0, nd.empty(1024), nd.empty(1024), 5000)


def test_wrong_calls_are_refused_before_the_native_call(mod):
    addone = mod["addone"]
    a = nd.empty((1024,))
    with pytest.raises(TypeError, match=r"addone\(A: float32\[1024\], B: float32\[1024\]\) "
                                        r"takes 2 arguments, got 1"):
        addone(a)
    with pytest.raises(TypeError, match="argument 1 'B': expected dtype float32, got float64"):
        addone(a, nd.empty((1024,), "float64"))
    with pytest.raises(ValueError, match=r"argument 0 'A': expected 2 dimensions float32\[64, 64\]"
                                         r", got 1 \[1024\]"):
        mod["matmul"](a, a, a)
    with pytest.raises(ValueError, match=r"argument 1 'B': expected shape float32\[1024\], got \[512\]"):
        addone(a, nd.empty((512,)))
    with pytest.raises(TypeError, match="argument 0 'A': expected a tensor float32\\[1024\\], "
                                        "got ndarray; wrap it with kernelrpc.nd.array"):
        addone(np.zeros(1024, "float32"), a)
    with pytest.raises(TypeError, match="argument 0 'A': expected a tensor .* got float"):
        addone(1.0, a)
    freed = nd.empty((1024,))
    freed.free()
    with pytest.raises(ValueError, match="argument 1 'B': the tensor has been freed"):
        addone(a, freed)
    with pytest.raises(TypeError, match="argument 0 'ms': expected an integer for int64"):
        mod["sleep_ms"](a)
    with pytest.raises(ValueError, match="argument 0 'code': 2147483648 is out of range for int32"):
        mod["error_code"](1 << 31)


def test_remote_tensors_are_refused_with_a_hint(mod):
    class RemoteTensorLike:
        device = Device("cpu", 0, session=object())
    with pytest.raises(TypeError, match="lives on a remote device"):
        mod["addone"](RemoteTensorLike(), empty(1024))


@pytest.mark.parametrize("name, expected", [
    ("crash_segv", -signal.SIGSEGV), ("crash_abort", -signal.SIGABRT), ("exit_now", 3)])
def test_crashing_kernels_end_the_process_as_designed(fixture_module, name, expected):
    code = (f"from kernelrpc.runtime import load_module; "
            f"load_module({str(fixture_module)!r})[{name!r}](); print('survived')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert proc.returncode == expected, proc.stderr
    assert "survived" not in proc.stdout


def metadata_with(functions, **changes):
    doc = {"format": "kernelrpc.module", "version": 1, "target": {}, "entry": None,
           "functions": functions, **changes}
    return json.dumps(doc)


def test_module_without_a_declared_symbol(tmp_path):
    fn = {"name": "f", "symbol": "__kernelrpc_fn_f", "args": []}
    path = compile_module(module_source(metadata_with([fn])), tmp_path, "missing")
    with pytest.raises(ModuleError, match="function 'f' is declared but its symbol "
                                          "__kernelrpc_fn_f is not exported"):
        load_module(path)


def test_module_with_a_newer_format_version(tmp_path):
    path = compile_module(module_source(metadata_with([], version=2)), tmp_path, "v2")
    with pytest.raises(ModuleError, match="module format version 2 is newer than this runtime "
                                          "supports \\(version 1\\)"):
        load_module(path)


def test_module_without_time_function_or_metadata(tmp_path):
    source = module_source(metadata_with([])).replace("__kernelrpc_time", "other_time")
    with pytest.raises(ModuleError, match="__kernelrpc_time is not exported"):
        load_module(compile_module(source, tmp_path, "no_time"))
    plain = compile_module("int answer(void) { return 42; }\n", tmp_path, "plain")
    with pytest.raises(ModuleError, match="not a kernelrpc module: it does not export "
                                          "__kernelrpc_metadata"):
        load_module(plain)


def test_bad_metadata_in_a_real_library(tmp_path):
    path = compile_module(module_source('{"format": "kernelrpc.module", "version": 1, '
                                        '"functions": [{"name": "f", "symbol": "abort", '
                                        '"args": []}]}'), tmp_path, "libc_symbol")
    with pytest.raises(ModuleError, match="symbol must be an identifier"):
        load_module(path)


def test_files_that_are_not_libraries(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF not really")
    with pytest.raises(ModuleError, match="cannot load .*junk.so"):
        load_module(junk)
    with pytest.raises(FileNotFoundError, match="module file not found"):
        load_module(tmp_path / "absent.so")


def test_set_num_threads_without_a_thread_pool(mod):
    assert mod.set_num_threads(4) == 1
    with pytest.raises(ValueError):
        mod.set_num_threads(1 << 40)



def test_loading_a_changed_file_again_loads_the_new_code(tmp_path):
    def source(value):
        fn = {"name": "answer", "symbol": "__kernelrpc_fn_answer",
              "args": [{"name": "out", "kind": "tensor", "dtype": "int32", "shape": [1]}]}
        body = ("EXPORT int32_t __kernelrpc_fn_answer(void **args) "
                f"{{ *(int32_t *)args[0] = {value}; return 0; }}")
        return module_source(metadata_with([fn]), body)

    path = tmp_path / "kernel.so"
    out = empty((1,), "int32")
    for value in (1, 2, 3):
        built = compile_module(source(value), tmp_path / "build", f"v{value}")
        if value == 3:   # rewritten in place (same inode) rather than replaced
            path.write_bytes(built.read_bytes())
        else:
            os.replace(built, path)
        load_module(path)["answer"](out)
        assert out.numpy().tolist() == [value]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "kernel.so"]
