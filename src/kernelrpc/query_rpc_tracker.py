"""``python -m kernelrpc.query_rpc_tracker --host HOST --port PORT [--json]``: a tracker's state.

(Also ``kernelrpc query`` and the ``kernelrpc-query-tracker`` script; the module has TVM's name.)

Prints the same text as TVM's ``python -m tvm.exec.query_rpc_tracker`` on stdout, and
says on stderr (and in the exit code) when something is wrong:

====  =================================================================
0     at least one server is free
3     tracker unreachable (refused, timed out, or not a tracker)
4     no servers registered for any key
5     servers are registered, but all are busy
====  =================================================================
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import cli
from .errors import AuthenticationError, ConnectionLost, TrackerError
from .wire.auth import resolve_token
from .wire.tls import TLSError
from .rpc.tracker_client import TrackerUnreachable, connect_tracker, count_servers, format_summary, printable

EXIT_OK, EXIT_UNREACHABLE, EXIT_NO_SERVERS, EXIT_ALL_BUSY = 0, 3, 4, 5


def classify(info: dict) -> tuple[int, str]:
    """Exit code and status word for a SUMMARY payload."""
    free = sum(q.get("free", 0) for q in info.get("queue_info", {}).values())
    if free:
        return EXIT_OK, "ok"
    if not info.get("server_info"):
        return EXIT_NO_SERVERS, "no_servers"
    return EXIT_ALL_BUSY, "all_busy"


def explain(status: str, info: dict, where: str) -> str:
    if status == "no_servers":
        return f"no servers are registered at tracker {where} for any key"
    pending = {k: q["pending"] for k, q in info.get("queue_info", {}).items() if q.get("pending")}
    servers = count_servers(info)
    busy = ", ".join(f"{printable(k)} ({n} servers, {pending.get(k, 0)} waiting)" for k, n in sorted(servers.items()))
    return f"all servers at tracker {where} are busy: {busy or 'no server key'}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.parser("python -m kernelrpc.query_rpc_tracker", __doc__, silent=False)
    parser.add_argument("--host", default="", help="tracker host (default $TVM_TRACKER_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="tracker port (default $TVM_TRACKER_PORT or 9190)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON for scripts")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the tracker")
    parser.add_argument("--auth-token-file", default=None, metavar="PATH",
                        help="the token of a tracker started with --auth-token-file (default "
                             "$KERNELRPC_AUTH_TOKEN or the file $KERNELRPC_AUTH_TOKEN_FILE)")
    cli.add_tls_flags(parser, accepts=False)
    args = parser.parse_args(argv)
    cli.setup_logging(args)
    args.host = args.host or os.environ.get("TVM_TRACKER_HOST", "127.0.0.1")
    args.port = args.port or int(os.environ.get("TVM_TRACKER_PORT", "9190"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    where = f"{args.host}:{args.port}"
    try:
        token = resolve_token(None, args.auth_token_file)
    except (OSError, ValueError) as exc:
        print(f"--auth-token-file: {exc}", file=sys.stderr)
        return 2
    tls = cli.tls_config(args, "kernelrpc.query_rpc_tracker")
    try:
        with connect_tracker(args.host, args.port, connect_timeout=args.timeout, auth_token=token,
                             tls=tls) as session:
            info = session.summary()
    except AuthenticationError as exc:
        print(f"tracker refused us: {printable(exc)}", file=sys.stderr)
        return 1
    except TLSError as exc:
        print(f"TLS with the tracker failed: {printable(exc)}", file=sys.stderr)
        return 1
    except (TrackerUnreachable, ConnectionLost) as exc:
        if args.json:
            print(json.dumps({"tracker": where, "status": "unreachable", "error": str(exc)}))
        print(f"tracker unreachable: {printable(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except TrackerError as exc:
        print(f"tracker error: {printable(exc)}", file=sys.stderr)
        return 1
    code, status = classify(info)
    if args.json:
        print(json.dumps({"tracker": where, "status": status, "summary": info}, indent=2, sort_keys=True))
    else:
        print(f"Tracker address {where}\n")
        print(format_summary(info))
    if code != EXIT_OK:
        print(explain(status, info, where), file=sys.stderr)
    return code


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.query_rpc_tracker", main)


if __name__ == "__main__":
    sys.exit(command())
