"""``python -m kernelrpc.server``: serve sessions on a port, one child process per session."""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys

from .. import cli
from .config import ServerConfig, parse_cpus
from ..netutil import bind_first_free
from .listener import Server
from .privileges import session_user

log = logging.getLogger("kernelrpc.server")


def parse_args(argv=None) -> tuple[ServerConfig, argparse.Namespace]:
    parser = cli.parser("python -m kernelrpc.server", __doc__)
    cli.add_host(parser)
    cli.add_port_range(parser, 9090, "the server", end=9199)
    parser.add_argument("--key", default="",
                        help="the device key: clients ask the tracker or proxy for it, or present it "
                             "directly (client:KEY)")
    defaults = ServerConfig
    cli.add_numbers(parser, [
        ("--session-timeout", float, 0.0, "end every session after this many seconds (0: no limit of our own)"),
        ("--max-upload-bytes", int, defaults.max_upload_bytes, "largest file a client may upload"),
        ("--max-frame-bytes", int, defaults.max_frame_bytes, "largest session packet accepted"),
        ("--max-tensor-bytes", int, defaults.max_tensor_bytes, "largest tensor a client may allocate"),
        ("--handshake-timeout", float, defaults.handshake_timeout,
         "seconds a new connection has to send its key (and finish its TLS handshake)"),
        ("--idle-timeout", float, defaults.idle_timeout,
         "end a session that sends no request for this many seconds (0: never)"),
        ("--io-timeout", float, defaults.io_timeout,
         "end a session whose frame or transfer stalls this many seconds (0: never)"),
        ("--min-transfer-rate", int, defaults.min_transfer_rate,
         "bytes/s an upload or tensor copy must keep on average (0: any pace)"),
    ])
    parser.add_argument("--checked-tensors", action="store_true",
                        help="check after each call that no kernel wrote outside its tensor arguments")
    cli.add_numbers(parser, [
        ("--max-session-bytes", int, None,
         "tensor bytes one session may hold at a time (default: 3/4 of the memory)"),
        ("--max-pending", int, defaults.max_pending,
         "connections held in the handshake or waiting for a session slot; past it, the oldest "
         "unfinished handshake is dropped"),
        ("--max-sessions", int, 1, "sessions served at the same time (default 1: measurements never overlap)"),
    ])
    parser.add_argument("--no-spare-session", action="store_true",
                        help="fork each session's child when its client arrives, instead of handing it "
                             "to a spare child forked and warmed up ahead (whose first request is faster)")
    parser.add_argument("--workspace-root", default=None, help="parent directory of session workspaces")
    parser.add_argument("--tracker", type=cli.host_port, default=None, metavar="HOST:PORT",
                        help="register with this tracker under --key (re-registers after every session)")
    parser.add_argument("--custom-addr", default=None,
                        help="address the tracker hands to clients, when the one it sees is not theirs to reach "
                             "(NAT, or a server on the tracker's host that would advertise 127.0.0.1; with "
                             "TLS, a name or address its certificate covers) "
                             "(default: this host as the tracker sees it)")
    parser.add_argument("--through-proxy", action="store_true",
                        help="connect out to the proxy at --host/--port and serve the clients it pairs")
    parser.add_argument("--cpus", default=None, metavar="LIST",
                        help="run on these cores only, e.g. 0 or 0,2-3 (sessions report them)")
    parser.add_argument("--load-library", default=None, metavar="LIB[:LIB...]",
                        help="shared libraries to load (RTLD_GLOBAL) before serving, so that "
                             "uploaded modules can use their symbols (TVM's flag)")
    parser.add_argument("--run-as", default=None, metavar="USER",
                        help="when started as root, run sessions as this user (default: nobody); "
                             "--run-as root keeps them root")
    parser.add_argument("--no-fork", action="store_true",
                        help="accepted for TVM's command lines; sessions are always forked (see the warning)")
    cli.add_security_flags(parser)
    args = parser.parse_args(argv)
    try:
        cpus = parse_cpus(args.cpus) if args.cpus is not None else None
    except ValueError as exc:
        parser.error(str(exc))
    if args.through_proxy and args.tracker:
        parser.error("--through-proxy and --tracker exclude each other: run the proxy with --tracker")
    if args.tracker and not args.key:
        parser.error("--tracker needs --key")
    from ..wire.protocol import MIN_MAX_FRAME_BYTES
    if args.max_frame_bytes < MIN_MAX_FRAME_BYTES:
        parser.error(f"--max-frame-bytes must be at least {MIN_MAX_FRAME_BYTES}")
    if (args.max_sessions < 1 or args.max_pending < 1 or args.session_timeout < 0 or args.handshake_timeout <= 0
            or args.idle_timeout < 0 or args.io_timeout < 0):
        parser.error("--max-sessions and --max-pending must be >= 1, timeouts positive")
    return ServerConfig(
        host=args.host, port=args.port, port_end=args.port_end, key=args.key,
        session_timeout=args.session_timeout, max_upload_bytes=args.max_upload_bytes,
        max_frame_bytes=args.max_frame_bytes, max_tensor_bytes=args.max_tensor_bytes,
        handshake_timeout=args.handshake_timeout, max_pending=args.max_pending,
        max_sessions=args.max_sessions, spare_session=not args.no_spare_session,
        idle_timeout=args.idle_timeout, io_timeout=args.io_timeout, checked_tensors=args.checked_tensors,
        min_transfer_rate=args.min_transfer_rate,
        **({} if args.max_session_bytes is None else {"max_session_bytes": args.max_session_bytes}),
        workspace_root=args.workspace_root, tracker_addr=args.tracker,
        custom_addr=args.custom_addr, through_proxy=args.through_proxy, cpus=cpus), args


EXPOSES = ("can run any code as this server's user (uploading a module runs its constructors) "
           "and hold its device")


def load_libraries(spec: str) -> None:
    """TVM's ``--load-library a.so:b.so``: load each into this process, symbols global."""
    for path in filter(None, spec.split(":")):
        try:
            ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise SystemExit(f"kernelrpc.server: --load-library cannot load {path}: {exc}") from None
        log.info("loaded library %s", path)


def main(argv=None) -> int:
    config, args = parse_args(argv)
    cli.setup_logging(args)
    config.auth_token, config.tls = cli.security(args, "kernelrpc.server",
                                                 "127.0.0.1" if config.through_proxy else config.host, EXPOSES,
                                                 accepts=not config.through_proxy)
    try:
        config.confine()
    except OSError as exc:
        print(f"kernelrpc.server: --cpus {','.join(map(str, config.cpus))}: {exc}", file=sys.stderr)
        return 2
    if args.no_fork:
        cli.warn_ignored("--no-fork", "the server always forks each session from a parent that runs no "
                                      "device driver or thread (the problems TVM's spawn mode avoids)")
    if args.load_library:
        load_libraries(args.load_library)
    try:
        import tempfile
        config.session_user, run_as_warning = session_user(args.run_as,
                                                           config.workspace_root or tempfile.gettempdir())
    except ValueError as exc:
        print(f"kernelrpc.server: {exc}", file=sys.stderr)
        return 2

    def report_session_user() -> None:      # after the ready line, which tests and scripts wait for
        if run_as_warning:
            log.warning("%s", run_as_warning)
        elif config.session_user is not None:
            log.info("sessions run as user %s (uid %d)", config.session_user.name, config.session_user.uid)
    if config.through_proxy:
        from .through_proxy import NotAProxy, serve_through_proxy
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        report_session_user()
        try:
            serve_through_proxy(config)
        except NotAProxy as exc:
            log.error("%s", exc)
            return 2
        return 0
    try:
        sock = bind_first_free(config.host, config.port, config.port_end)
    except OSError as exc:
        print(f"kernelrpc.server: {cli.bind_failure(exc, args)}", file=sys.stderr)
        return 1
    registration = None
    if config.tracker_addr is not None:
        from .registration import TrackerRegistration
        registration = TrackerRegistration(config.tracker_addr, config.key, sock.getsockname()[1], config.custom_addr,
                                           auth_token=config.auth_token,
                                           tls=config.tls.client_context() if config.tls is not None else None)
    server = Server(config, sock, registration)
    server.install_signal_handlers()
    host, port = server.address
    print(f"kernelrpc.server listening on {host}:{port}{' (TLS)' if config.tls else ''}", flush=True)
    report_session_user()
    server.serve_forever()
    return 0


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.server", main)


if __name__ == "__main__":
    sys.exit(command())
