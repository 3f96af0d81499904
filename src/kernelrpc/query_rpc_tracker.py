"""``python -m kernelrpc.query_rpc_tracker``: Apache TVM's name for the tracker's status tool,
:mod:`kernelrpc.tracker.query`."""
from . import cli
from .tracker.query import main

if __name__ == "__main__":
    raise SystemExit(cli.run_main("kernelrpc.query_rpc_tracker", main))
