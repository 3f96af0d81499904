"""What importing kernelrpc loads: little, until a part is used. Each check runs in a fresh
interpreter and looks at its ``sys.modules``; the public import paths still all work."""
import json
import logging
import subprocess
import sys
import textwrap

from servicectl import SRC, child_env

HEAVY = ("numpy", "llvmlite", "tqdm", "cloudpickle", "tornado")


def loaded_after(code: str, before: str | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``; with ``before``, only those
    that ``code`` loaded after ``before`` ran. The variables that turn on authentication or TLS
    are left out of the interpreter's environment."""
    script = (f"import sys as _s\n{before or ''}\n_before = set(_s.modules) if {before is not None} else set()\n"
              f"{code}\n_loaded = sorted(set(_s.modules) - _before)\nimport json as _j\nprint(_j.dumps(_loaded))\n")
    env = {name: value for name, value in child_env({"PYTHONPATH": SRC}).items()
           if not name.startswith(("KERNELRPC_AUTH_", "KERNELRPC_TLS_"))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_rpc_package_loads_only_the_error_classes():
    loaded = loaded_after("import kernelrpc.rpc", before="")
    assert {name for name in loaded if name.startswith("kernelrpc")} == {"kernelrpc", "kernelrpc.errors",
                                                                       "kernelrpc.rpc"}
    assert not loaded & {"importlib", "warnings", "logging", "socket", "re", "typing", "enum"}, loaded


def test_a_first_connect_tracker_loads_the_tracker_client_and_two_c_modules(tracker):
    """Not logging, json (with re), enum, typing, socket, struct, random, the idna codec, the
    auth and TLS modules: each of them would cost the first connect more than all it does."""
    host, port = tracker.address
    loaded = loaded_after(textwrap.dedent(f"""
        with rpc.connect_tracker({host!r}, {port}) as t:
            t.ping()
            assert "queue_info" in t.summary()
    """), before="from kernelrpc import rpc")
    assert loaded <= {"kernelrpc.rpc.tracker_client", "kernelrpc.wire", "kernelrpc.wire.tracker_codec",
                      "kernelrpc.lazylog", "_socket", "_json"}, loaded


def test_the_tracker_client_reads_the_auth_and_tls_variables_their_modules_read():
    from kernelrpc.rpc import tracker_client
    from kernelrpc.wire import auth, tls

    assert tracker_client.AUTH_ENVIRONMENT == (auth.ENV_TOKEN, auth.ENV_TOKEN_FILE)
    assert tracker_client.TLS_ENVIRONMENT == (tls.ENV_CA, tls.ENV_CERT, tls.ENV_KEY)


def test_a_tracker_query_loads_no_numpy_no_session_codec_and_no_openssl(tracker):
    host, port = tracker.address
    loaded = loaded_after(textwrap.dedent(f"""
        from kernelrpc import rpc
        with rpc.connect_tracker({host!r}, {port}) as t:
            assert "queue_info" in t.summary()
    """))
    assert not loaded & {*HEAVY, "_hashlib", "kernelrpc.wire.protocol", "kernelrpc.rpc.client",
                         "kernelrpc.runtime"}, loaded


def test_the_tracker_client_logs_through_its_module_logger_once_something_is_logged(caplog):
    loaded = loaded_after("from kernelrpc.rpc import tracker_client\nassert 'logging' not in sys.modules\n"
                          "tracker_client.log.warning('x')", before="import sys")
    assert "logging" in loaded
    from kernelrpc.rpc import tracker_client

    with caplog.at_level("INFO", "kernelrpc.rpc.tracker_client"):
        tracker_client.log.info("queued for %r", "board")
    record, = caplog.records
    assert (record.name, record.getMessage(), record.funcName) == (
        "kernelrpc.rpc.tracker_client", "queued for 'board'",
        "test_the_tracker_client_logs_through_its_module_logger_once_something_is_logged")
    assert tracker_client.log.isEnabledFor(logging.INFO) == logging.getLogger(tracker_client.__name__).isEnabledFor(
        logging.INFO)


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
