"""``python -m kernelrpc.proxy``: run the proxy until interrupted."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .service import ProxyConfig, ProxyService


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 30 * 86400:
        raise argparse.ArgumentTypeError(f"{text} s is outside (0, 30 days]")
    return value


def parse_args(argv=None) -> tuple[ProxyConfig, str]:
    p = argparse.ArgumentParser(prog="python -m kernelrpc.proxy", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9090,
                   help="first port to try; 0 lets the OS choose (default 9090)")
    p.add_argument("--port-end", type=int, default=9199, help="end of the port range (exclusive)")
    p.add_argument("--tracker", type=_host_port, help="register the devices' keys with this tracker")
    p.add_argument("--custom-addr", default=None,
                   help="address the tracker hands to clients for this proxy (default: this host "
                        "as the tracker sees it; set it behind NAT or a port forward)")
    p.add_argument("--web-port", type=int, default=None,
                   help="also accept WebSocket peers (browser devices, TVM's "
                        "websocket_proxy_server) at ws://HOST:WEB_PORT/ws; 0 lets the OS choose "
                        "(default: off)")
    p.add_argument("--timeout-client", type=_seconds, default=30.0,
                   help="seconds a client waits for a device before MISMATCH (default 30, below "
                        "kernelrpc.rpc.connect's 60 s connect timeout)")
    p.add_argument("--timeout-server", type=_seconds, default=600.0,
                   help="seconds a device waits for a client before MISMATCH; it then "
                        "reconnects (default 600, as TVM)")
    p.add_argument("--timeout-handshake", type=_seconds, default=10.0,
                   help="seconds a new connection has to send its key (default 10)")
    p.add_argument("--relay", choices=["native", "splice", "copy"], default="native",
                   help="native (default): a JIT-compiled loop, one thread per session (64-bit "
                        "Linux; else splice); splice: Python moves bytes kernel-side with "
                        "splice(2); copy: Python recv_into/send through a 1 MiB buffer")
    p.add_argument("--relay-spin-us", type=float, default=50.0,
                   help="native relay: keep polling this many microseconds after traffic before "
                        "sleeping; saves two wake-ups per round trip, costs CPU while a session "
                        "is busy (default 50; 0 never polls)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    a = p.parse_args(argv)
    if not 0 <= a.port < 65536:
        p.error("--port must be in [0, 65535]")
    if a.web_port is not None and not 0 <= a.web_port < 65536:
        p.error("--web-port must be in [0, 65535]")
    if not 0 <= a.relay_spin_us <= 1e6:
        p.error("--relay-spin-us must be in [0, 1000000]")
    return ProxyConfig(host=a.host, port=a.port, port_end=a.port_end, tracker=a.tracker,
                       custom_addr=a.custom_addr, web_port=a.web_port,
                       timeout_client=a.timeout_client, timeout_server=a.timeout_server,
                       handshake_timeout=a.timeout_handshake, relay=a.relay,
                       relay_spin_us=a.relay_spin_us), a.log_level


async def _serve(config: ProxyConfig) -> None:
    service = ProxyService(config)
    host, port = await service.start()
    web = ""
    if service.web_address is not None:
        web = " (websocket ws://{}:{}/ws)".format(*service.web_address)
    print(f"kernelrpc.proxy listening on {host}:{port}{web}", flush=True)
    logging.getLogger("kernelrpc.proxy").info("relaying with %s", service.describe_relay())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.close()


def main(argv=None) -> int:
    config, level = parse_args(argv)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(config))
    except OSError as exc:
        logging.getLogger("kernelrpc.proxy").error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
