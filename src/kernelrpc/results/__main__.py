"""``python -m kernelrpc.results [--db PATH]``: the runs the model command recorded, the boards
side by side (each board's newest run of each model), and regressions: a model on a board
whose newest p50 moved by more than the spread of that pair's earlier runs.

``--json`` prints one JSON document, ``--csv`` the runs as CSV. ``--fail-on-regression`` exits
with status 3 when a regression is found (for CI).

Examples:
    python -m kernelrpc.results
    python -m kernelrpc.results --db farm.sqlite --model resnet18.onnx --json
"""
from __future__ import annotations

import csv
import datetime
import json
import sys
from pathlib import Path

from .. import cli
from . import compare, store

REGRESSION_STATUS = 3
_CSV_COLUMNS = ["id", *store.COLUMNS]


def build_parser():
    p = cli.parser("python -m kernelrpc.results", __doc__, silent=False)
    p.add_argument("--db", type=Path, default=None, metavar="PATH",
                   help="the results database (default: results.sqlite in kernelrpc's cache, "
                        "$XDG_CACHE_HOME/kernelrpc)")
    p.add_argument("--model", default=None, help="only this model (file name, or a prefix of its sha256)")
    p.add_argument("--board", default=None, help="only this board (its address, as listed)")
    p.add_argument("--limit", type=int, default=200, help=f"newest runs read (1 to {store.MAX_ROWS})")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON document")
    out.add_argument("--csv", action="store_true", help="print the runs as CSV")
    p.add_argument("--fail-on-regression", action="store_true",
                   help=f"exit with status {REGRESSION_STATUS} when a regression is found")
    return p


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _text(rows: list[dict], boards: list[dict], found: list[dict]) -> str:
    from ..display import Table

    runs = Table(["id", "recorded", "model", "board", "key", "build", "p50 ms", "p90 ms", "p99 ms",
                  "peak MB", "flags"],
                 [[r["id"], _when(r["recorded"]), r["model"] or r["model_hash"][:12], r["board"], r["key"] or "",
                   r["build_hash"][:12], _ms(r["p50"]), _ms(r["p90"]), _ms(r["p99"]),
                   f"{r['peak_rss_bytes'] / 1e6:.1f}" if r["peak_rss_bytes"] else "-",
                   "; ".join(r["flags"] or ()) or "-"] for r in rows],
                 title=f"{len(rows)} runs:")
    parts = [str(runs)]
    for model in boards:
        parts.append(str(Table(
            ["board", "cpu", "cores", "target", "p50 ms", "p90 ms", "p99 ms", "vs fastest", "flags"],
            [[b["board"], b["cpu_model"] or "", b["cpus"] or "", b["target"] or "", _ms(b["p50"]), _ms(b["p90"]),
              _ms(b["p99"]), f"{b['p50'] / model['boards'][0]['p50']:.2f}x" if model["boards"][0]["p50"] else "-",
              "; ".join(b["flags"] or ()) or "-"] for b in model["boards"]],
            title=f"{model['model'] or model['model_hash'][:12]}: the newest run on each board")))
    if found:
        parts += [f"{f['kind'].upper()}: {f['model']} on {f['board']}: p50 {_ms(f['p50'])} ms against "
                  f"{_ms(f['baseline_p50'])} ms (median of {f['earlier_runs']} earlier runs, spread "
                  f"{_ms(f['spread'])} ms): {f['change']:+.1%}" for f in found]
    else:
        parts.append(f"no regressions (a model on a board needs {compare.MIN_EARLIER + 1} runs to tell)")
    return "\n\n".join(parts)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_logging(args)
    path = args.db or store.default_path()
    conn = store.open_db(path, readonly=True)
    try:
        rows = store.rows(conn, model=args.model, board=args.board, limit=args.limit)
    finally:
        conn.close()
    boards, found = compare.side_by_side(rows), compare.regressions(rows)
    if args.json:
        print(json.dumps({"db": str(path), "runs": rows, "boards": boards, "regressions": found}, indent=2))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, _CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
    else:
        print(_text(rows, boards, found))
    regressed = any(f["kind"] == "regression" for f in found)
    return REGRESSION_STATUS if regressed and args.fail_on_regression else 0


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.results", main)


if __name__ == "__main__":
    sys.exit(command())
