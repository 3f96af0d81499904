"""The proxy: devices that cannot be reached connect out to it and clients meet them by key.

``python -m kernelrpc.proxy --host 127.0.0.1 --port 9090 [--tracker HOST:PORT]``; see
``docs/proxy.md``.  The pairing handshake is Apache TVM's, so TVM devices and clients
can use this proxy and TVM's proxy can relay kernelrpc sessions.
"""
from .service import ProxyConfig, ProxyService

__all__ = ["ProxyConfig", "ProxyService"]
