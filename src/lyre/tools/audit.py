"""``lyre audit export|prune``: read Lyre's audit trail back for an investigation, or prune it now.

    lyre audit export --since 2026-11-01 [--until DATE] [--voice ID] [--account A]
                      [--format csv|jsonl] [--output FILE] [--config FILE] [--set k=v]
    lyre audit prune
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime, timezone

from lyre.config import AuditConfig, ConfigError, add_config_arguments, config_from_args
from lyre.errors import DatabaseError
from lyre.storage.db import database_url, open_database
from lyre.trust.audit import COLUMNS, AuditTrail, rows


def _date(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD or an ISO 8601 time)") from None
    return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)


def main(argv: list[str] | None = None, prog: str = "lyre audit") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Read Lyre's audit trail.")
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="write audit rows as CSV or JSON lines, for an investigation")
    export.add_argument("--since", type=_date, required=True, help="first day or time (UTC unless given), inclusive")
    export.add_argument("--until", type=_date, help="end day or time, exclusive (default: now)")
    export.add_argument("--voice", help="only this voice (a built-in name or a cloned voice's id)")
    export.add_argument("--account", help="only this account")
    export.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    export.add_argument("--output", help="file to write (default: standard output)")
    add_config_arguments(export)
    prune = sub.add_parser("prune", help="delete rows older than audit.retention_days now")
    add_config_arguments(prune)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        engine = open_database(database_url(cfg.voices.database_url, cfg.data_dir))
    except (ConfigError, DatabaseError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.command == "prune":
        trail = AuditTrail(engine, AuditConfig(enabled=False, retention_days=cfg.audit.retention_days))
        print(f"{trail.prune()} rows deleted", file=sys.stderr)
        return 0
    out = open(args.output, "w", newline="") if args.output else sys.stdout  # noqa: SIM115 - closed below
    try:
        n = 0
        writer = csv.DictWriter(out, fieldnames=COLUMNS) if args.format == "csv" else None
        if writer is not None:
            writer.writeheader()
        for row in rows(engine, args.since, args.until, args.voice, args.account):
            if writer is not None:
                writer.writerow(row)
            else:
                out.write(json.dumps(row) + "\n")
            n += 1
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"{n} rows", file=sys.stderr)
    return 0
