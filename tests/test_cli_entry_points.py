"""Every entry point: one log set-up and format, -v, --help without markup, TVM's flags."""
import re
import socket
import subprocess
import sys
import time

import pytest

from servicectl import child_env
from kernelrpc.wire import handshake as H

ENTRY_POINTS = ["kernelrpc.server", "kernelrpc.tracker", "kernelrpc.proxy", "kernelrpc.query_rpc_tracker"]
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")


def run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


def log_lines(service):
    return [line for line in service.lines if "listening on" not in line and "connected to proxy" not in line]


@pytest.mark.parametrize("module", [*ENTRY_POINTS, "kernelrpc"])
def test_version(module):
    for flag in ("-v", "--version"):
        out = run(module, flag)
        assert out.returncode == 0 and "kernelrpc 0.1.0" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_is_plain_text_with_defaults(module):
    out = run(module, "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "``" not in text and ":class:" not in text and "====" not in text
    assert "--log-level LEVEL" in text and "(default: info)" in text
    if module != "kernelrpc.query_rpc_tracker":
        assert "(default: 127.0.0.1)" in text


def test_demo_help_and_version():
    out = run("kernelrpc", "demo", "--help")
    assert out.returncode == 0 and "(default: 512)" in out.stdout and "``" not in out.stdout
    assert run("kernelrpc", "demo", "-v").stdout.strip() == "kernelrpc demo (kernelrpc 0.1.0)"


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_unknown_log_level_is_refused_by_name(module):
    out = run(module, "--log-level", "TRACE")
    assert out.returncode == 2
    assert "unknown log level 'TRACE'; choose one of debug, info, warning, error, critical" in out.stderr


def test_levels_in_any_case_and_one_format(start_service, tmp_path):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--log-level", "debug"])
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "fmt", "--log-level", "Info",
                                                "--tracker", f"127.0.0.1:{tracker.port}"])
    server.wait_for_line("registered key fmt")
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--log-level", "INFO"])
    proxy.wait_for_line("relaying with")
    tracker.wait_for_line("server server:fmt registered")
    for service in (tracker, server, proxy):
        lines = log_lines(service)
        assert lines and all(LOG_LINE.match(line) for line in lines), service.lines


def test_server_silent_logs_warnings_only(start_service):
    loud = start_service("kernelrpc.server", ["--port", "0", "--key", "k", "--tracker", "127.0.0.1:1"])
    quiet = start_service("kernelrpc.server", ["--port", "0", "--key", "k", "--tracker", "127.0.0.1:1",
                                               "--silent"])
    for service in (loud, quiet):
        service.wait_for_line("cannot reach tracker")
    for service in (loud, quiet):
        with socket.create_connection(service.address) as sock:     # a peer that is not ours: logged
            sock.sendall(H.encode_preamble("client:wrong"))
            assert sock.recv(4)
    loud.wait_for_line(" INFO ")
    time.sleep(0.5)
    assert not [line for line in quiet.lines if " INFO " in line], quiet.lines


def test_tracker_accepts_silent(start_service):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--silent"])
    with socket.create_connection(tracker.address) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert sock.recv(16) == b""
    tracker.wait_for_line("WARNING kernelrpc.tracker.service: .* is not a tracker peer")


def test_server_no_fork_is_accepted_with_the_reason(start_service):
    server = start_service("kernelrpc.server", ["--port", "0", "--no-fork"])
    line = server.wait_for_line("--no-fork")
    assert "WARNING" in line and "has no effect" in line and "forks" in line


def test_server_load_library(start_service, tmp_path):
    src = tmp_path / "extra.c"
    src.write_text("int kernelrpc_extra_symbol(void) { return 42; }\n")
    lib = tmp_path / "libextra.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    server = start_service("kernelrpc.server", ["--port", "0", "--load-library", str(lib)])
    server.wait_for_line(f"loaded library {lib}")
    with open(f"/proc/{server.proc.pid}/maps") as maps:
        assert str(lib) in maps.read()
    missing = run("kernelrpc.server", "--port", "0", "--load-library", str(tmp_path / "nope.so"))
    assert missing.returncode != 0 and "--load-library cannot load" in missing.stderr


def test_proxy_timeout_sets_both_waits(start_service):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--timeout", "1"])
    for role in ("client", "server"):
        with socket.create_connection(proxy.address) as sock:
            sock.settimeout(20)                       # the defaults are 30 s and 600 s
            sock.sendall(H.encode_preamble(f"{role}:lonely"))
            assert sock.recv(4) == H.encode_reply(H.RPC_CODE_MISMATCH)


def test_proxy_example_rpc_is_accepted_with_the_reason(start_service):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--example-rpc", "1"])
    line = proxy.wait_for_line("--example-rpc")
    assert "WARNING" in line and "has no effect" in line


def test_errors_are_one_line_naming_the_address(tmp_path):
    for module in ("kernelrpc.server", "kernelrpc.tracker"):
        out = run(module, "--host", "999.1.1.1", "--port", "0", "--log-level", "error")
        assert out.returncode == 1
        assert out.stderr.strip().splitlines() == [
            f"{module}: cannot listen on 999.1.1.1:0: '999.1.1.1' is not an address of this host "
            "(Name or service not known)"], out.stderr


def test_error_line_keeps_the_first_line_and_counts_the_rest():
    from kernelrpc import cli
    assert cli.error_line("kernelrpc x", RuntimeError("did not start; output:\nline 1\n\nline 2\n")) == (
        "kernelrpc x: error: did not start; output: [1 more line] line 2 (RuntimeError); --log-level debug "
        "shows the traceback")
    assert cli.error_line("kernelrpc x", OSError()) == (
        "kernelrpc x: error: OSError (OSError); --log-level debug shows the traceback")
    assert cli.rerun_command("kernelrpc demo", ["--output", "a b.so"]) == "python -m kernelrpc demo --output 'a b.so'"


def test_deploy_bundle_says_where_it_wrote_and_how_to_rebuild(tmp_path):
    out = run("kernelrpc.deploy", "bundle", "--out", str(tmp_path / "dev.pyz"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == (
        f"kernelrpc.deploy bundle: wrote the device bundle to {tmp_path / 'dev.pyz'}; rerun: python -m "
        f"kernelrpc.deploy bundle --out {tmp_path / 'dev.pyz'}")


def _tracker_of(command: str, argv: list[str]):
    """What ``command`` makes of its ``--tracker`` flag (its argument parser, in this process)."""
    if command == "kernelrpc.server":
        from kernelrpc.server.__main__ import parse_args
        return parse_args([*argv, "--key", "board"])[0].tracker_addr
    if command == "kernelrpc.proxy":
        from kernelrpc.proxy.__main__ import parse_args
        return parse_args(argv)[0].tracker
    from kernelrpc.model import build_parser
    return build_parser().parse_args(["net.onnx", *argv]).tracker


@pytest.mark.parametrize("command", ["kernelrpc.server", "kernelrpc.proxy", "kernelrpc.model"])
def test_tracker_flag_takes_host_port_or_bracketed_ipv6_and_names_what_is_wrong(command, capsys):
    assert _tracker_of(command, ["--tracker", "tracker-host:9190"]) == ("tracker-host", 9190)
    assert _tracker_of(command, ["--tracker", "[::1]:9190"]) == ("::1", 9190)
    for text, why in ((":9190", "the host is empty"), ("host:0", "1..65535"), ("host", "expected HOST:PORT"),
                      ("::1:9190", "IPv6 address in brackets")):
        with pytest.raises(SystemExit) as info:
            _tracker_of(command, ["--tracker", text])
        err = capsys.readouterr().err
        assert info.value.code == 2 and f"argument --tracker: {text!r}: " in err and why in err, err
