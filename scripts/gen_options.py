#!/usr/bin/env python3
"""Writes the host option list of docs/protocol.md from the option table.

The table is toolhost/host/include/machina/host_options.def, as the installed
machina_dispatch._core reports it (host_option_table()); the command line's flags and
Host()'s keyword arguments are made from the same rows. The list lies between the two
marker lines below; everything else in the file is left as it is.

    python scripts/gen_options.py          # rewrite the block
    python scripts/gen_options.py --check  # exit 1 if the block differs from the table
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
BEGIN = "<!-- BEGIN host options: made by scripts/gen_options.py from host_options.def -->"
END = "<!-- END host options -->"


def number(value: int) -> str:
    """2^N for the powers of two from 2^10, else the digits."""
    if value >= 1024 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


def value_range(row: dict[str, Any]) -> str:
    if row["choices"]:
        return " \\| ".join(f"`{c}`" for c in row["choices"])
    if row["min"] is None:
        return ""
    text = f"{number(row['min'])} – {number(row['max'])}"
    return f"0 (none) or {text}" if row["kind"] == "limit" else text


def default(row: dict[str, Any]) -> str:
    kind, value = row["kind"], row["default"]
    if kind == "per_worker":
        return f"`--workers` (Python: {value})"
    if kind == "limit":
        return "none"
    if kind == "mebibytes":
        return f"{value} MiB"
    if kind == "flag":
        return "off"
    if kind in ("names", "timeouts"):
        return "none"
    if kind == "choice":
        return f"`{value}`"
    if isinstance(value, str):
        return f"`{value}`" if value else ""
    return str(value)


def flag(row: dict[str, Any]) -> str:
    if not row["flag"]:
        return ""
    shape = {"timeouts": " AID=MS", "names": " NAME", "path": " FILE", "flag": ""}.get(row["kind"], " N")
    if row["kind"] == "choice":
        shape = " " + "\\|".join(row["choices"])
    return f"`{row['flag']}{shape}`"


def keyword(row: dict[str, Any]) -> str:
    return f"`{row['name']}: {row['type']}`" if row["keyword"] else ""


def render(table: list[dict[str, Any]]) -> str:
    lines = [
        BEGIN,
        "",
        "| flag | Python keyword | range | default | environment | what it sets |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        env = f"`{row['env']}`" if row["env"] else ""
        help_text = row["help"].replace("|", "\\|")
        lines.append(f"| {flag(row)} | {keyword(row)} | {value_range(row)} | {default(row)} | {env} | {help_text} |")
    lines += ["", END]
    return "\n".join(lines)


def current_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{DOC}: the markers of the host option list are missing")
    return text[start:end + len(END)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the block differs")
    args = parser.parse_args()
    from machina_dispatch import _core

    text = DOC.read_text(encoding="utf-8")
    block, wanted = current_block(text), render(_core.host_option_table())
    if block == wanted:
        return 0
    if args.check:
        print(f"{DOC.relative_to(ROOT)}: the host option list differs from the table; "
              "run python scripts/gen_options.py", file=sys.stderr)
        return 1
    DOC.write_text(text.replace(block, wanted), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
