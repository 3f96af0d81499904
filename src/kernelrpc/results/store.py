"""The results database: one SQLite file, one row per run and board.

Standard library only, and nothing else of kernelrpc but :func:`default_path`: the model command writes it, ``python -m
kernelrpc.results`` and the tracker's status page read it. Every writer takes SQLite's write
lock for its one insert (``BEGIN IMMEDIATE``, waiting up to ``BUSY_TIMEOUT_S``), so several
commands may write one file at once. The file says what it is in its ``meta`` table
(``schema``, ``version``): a file that is not SQLite, or is SQLite of something else, or of a
newer version than this reads, is refused with :class:`ResultsError` saying which.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path

SCHEMA = "kernelrpc.results"
VERSION = 1
BUSY_TIMEOUT_S = 30.0
MAX_TEXT = 1024
MAX_JSON = 64 << 10
MAX_ROWS = 100_000

# column -> SQL type. ``facts`` and ``state`` are JSON objects, ``flags`` a JSON list of strings.
COLUMNS = {
    "run": "TEXT", "recorded": "REAL", "model": "TEXT", "model_hash": "TEXT", "build_hash": "TEXT",
    "target": "TEXT", "key": "TEXT", "board": "TEXT", "machine": "TEXT", "cpu_model": "TEXT",
    "cpus": "INTEGER", "emulated": "INTEGER", "p50": "REAL", "p90": "REAL", "p99": "REAL",
    "runs": "INTEGER", "peak_rss_bytes": "INTEGER", "max_relative_error": "REAL",
    "flags": "TEXT", "facts": "TEXT", "state": "TEXT",
}
_JSON_COLUMNS = {"flags": list, "facts": dict, "state": dict}
_REQUIRED = ("run", "recorded", "model_hash", "build_hash", "board", "p50")


class ResultsError(Exception):
    """The database cannot be used (not one, another program's, too new) or a row is invalid."""


def default_path() -> Path:
    """``results.sqlite`` in kernelrpc's cache (``deploy.toolchain.cache_dir``:
    ``$KERNELRPC_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernelrpc``, else ``~/.cache/kernelrpc``)."""
    from ..deploy.toolchain import cache_dir

    return cache_dir() / "results.sqlite"


def _connect(path: Path, readonly: bool, busy_timeout: float) -> sqlite3.Connection:
    if readonly:
        if not path.is_file():
            raise ResultsError(f"no results database at {path}")
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=busy_timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    return sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None)


def open_db(path: str | os.PathLike, *, readonly: bool = False,
            busy_timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """A connection to the results database at ``path``; created (when not ``readonly``) if the
    file is missing or empty. ``busy_timeout``: how long to wait for another writer's lock."""
    path = Path(path)
    conn = _connect(path, readonly, busy_timeout)
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables and not readonly:
            _create(conn)
        else:
            _check(conn, tables, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise ResultsError(f"{path} is not a kernelrpc results database: {exc}") from None
    except ResultsError:
        conn.close()
        raise
    return conn


def _create(conn: sqlite3.Connection) -> None:
    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone():
            conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", SCHEMA), ("version", str(VERSION))])
            conn.execute(f"CREATE TABLE runs (id INTEGER PRIMARY KEY, {columns})")
            conn.execute("CREATE INDEX runs_by_pair ON runs (model_hash, board, recorded)")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _check(conn: sqlite3.Connection, tables: set, path: Path) -> None:
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall()) if "meta" in tables else {}
    if meta.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is an SQLite database of something else (tables: "
                           f"{', '.join(sorted(tables))[:200]}), not kernelrpc's results")
    version = meta.get("version", "")
    if not version.isdigit() or int(version) > VERSION:
        raise ResultsError(f"{path} has results schema version {version[:20]!r}; this kernelrpc "
                           f"reads versions up to {VERSION} (upgrade kernelrpc)")
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    missing = set(COLUMNS) - have
    if missing:
        raise ResultsError(f"{path}: its runs table lacks {', '.join(sorted(missing))}")


def _bounded(name: str, value):
    """``value`` checked for column ``name`` (ResultsError says what is wrong), as stored."""
    kind = COLUMNS[name]
    if value is None:
        if name in _REQUIRED:
            raise ResultsError(f"result field {name!r} is missing")
        return None
    if name in _JSON_COLUMNS:
        if type(value) is not _JSON_COLUMNS[name]:
            raise ResultsError(f"result field {name!r} must be a JSON {_JSON_COLUMNS[name].__name__}")
        text = json.dumps(value, sort_keys=True, allow_nan=False, default=str)
        if len(text) > MAX_JSON:
            raise ResultsError(f"result field {name!r} is {len(text)} bytes of JSON; the bound is {MAX_JSON}")
        return text
    if kind == "TEXT":
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ResultsError(f"result field {name!r} must be text of at most {MAX_TEXT} characters")
        return value
    if kind == "INTEGER":
        if isinstance(value, bool):
            return int(value)
        if not isinstance(value, int) or not 0 <= value < 1 << 62:
            raise ResultsError(f"result field {name!r} must be an integer >= 0, got {value!r:.40}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ResultsError(f"result field {name!r} must be a finite number >= 0, got {value!r:.40}")
    return float(value)


def insert(conn: sqlite3.Connection, row: dict) -> int:
    """Store one run on one board; ``row`` has :data:`COLUMNS` keys (``recorded`` defaults to
    now). Returns the row's id."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ResultsError(f"unknown result fields: {', '.join(sorted(unknown))}")
    row = {"recorded": time.time(), **row}
    values = [_bounded(name, row.get(name)) for name in COLUMNS]
    conn.execute("BEGIN IMMEDIATE")
    try:
        cursor = conn.execute(f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(COLUMNS))})", values)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return cursor.lastrowid


def _decoded(raw: sqlite3.Row) -> dict:
    row = {"id": raw["id"]}
    for name in COLUMNS:
        value = raw[name]
        if name in _JSON_COLUMNS and value is not None:
            try:
                value = json.loads(value) if isinstance(value, str) and len(value) <= MAX_JSON else None
            except ValueError:
                value = None
            if type(value) is not _JSON_COLUMNS[name]:
                raise ResultsError(f"row {raw['id']}: field {name!r} is not a JSON "
                                   f"{_JSON_COLUMNS[name].__name__}")
        else:
            try:
                value = None if value is None else _bounded(name, value)
            except ResultsError as exc:
                raise ResultsError(f"row {raw['id']}: {exc}") from None
        row[name] = value
    return row


def rows(conn: sqlite3.Connection, *, model: str | None = None, board: str | None = None,
         limit: int = 1000) -> list[dict]:
    """The newest ``limit`` rows (oldest first), of one model (name or hash prefix) and board
    when given; each checked as :func:`insert` checks it."""
    if not 1 <= limit <= MAX_ROWS:
        raise ResultsError(f"limit must be in [1, {MAX_ROWS}], got {limit}")
    where, params = [], []
    if model:
        where.append("(model = ? OR model_hash LIKE ?)")
        params += [model, model.replace("%", "").replace("_", "") + "%"]
    if board:
        where.append("board = ?")
        params.append(board)
    sql = (f"SELECT * FROM runs {'WHERE ' + ' AND '.join(where) if where else ''} "
           "ORDER BY recorded DESC, id DESC LIMIT ?")
    conn.row_factory = sqlite3.Row
    try:
        found = conn.execute(sql, [*params, limit]).fetchall()
    except sqlite3.DatabaseError as exc:
        raise ResultsError(f"cannot read the results: {exc}") from None
    finally:
        conn.row_factory = None
    return [_decoded(raw) for raw in reversed(found)]


def latest_per_board(conn: sqlite3.Connection, limit: int = 1000) -> list[dict]:
    """Each board's newest row, at most ``limit`` boards (the tracker's status page)."""
    if not 1 <= limit <= MAX_ROWS:
        raise ResultsError(f"limit must be in [1, {MAX_ROWS}], got {limit}")
    conn.row_factory = sqlite3.Row
    try:
        found = conn.execute("SELECT * FROM runs WHERE id IN (SELECT id FROM (SELECT id, ROW_NUMBER() "
                             "OVER (PARTITION BY board ORDER BY recorded DESC, id DESC) AS n FROM runs) "
                             "WHERE n = 1) ORDER BY board LIMIT ?", [limit]).fetchall()
    except sqlite3.DatabaseError as exc:
        raise ResultsError(f"cannot read the results: {exc}") from None
    finally:
        conn.row_factory = None
    return [_decoded(raw) for raw in found]
