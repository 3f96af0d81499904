"""``python -m kernelrpc COMMAND``: the demo and the services under one command."""
from __future__ import annotations

import runpy
import sys

COMMANDS = {
    "demo": "kernelrpc.demo",
    "server": "kernelrpc.server",
    "tracker": "kernelrpc.tracker",
    "proxy": "kernelrpc.proxy",
    "query": "kernelrpc.query_rpc_tracker",
}

USAGE = "usage: kernelrpc {" + ",".join(COMMANDS) + "} [options]   (kernelrpc COMMAND --help for more; -v: version)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-v", "--version"):
        from . import __version__
        print(f"kernelrpc {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from . import cli
        from .demo import main as demo_main
        return cli.run_main("kernelrpc demo", demo_main, rest)
    sys.argv = [f"kernelrpc {command}", *rest]
    runpy.run_module(COMMANDS[command], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
