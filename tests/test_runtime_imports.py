"""What importing kernelrpc loads: little, until a part is used. Each check runs in a fresh
interpreter and looks at its ``sys.modules``; the public import paths still all work."""
import json
import subprocess
import sys
import textwrap

from servicectl import SRC, child_env

HEAVY = ("numpy", "llvmlite", "tqdm", "cloudpickle", "tornado")


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = code + "\nimport json as _j, sys as _s\nprint(_j.dumps(sorted(_s.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], env=child_env({"PYTHONPATH": SRC}),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_tracker_query_loads_no_numpy_no_session_codec_and_no_openssl(tracker):
    host, port = tracker.address
    loaded = loaded_after(textwrap.dedent(f"""
        from kernelrpc import rpc
        with rpc.connect_tracker({host!r}, {port}) as t:
            assert "queue_info" in t.summary()
    """))
    assert not loaded & {*HEAVY, "_hashlib", "kernelrpc.rpc.protocol", "kernelrpc.rpc.client",
                         "kernelrpc.runtime"}, loaded


def test_a_session_client_does_not_load_the_module_loader_or_numpy():
    loaded = loaded_after("from kernelrpc import nd, rpc\nrpc.connect, rpc.RPCSession, nd.empty")
    assert "kernelrpc.rpc.client" in loaded
    assert not loaded & {*HEAVY, "kernelrpc.runtime.module", "kernelrpc.runtime.compat",
                         "kernelrpc.runtime.profile"}, loaded


def test_a_server_has_loaded_the_whole_runtime_before_it_forks_a_session():
    loaded = loaded_after("import kernelrpc.server.listener")
    runtime = {"buffer", "cacheflush", "compat", "conditions", "device", "device_info", "dtype",
               "evaluator", "metadata", "module", "profile", "tensor", "threads", "timing"}
    assert {f"kernelrpc.runtime.{name}" for name in runtime} <= loaded
    assert not loaded & {*HEAVY, "statistics", "html"}   # what encoding a result does not need


def test_the_public_names_still_import():
    loaded = loaded_after(textwrap.dedent("""
        import kernelrpc, kernelrpc.rpc
        from kernelrpc import rpc, nd, runtime, te, tir, target, testing, display
        from kernelrpc import cpu, device, build, lower, Target, RPCError
        from kernelrpc.rpc import connect, connect_tracker, RPCSession, TrackerSession, LocalSession
        from kernelrpc.runtime import *
        from kernelrpc.runtime import Device, Tensor, Module, ProfileResult, TimeEvaluator, load_module
        assert kernelrpc.rpc.connect is connect and runtime.ProfileResult is ProfileResult
        assert callable(runtime.device) and runtime.device("cpu", 0) == runtime.cpu(0)
        assert {"Tensor", "load_module", "config_threadpool"} <= set(dir(runtime))
        assert set(runtime.__all__) <= set(dir(runtime))
        try:
            runtime.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        else:
            raise SystemExit("a missing name must raise AttributeError")
    """))
    assert "kernelrpc.compiler" in loaded   # build/lower/te load the compiler when named


def test_runtime_device_stays_the_function_after_its_submodule_is_imported():
    loaded_after(textwrap.dedent("""
        import kernelrpc.runtime.device
        from kernelrpc import runtime
        assert callable(runtime.device) and not hasattr(runtime.device, "__file__")
    """))
