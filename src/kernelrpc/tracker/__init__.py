"""The tracker: shares a fleet of device servers among clients, by device key.

``python -m kernelrpc.tracker`` runs it; it speaks Apache TVM's tracker protocol,
so TVM's servers, clients and ``query_rpc_tracker`` work with it.  The matching
rules live in :mod:`kernelrpc.tracker.scheduler`, free of IO.
"""
