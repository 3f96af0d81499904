"""The tracker's status page: ``/`` (a live page), ``/api/status`` (JSON) and ``/metrics``
(Prometheus' text format), served by tornado on the tracker's own asyncio loop.

Everything is read from the tracker's state when asked for, so the matching path does no extra
work for it. tornado and prometheus_client are the ``web`` extra: the project's design picks
tornado for HTTP on asyncio, and prometheus_client writes the exposition format (escaping, types,
HELP lines) that is easy to get subtly wrong by hand.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import logging
import time

log = logging.getLogger(__name__)

EXTRA = "web"
MAX_ROWS = 500
"""Rows per table in /api/status (servers, waiting requests, sessions)."""
ARCH_FIELDS = ("machine", "arch")
"""Fields of the ``"device"`` record in a server's UPDATE_INFO that name its architecture."""


def require_web_extra() -> None:
    """Raise ImportError with the install hint when tornado or prometheus_client is missing."""
    missing = []
    for module in ("tornado", "prometheus_client"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f"--web-port needs {' and '.join(missing)}: pip install 'kernelrpc[{EXTRA}]'")


REALM = "kernelrpc tracker"


def authorized(header: str | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``token``: HTTP Basic with the token as the
    password (any user name; a browser asks for it), or ``Bearer TOKEN`` (scripts, Prometheus'
    ``authorization`` or ``basic_auth``). Compared in constant time."""
    scheme, _, credentials = (header or "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        given = credentials.encode("utf-8", "replace")
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(credentials, validate=True).partition(b":")[2]
        except (binascii.Error, ValueError):
            return False
    else:
        return False
    return hmac.compare_digest(given, token)


def _server_key(info: dict) -> str:
    key = str(info.get("key", ""))
    return key.split(":", 1)[1] if key.startswith("server:") else key


def _address(pair) -> str:
    try:
        host, port = pair
    except (TypeError, ValueError):
        return str(pair)
    return f"{host}:{port}"


def _arch(device) -> str:
    """The architecture a ``"device"`` record names, or ""."""
    if not isinstance(device, dict):
        return ""
    return next((str(device[f]) for f in ARCH_FIELDS if isinstance(device.get(f), (str, int))), "")


DB_BUSY_TIMEOUT_S = 0.2
"""How long a status request waits for a writer of the results database (it runs on the
tracker's loop): past it, the page says the results are busy and shows them next time."""


def latest_results(db) -> dict:
    """``{"results": [each board's newest run]}`` from the results database at ``db``, or
    ``{"results_error": why}``; {} without one."""
    if db is None:
        return {}
    from ..results import store

    try:
        conn = store.open_db(db, readonly=True, busy_timeout=DB_BUSY_TIMEOUT_S)
        try:
            rows = store.latest_per_board(conn, limit=MAX_ROWS)
        finally:
            conn.close()
    except (store.ResultsError, OSError) as exc:
        return {"results_error": str(exc)[:300]}
    return {"results": [{name: row[name] for name in (
        "board", "key", "model", "target", "p50", "p90", "p99", "peak_rss_bytes", "flags", "recorded")}
        for row in rows]}


def status(service, db=None) -> dict:
    """The tracker's state for people: servers, queues, waiting requests, recent sessions, and
    with ``db`` (a results database) the latest result per board."""
    scheduler = service.scheduler
    name = lambda peer: getattr(peer, "name", "?")  # noqa: E731
    leases = scheduler.lease_info(service.now(), name)
    lease_by_server = {_address(x["server"]): x for x in leases}
    servers = []
    for conn in list(service.connections):
        if not conn.is_server:
            continue
        info = conn.info
        address = _address(info.get("addr"))
        lease = lease_by_server.get(address)
        if lease is not None:
            state, holder = ("in session" if lease["state"] == "session" else "leased"), lease["client"]
        elif scheduler.free_count(conn):
            state, holder = "free", ""
        else:
            state, holder = ("in session" if info.get("session") == "active" else "busy"), ""
        arch = _arch(info.get("device"))
        if not arch and isinstance(info.get("devices"), dict):     # a proxy's boards that differ
            arch = ", ".join(sorted({_arch(d) for ds in info["devices"].values() if isinstance(ds, list)
                                     for d in ds} - {""}))
        servers.append({"key": _server_key(info), "address": address, "state": state, "held_by": holder,
                        "arch": arch[:100], "connection": conn.name})
    servers.sort(key=lambda s: (s["key"], s["address"]))
    waiting = scheduler.wait_info(service.now(), name)
    count = {}
    for s in servers:
        count[s["key"]] = count.get(s["key"], 0) + 1
    stats = scheduler.key_stats()
    queues = []
    for key, q in sorted(scheduler.queue_info().items()):
        st = stats.get(key, {})
        waits = [w["waited"] for w in waiting if w["key"] == key]
        queues.append({"key": key, "servers": count.get(key, 0), "free": q["free"], "waiting": q["pending"],
                       "longest_wait": max(waits, default=0.0), "matches": st.get("matches", 0),
                       "queue_wait_mean": st.get("queue_wait_mean", 0.0),
                       "queue_wait_max": st.get("queue_wait_max", 0.0),
                       "expired_leases": st.get("expired_leases", 0)})
    open_leases = {(_address(x["server"]), x["client"]) for x in leases}
    sessions = []
    for started, match in reversed(list(service.recent_matches)):
        server, client = f"{match.slot.host}:{match.slot.port}", name(match.client)
        sessions.append({"key": match.slot.key, "server": server, "client": client,
                         "started": started, "queue_wait": round(match.queue_wait, 6),
                         "open": (server, client) in open_leases})
    return {"time": time.time(), "uptime": round(service.now() - service.started_at, 3),
            "servers": servers[:MAX_ROWS], "queues": queues[:MAX_ROWS], "waiting": waiting[:MAX_ROWS],
            "sessions": sessions[:MAX_ROWS], **latest_results(db)}


class _Collector:
    """Prometheus metrics computed from the tracker's state at scrape time."""

    def __init__(self, service) -> None:
        self.service = service

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        scheduler = self.service.scheduler
        stats = scheduler.key_stats()
        queues = scheduler.queue_info()
        servers = {}
        for conn in list(self.service.connections):
            if conn.is_server:
                key = _server_key(conn.info)
                servers[key] = servers.get(key, 0) + 1
        connected = GaugeMetricFamily("kernelrpc_tracker_servers", "Device servers connected, per key",
                                      labels=["key"])
        free = GaugeMetricFamily("kernelrpc_tracker_free_slots", "Sessions offered and not handed out",
                                 labels=["key"])
        waiting = GaugeMetricFamily("kernelrpc_tracker_waiting_requests", "Requests waiting for a server",
                                    labels=["key"])
        matches = CounterMetricFamily("kernelrpc_tracker_matches", "Requests matched with a server",
                                      labels=["key"])
        waits = SummaryMetricFamily("kernelrpc_tracker_queue_wait_seconds",
                                    "Time from request to match", labels=["key"])
        wait_max = GaugeMetricFamily("kernelrpc_tracker_queue_wait_max_seconds",
                                     "Longest time from request to match", labels=["key"])
        expiries = CounterMetricFamily("kernelrpc_tracker_lease_expiries",
                                       "Leases whose client never came, returned to the pool", labels=["key"])
        sessions = CounterMetricFamily("kernelrpc_tracker_sessions", "Leases ended by the server's next offer",
                                       labels=["key"])
        for key in sorted(set(queues) | set(servers)):
            st = stats.get(key, {})
            q = queues.get(key, {"free": 0, "pending": 0})
            connected.add_metric([key], servers.get(key, 0))
            free.add_metric([key], q["free"])
            waiting.add_metric([key], q["pending"])
            n = st.get("matches", 0)
            matches.add_metric([key], n)
            waits.add_metric([key], n, st.get("queue_wait_mean", 0.0) * n)
            wait_max.add_metric([key], st.get("queue_wait_max", 0.0))
            expiries.add_metric([key], st.get("expired_leases", 0))
            sessions.add_metric([key], st.get("sessions", 0))
        return [connected, free, waiting, matches, waits, wait_max, expiries, sessions]


def make_app(service, db=None):
    """The tornado application of the status page for ``service`` (a TrackerService); with
    ``db``, the page shows the latest result per board from that results database."""
    import tornado.web
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(service))

    token = service.auth_token

    class Handler(tornado.web.RequestHandler):
        def prepare(self):
            if token is not None and not authorized(self.request.headers.get("Authorization"), token):
                self.set_status(401)
                self.add_header("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')
                self.add_header("WWW-Authenticate", f'Bearer realm="{REALM}"')
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                self.finish("this tracker requires its auth token: HTTP Basic with the token as the "
                            "password (any user name), or 'Authorization: Bearer TOKEN'\n")

    class PageHandler(Handler):
        def get(self):
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            "connect-src 'self'")
            self.write(PAGE)

    class StatusHandler(Handler):
        def get(self):
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(json.dumps(status(service, db)))

    class MetricsHandler(Handler):
        def get(self):
            self.set_header("Content-Type", CONTENT_TYPE_LATEST)
            self.write(generate_latest(registry))

    return tornado.web.Application([(r"/", PageHandler), (r"/api/status", StatusHandler),
                                    (r"/metrics", MetricsHandler)])


def start(service, host: str, port: int, tls=None, db=None):
    """Serve the status page on ``host:port`` (0: the OS chooses) on the running loop, over
    HTTPS when ``tls`` (a ``kernelrpc.wire.tls.TLSConfig``, the tracker's own) is given; with the
    tracker's auth token, every path requires it; with ``db``, the latest result per board from
    that results database. Returns ``(http_server, (host, port))``."""
    require_web_extra()
    import tornado.httpserver
    import tornado.netutil

    try:
        sockets = tornado.netutil.bind_sockets(port, host)
    except OSError as exc:
        raise OSError(exc.errno, f"--web-port {port} on {host}: {exc.strerror or exc}") from None
    server = tornado.httpserver.HTTPServer(make_app(service, db), max_header_size=16 * 1024,
                                           max_body_size=1024, idle_connection_timeout=60,
                                           ssl_options=tls.server_context() if tls is not None else None)
    server.add_sockets(sockets)
    bound = sockets[0].getsockname()
    if tls is None and not all(_loopback(s.getsockname()[0]) for s in sockets):
        _warn_exposed(bound[0], bound[1], service.auth_token is not None)
    return server, (bound[0], bound[1])


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _warn_exposed(host: str, port: int, with_token: bool) -> None:
    if with_token:
        log.warning("the status page on %s:%s is plain HTTP on an address other than loopback: "
                    "browsers and scrapers send the tracker's auth token in clear text, so anyone on "
                    "the path can read it and then use the tracker; give the tracker TLS, or bind "
                    "--web-host 127.0.0.1 and reach it through an SSH tunnel", host, port)
    else:
        log.warning("the status page on %s:%s has no authentication and is reachable beyond this "
                    "machine: anyone who can reach it sees every key, server and client; start the "
                    "tracker with --auth-token-file, or bind --web-host 127.0.0.1", host, port)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kernelrpc tracker</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
table { border-collapse: collapse; min-width: 40em; }
th, td { text-align: left; padding: 3px 10px; border-bottom: 1px solid #ddd; }
th { background: #f3f3f3; } td.free { color: #080; } td.leased, td.in-session { color: #a60; }
td.busy { color: #888; } .empty { color: #888; font-style: italic; }
#updated { color: #666; font-size: 0.9em; } #updated.stale { color: #c00; }
</style></head>
<body>
<h1>kernelrpc tracker</h1>
<div id="updated">loading...</div>
<h2>Servers</h2>
<table id="servers"><thead><tr><th>key</th><th>address</th><th>architecture</th><th>state</th>
<th>held by</th></tr></thead><tbody></tbody></table>
<h2>Queues</h2>
<table id="queues"><thead><tr><th>key</th><th>servers</th><th>free</th><th>waiting</th>
<th>longest wait</th><th>matches</th><th>mean wait</th><th>lease expiries</th></tr></thead><tbody></tbody></table>
<div id="results-section" hidden>
<h2>Latest result per board</h2>
<div id="results-error" class="empty"></div>
<table id="results"><thead><tr><th>board</th><th>key</th><th>model</th><th>p50</th><th>p90</th><th>p99</th>
<th>peak memory</th><th>recorded</th><th>flags</th></tr></thead><tbody></tbody></table>
</div>
<h2>Waiting requests</h2>
<table id="waiting"><thead><tr><th>key</th><th>client</th><th>priority</th><th>waiting for</th></tr></thead>
<tbody></tbody></table>
<h2>Recent sessions</h2>
<table id="sessions"><thead><tr><th>started</th><th>key</th><th>server</th><th>client</th>
<th>queue wait</th><th>state</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
function secs(s) {
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " \\u00b5s";
  if (s < 1) return (s * 1e3).toFixed(1) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  return (s / 60).toFixed(1) + " min";
}
function fill(id, rows, cells) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  if (!rows.length) {
    const tr = body.insertRow(), td = tr.insertCell();
    td.colSpan = document.querySelectorAll("#" + id + " th").length;
    td.className = "empty"; td.textContent = "none";
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [text, cls] of cells(row)) {
      const td = tr.insertCell();
      td.textContent = String(text);
      if (cls) td.className = cls;
    }
  }
}
async function refresh() {
  const updated = document.getElementById("updated");
  try {
    const url = new URL("api/status", location.href);
    url.username = url.password = "";    // fetch refuses URLs with credentials; the browser adds them
    const response = await fetch(url, {cache: "no-store", credentials: "same-origin"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const st = await response.json();
    fill("servers", st.servers, s => [[s.key], [s.address], [s.arch || "-"],
         [s.state, s.state.replace(" ", "-")], [s.held_by || "-"]]);
    fill("queues", st.queues, q => [[q.key], [q.servers], [q.free], [q.waiting], [secs(q.longest_wait)],
         [q.matches], [secs(q.queue_wait_mean)], [q.expired_leases]]);
    if (st.results || st.results_error) {
      document.getElementById("results-section").hidden = false;
      document.getElementById("results-error").textContent = st.results_error || "";
      fill("results", st.results || [], r => [[r.board], [r.key || "-"], [r.model || "-"], [secs(r.p50)],
           [r.p90 == null ? "-" : secs(r.p90)], [r.p99 == null ? "-" : secs(r.p99)],
           [r.peak_rss_bytes ? (r.peak_rss_bytes / 1e6).toFixed(1) + " MB" : "-"],
           [new Date(r.recorded * 1000).toLocaleString()], [(r.flags || []).join("; ") || "-"]]);
    }
    fill("waiting", st.waiting, w => [[w.key], [w.client], [w.priority], [secs(w.waited)]]);
    fill("sessions", st.sessions, s => [[new Date(s.started * 1000).toLocaleTimeString()], [s.key],
         [s.server], [s.client], [secs(s.queue_wait)], [s.open ? "open" : "ended"]]);
    updated.textContent = "updated " + new Date(st.time * 1000).toLocaleTimeString() +
        " \\u00b7 tracker up " + secs(st.uptime);
    updated.className = "";
  } catch (err) {
    updated.textContent = "cannot reach the tracker: " + err;
    updated.className = "stale";
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body></html>
"""
