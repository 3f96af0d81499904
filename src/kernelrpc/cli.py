"""What every ``python -m kernelrpc...`` entry point shares: argument parser, log set-up, flags
kept for Apache TVM's command lines.

Standard library only: the device server uses it too.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import shlex
import socket
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "warn": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL}

log = logging.getLogger(__name__)


def log_level(text: str) -> int:
    """``--log-level`` in any case (``debug``, ``INFO``, ``Warning``); anything else is refused."""
    level = LOG_LEVELS.get(text.strip().lower())
    if level is None:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; choose one of debug, info, warning, error, critical")
    return level


def plain_text(doc: str) -> str:
    """A module docstring as terminal text: reStructuredText literals, roles and table rules removed."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"^[ \t]*=+([ \t]+=+)*[ \t]*\n", "", text, flags=re.M)
    return text.strip()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and shows every flag's default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default in ("", argparse.SUPPRESS)
                or not action.option_strings or action.nargs == 0):
            return text
        shown = logging.getLevelName(default).lower() if action.dest == "log_level" else "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def parser(prog: str, doc: str | None, *, silent: bool = True) -> argparse.ArgumentParser:
    """An ArgumentParser with ``-v/--version``, ``--log-level`` and (TVM's) ``--silent``."""
    from . import __version__

    p = argparse.ArgumentParser(prog=prog, description=plain_text(doc or ""), formatter_class=HelpFormatter)
    p.add_argument("-v", "--version", action="version", version=f"%(prog)s (kernelrpc {__version__})")
    p.add_argument("--log-level", type=log_level, default=logging.INFO, metavar="LEVEL",
                   help="debug, info, warning, error or critical, in any case")
    if silent:
        p.add_argument("--silent", action="store_true",
                       help="log warnings and errors only, as TVM's --silent (same as --log-level warning)")
    return p


def setup_logging(args: argparse.Namespace) -> None:
    """One format for every service, on stderr; ``args`` comes from a :func:`parser`."""
    level = logging.WARNING if getattr(args, "silent", False) else args.log_level
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)


def warn_ignored(flag: str, why: str) -> None:
    """A TVM flag that is accepted but cannot apply here, said once at start-up."""
    log.warning("%s has no effect: %s", flag, why)


def add_host(p: argparse.ArgumentParser, default: str = "127.0.0.1") -> None:
    """``--host``, the address a service binds."""
    p.add_argument("--host", default=default, help="address to bind; 0.0.0.0 for every interface")


def add_port_range(p: argparse.ArgumentParser, port: int, role: str, end: int | None = None) -> None:
    """``--port`` and TVM's ``--port-end`` for a service whose address others type in.

    TVM's services silently take the next free port when ``--port`` is taken, so the next
    command in a recipe reaches whatever holds the port.  Here ``--port`` is exact unless
    ``--port-end`` asks for a range; :func:`port_end` turns the pair into a range.  A service
    that others find through a tracker or proxy (the device server) may default to a range
    (``end``), as TVM's does.
    """
    if end is None:
        p.add_argument("--port", type=int, default=port,
                       help=f"port to listen on; 0 lets the OS choose. A taken port is an error, so {role} "
                            "never silently moves")
        p.add_argument("--port-end", type=int, default=None,
                       help="take the first free port in [--port, --port-end) instead, as TVM's tools "
                            "do (the ready line says which)")
    else:
        p.add_argument("--port", type=int, default=port, help="first port to try; 0 lets the OS choose")
        p.add_argument("--port-end", type=int, default=end, help="end of the port range (exclusive)")


def add_numbers(p: argparse.ArgumentParser, rows) -> None:
    """Flags that take one number each, from ``(flag, type, default, help)`` rows (limits and
    timeouts: a service has a dozen, and a table reads better than a dozen calls)."""
    for flag, kind, default, text in rows:
        p.add_argument(flag, type=kind, default=default, help=text)


def port_end(args: argparse.Namespace) -> int:
    """The exclusive end of the ports to try: just ``--port`` unless ``--port-end`` was given."""
    return args.port + 1 if args.port_end is None else args.port_end


def bind_failure(exc: OSError, args: argparse.Namespace) -> str:
    """The message for a service that could not bind its ``--port``."""
    if args.port_end is None and exc.errno in (errno.EADDRINUSE, errno.EACCES):
        return (f"cannot listen on {args.host}:{args.port}: {os.strerror(exc.errno)}. Choose another "
                f"--port, or pass --port-end to take the first free port in a range")
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {args.host}:{args.port}: {args.host!r} is not an address of this host ({exc.strerror})"
    return str(exc)


def add_auth_flags(p: argparse.ArgumentParser) -> None:
    """``--auth-token-file`` and ``--require-auth``, the same on every service."""
    p.add_argument("--auth-token-file", default=None, metavar="PATH",
                   help="require every peer to prove it knows the token in this file (HMAC "
                        "challenge-response; the token never crosses the wire). Also read from "
                        "$KERNELRPC_AUTH_TOKEN or $KERNELRPC_AUTH_TOKEN_FILE")
    p.add_argument("--require-auth", action="store_true",
                   help="refuse to start without an auth token (instead of warning when the "
                        "address is reachable from other hosts)")


def add_security_flags(p: argparse.ArgumentParser) -> None:
    """The authentication and TLS flags of a service (:func:`add_auth_flags`, :func:`add_tls_flags`)."""
    add_auth_flags(p)
    add_tls_flags(p)


def security(args: argparse.Namespace, service: str, host: str, exposes: str, *, accepts: bool = True):
    """``(auth_token, tls_config)`` of a service from :func:`add_security_flags`'s flags (see
    :func:`auth_token` and :func:`tls_config`); a service that ``accepts`` TLS connections
    must be able to load its certificate, or it does not start."""
    from .wire.tls import TLSConfigError

    tls = tls_config(args, service)
    if tls is not None and accepts:
        try:
            tls.server_context()
        except TLSConfigError as exc:
            raise SystemExit(f"{service}: {exc} (--tls-cert)") from None
    mutual = tls is not None and tls.require_client_cert
    return auth_token(args, service, host, exposes, warn=not mutual), tls


def add_tls_flags(p: argparse.ArgumentParser, *, accepts: bool = True) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` (and ``--tls-require-client-cert`` for a
    service that ``accepts`` connections), the same on every entry point."""
    p.add_argument("--tls-ca", default=None, metavar="PATH",
                   help="CA bundle peers' certificates must chain to; turns TLS on for every "
                        "connection this process makes (also $KERNELRPC_TLS_CA)")
    p.add_argument("--tls-cert", default=None, metavar="PATH",
                   help="this process's certificate chain (PEM): presented to connecting peers, "
                        "and as the client certificate of mutual TLS (also $KERNELRPC_TLS_CERT)")
    p.add_argument("--tls-key", default=None, metavar="PATH",
                   help="the private key of --tls-cert, when not in the same file (also $KERNELRPC_TLS_KEY)")
    if accepts:
        p.add_argument("--tls-require-client-cert", action="store_true",
                       help="mutual TLS: refuse peers without a certificate signed by --tls-ca")


def tls_config(args: argparse.Namespace, service: str):
    """The process's :class:`~kernelrpc.wire.tls.TLSConfig` from its flags or the environment
    (None: TLS off); a configuration that cannot work stops start-up with a message."""
    from .wire.tls import TLSConfig, TLSConfigError

    try:
        if args.tls_ca or args.tls_cert or args.tls_key:
            return TLSConfig(cafile=args.tls_ca, certfile=args.tls_cert, keyfile=args.tls_key,
                             require_client_cert=getattr(args, "tls_require_client_cert", False))
        if getattr(args, "tls_require_client_cert", False):
            raise TLSConfigError("--tls-require-client-cert needs --tls-ca and --tls-cert")
        return TLSConfig.from_env()
    except TLSConfigError as exc:
        raise SystemExit(f"{service}: {exc}") from None


def host_port(text: str) -> tuple[str, int]:
    """The argparse type of a HOST:PORT flag (``--tracker``): see ``netutil.parse_host_port``."""
    from .netutil import parse_host_port

    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to --host) is reachable from this machine only."""
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def auth_token(args: argparse.Namespace, service: str, host: str, exposes: str, *,
               warn: bool = True) -> bytes | None:
    """The service's auth token from its flags or the environment, after the start-up checks.

    Without a token, ``--require-auth`` is an error and a non-loopback ``host`` a warning that
    says what is exposed (``exposes``) and how to turn authentication on (unless ``warn`` is
    False: mutual TLS already admits only peers with a certificate from the lab's CA).
    """
    from .wire.auth import ENV_TOKEN, resolve_token

    try:
        token = resolve_token(None, args.auth_token_file)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{service}: --auth-token-file: {exc}") from None
    if token is None:
        how = (f"pass --auth-token-file PATH (or set {ENV_TOKEN}) here and give clients the same "
               "token")
        if args.require_auth:
            raise SystemExit(f"{service}: --require-auth but no auth token: {how}")
        if warn and not is_loopback(host):
            log.warning("%s listens on %s without authentication: anyone who can reach it %s. To "
                        "turn authentication on, %s", service, host, exposes, how)
    return token


# ---------------------------------------------------------------- what a command says at the end

DEBUG_HINT = "--log-level debug shows the traceback"


def run_main(prog: str, main, argv=None) -> int:
    """``main(argv)`` of a command, with its errors as one line on stderr.

    An exception that escapes ``main`` is printed as ``PROG: error: MESSAGE (TYPE); --log-level
    debug shows the traceback`` (the message's first line) and the exit status is 1; with
    ``--log-level debug`` (the root logger at DEBUG once ``main`` set up logging) it propagates
    with its traceback. Ctrl-C is ``PROG: interrupted`` and 130. ``SystemExit`` (argparse, the
    start-up checks) passes as it is. The commands run it from their ``__main__``; a command
    written later (``python -m kernelrpc.model``) does the same.
    """
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - the top of a command: reported, never swallowed
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        print(error_line(prog, exc), file=sys.stderr, flush=True)
        return 1


def error_line(prog: str, exc: BaseException) -> str:
    """``PROG: error: MESSAGE (TYPE); --log-level debug shows the traceback``, one line: a
    message of several lines gives its first and its last (a service that did not start says
    why in its last line of output)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    message = lines[0] if lines else type(exc).__name__
    if len(lines) > 2:
        hidden = len(lines) - 2
        message += f" [{hidden} more line{'s' if hidden > 1 else ''}] {lines[-1]}"
    elif len(lines) == 2:
        message += f" {lines[-1]}"
    return f"{prog}: error: {message} ({type(exc).__name__}); {DEBUG_HINT}"


def rerun_command(module: str, args) -> str:
    """The shell command that runs ``python -m MODULE ARGS...`` again (quoted for a shell)."""
    return shlex.join(["python", "-m", *module.split(" "), *map(str, args)])


def report_output(prog: str, where: str, module: str, args) -> str:
    """Print (and return) the one line a command ends with: where its output went and the
    command that measures again, ``PROG: WHERE; rerun: python -m MODULE ARGS``."""
    line = f"{prog}: {where}; rerun: {rerun_command(module, args)}"
    print(line, flush=True)
    return line
