"""``python -m kernelrpc.tracker``: hand device servers to clients by key, for a whole lab.

Speaks Apache TVM's tracker protocol: TVM's servers, clients and query_rpc_tracker work with it.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys

from .. import cli
from ..netutil import bind_first_free
from .service import Limits, serve


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.parser("python -m kernelrpc.tracker", __doc__)
    cli.add_host(parser)
    cli.add_port_range(parser, 9190, "the tracker")
    cli.add_numbers(parser, [
        ("--lease-timeout", float, 5.0, "seconds a server that reports its sessions stays leased to a client "
                                        "that never connects, before it goes back to the pool"),
        ("--frame-timeout", float, Limits.frame_timeout,
         "seconds a connection may take to finish a frame it started (0: no limit)"),
        ("--idle-timeout", float, Limits.idle_timeout,
         "seconds a connection that holds no slot, lease or request may stay silent (0: no limit)"),
        ("--max-connections-per-host", int, Limits.max_connections_per_host,
         "connections from one address (TLS handshakes in progress included); past it the longest-idle "
         "one that holds nothing is closed"),
    ])
    parser.add_argument("--web-port", type=int, default=None,
                        help="serve the status page, /api/status and /metrics on this port "
                             "(0: the OS chooses; needs the web extra)")
    parser.add_argument("--web-host", default=None, help="address of the status page (default: --host)")
    parser.add_argument("--db", default=None, metavar="PATH",
                        help="the status page shows the latest result per board from this results "
                             "database (python -m kernelrpc.model --db)")
    cli.add_security_flags(parser)
    args = parser.parse_args(argv)
    if args.db is not None and args.web_port is None:
        parser.error("--db shows results on the status page: give --web-port too")
    return args


EXPOSES = ("can hold every device, register fake servers that receive clients' match keys, and "
           "see every key")


async def _main(args: argparse.Namespace) -> None:
    sock = bind_first_free(args.host, args.port, cli.port_end(args), backlog=1024)
    sock.setblocking(False)
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)

    def ready(addr) -> None:
        print(f"kernelrpc.tracker listening on {addr[0]}:{addr[1]}{' (TLS)' if args.tls else ''}", flush=True)

    def attach_web(service) -> None:
        _, (host, port) = web.start(service, args.web_host or args.host, args.web_port, tls=args.tls,
                                    db=args.db)
        print(f"kernelrpc.tracker status page on http{'s' if args.tls else ''}://{host}:{port}/", flush=True)

    if args.web_port is not None:
        from . import web

    # Everything alive now (modules, the loop) lives as long as the process: keep it out
    # of the collector's generations, so that a collection under load scans only the
    # objects made since and pauses every waiting client for less.
    gc.collect()
    gc.freeze()
    try:
        limits = Limits(frame_timeout=args.frame_timeout, idle_timeout=args.idle_timeout,
                        max_connections_per_host=args.max_connections_per_host)
        await serve(sock, lease_timeout=args.lease_timeout, on_ready=ready, limits=limits, backlog=1024,
                    on_service=attach_web if args.web_port is not None else None, auth_token=args.auth_token,
                    tls=args.tls.server_context() if args.tls is not None else None)
    except asyncio.CancelledError:
        pass


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.web_port is not None:
        from .web import require_web_extra
        try:
            require_web_extra()
        except ImportError as exc:
            print(f"kernelrpc.tracker: {exc}", file=sys.stderr)
            return 2
    cli.setup_logging(args)
    args.auth_token, args.tls = cli.security(args, "kernelrpc.tracker", args.host, EXPOSES)
    try:
        asyncio.run(_main(args))
    except OSError as exc:
        print(f"kernelrpc.tracker: {cli.bind_failure(exc, args)}", file=sys.stderr)
        return 1
    return 0


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.tracker", main)


if __name__ == "__main__":
    sys.exit(command())
