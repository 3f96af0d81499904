"""``python -m kernelrpc.proxy``: pair clients with device servers that connect out to it.

For boards that cannot be reached directly (NAT, firewalls): each board runs
``python -m kernelrpc.server --through-proxy --host PROXY --port PORT --key KEY``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

from .. import cli
from .native_relay import NativeRelayUnavailable
from .relays import RELAYS, RelayUnavailable
from .service import ProxyConfig, ProxyService


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= 30 * 86400:
        raise argparse.ArgumentTypeError(f"{text} s is outside (0, 30 days]")
    return value


def parse_args(argv=None) -> tuple[ProxyConfig, argparse.Namespace]:
    p = cli.parser("python -m kernelrpc.proxy", __doc__)
    cli.add_host(p)
    cli.add_port_range(p, 9090, "the proxy")
    p.add_argument("--tracker", type=cli.host_port, help="register the devices' keys with this tracker")
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
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="sets both --timeout-client and --timeout-server, like the timeout of "
                        "TVM's Proxy")
    p.add_argument("--timeout-handshake", type=_seconds, default=10.0,
                   help="seconds a new connection has to send its key (default 10)")
    p.add_argument("--example-rpc", default=None, metavar="BOOL",
                   help="accepted for TVM's command lines: TVM serves its web runtime's example "
                        "page with it; kernelrpc has no such page (see the warning)")
    p.add_argument("--relay", choices=RELAYS, default="auto",
                   help="native: a C loop, one thread per session (64-bit Linux with a C "
                        "compiler; start-up fails elsewhere); splice: Python moves bytes "
                        "kernel-side with splice(2); copy: Python recv_into/send through a 1 MiB "
                        "buffer; auto (default): native where it runs, else splice with a warning. "
                        "With TLS every pair is relayed by copy through the TLS layer (native "
                        "and splice are refused)")
    p.add_argument("--relay-spin-us", type=float, default=50.0,
                   help="native relay: keep polling this many microseconds after traffic before "
                        "sleeping; saves two wake-ups per round trip, costs CPU while a session "
                        "is busy (default 50; 0 never polls)")
    cli.add_security_flags(p)
    a = p.parse_args(argv)
    if not 0 <= a.port < 65536:
        p.error("--port must be in [0, 65535]")
    if a.web_port is not None and not 0 <= a.web_port < 65536:
        p.error("--web-port must be in [0, 65535]")
    if not 0 <= a.relay_spin_us <= 1e6:
        p.error("--relay-spin-us must be in [0, 1000000]")
    if a.timeout is not None:
        a.timeout_client = a.timeout_server = a.timeout
    if a.timeout_server < 1:
        p.error("the devices' wait (--timeout-server, --timeout) must be at least 1 s: a device "
                "server takes a quicker MISMATCH for a sign that it did not reach a proxy")
    try:
        config = ProxyConfig(host=a.host, port=a.port, port_end=cli.port_end(a), tracker=a.tracker,
                             custom_addr=a.custom_addr, web_port=a.web_port,
                             timeout_client=a.timeout_client, timeout_server=a.timeout_server,
                             handshake_timeout=a.timeout_handshake, relay=a.relay,
                             relay_spin_us=a.relay_spin_us, tls=cli.tls_config(a, "kernelrpc.proxy"))
    except ValueError as exc:
        p.error(str(exc))
    if config.tls is not None and not config.tls.certfile:
        p.error("TLS needs --tls-cert (and --tls-key if the key is a separate file): the proxy "
                "terminates TLS for its peers")
    return config, a


async def _serve(config: ProxyConfig) -> None:
    service = ProxyService(config)
    host, port = await service.start()
    web = ""
    if service.web_address is not None:
        web = " (websocket ws://{}:{}/ws)".format(*service.web_address)
    tls = " (TLS)" if config.tls is not None else ""
    print(f"kernelrpc.proxy listening on {host}:{port}{tls}{web}", flush=True)
    logging.getLogger("kernelrpc.proxy").info("relaying with %s", service.describe_relay())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.close()


EXPOSES = ("can hold every device behind it and connect fake devices ('server:KEY') that receive the "
           "next client's handshake and match key")


def main(argv=None) -> int:
    config, args = parse_args(argv)
    cli.setup_logging(args)
    config = dataclasses.replace(config, auth_token=cli.auth_token(args, "kernelrpc.proxy", config.host, EXPOSES))
    if args.example_rpc is not None and args.example_rpc.strip().lower() not in ("", "0", "false", "no"):
        cli.warn_ignored("--example-rpc", "it serves the example page of TVM's web runtime, which "
                                          "kernelrpc does not ship; WebSocket peers still connect at --web-port")
    try:
        asyncio.run(_serve(config))
    except NativeRelayUnavailable as exc:
        logging.getLogger("kernelrpc.proxy").error("--relay native: %s", exc)
        return 1
    except RelayUnavailable as exc:
        logging.getLogger("kernelrpc.proxy").error("%s", exc)
        return 1
    except OSError as exc:
        logging.getLogger("kernelrpc.proxy").error("%s", cli.bind_failure(exc, args))
        return 1
    return 0


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.proxy", main)


if __name__ == "__main__":
    sys.exit(command())
