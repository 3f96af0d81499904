"""The runtime runs on devices without numpy: prove it with the imports blocked."""
import subprocess
import sys
import textwrap

BLOCKED = ("numpy", "llvmlite", "tornado", "cloudpickle")

SCRIPT = textwrap.dedent("""
    import importlib.abc, struct, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())

    from kernelrpc import runtime
    mod = runtime.load_module({path!r})
    a = runtime.empty((1024,), "float32")
    a.copyfrom(struct.pack("=1024f", *range(1024)))
    b = runtime.empty((1024,), "float32")
    mod["addone"](a, b)
    assert struct.unpack("=1024f", b.buffer)[:3] == (1.0, 2.0, 3.0)
    mod["axpy"](2.0, a, b, 1024)
    result = mod.time_evaluator("addone", runtime.cpu(0), number=3, repeat=2,
                                f_preproc="cache_flush_cpu_non_first_arg")(a, b)
    assert result.repeat == 2 and runtime.ProfileResult.from_dict(result.to_dict()) == result
    try:
        b.numpy()
    except ImportError:
        pass
    else:
        raise SystemExit("numpy() should need numpy")
    print(sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r}), "ok")
""")


def test_runtime_works_with_numpy_and_friends_blocked(fixture_module):
    script = SCRIPT.format(blocked=BLOCKED, path=str(fixture_module))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] ok"
