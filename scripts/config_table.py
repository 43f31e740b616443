"""The broker configuration table of docs/configuration.md, made from engine.broker.config.BrokerConfig (its fields, defaults and comments).

    python scripts/config_table.py            # print the table
    python scripts/config_table.py --write    # replace the table between docs/configuration.md's markers
    python scripts/config_table.py --check    # exit 1 if docs/configuration.md's table is not the current one (a test runs it)
"""
from __future__ import annotations

import ast
import sys
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.broker.config import PROPERTIES, BrokerConfig, _camel  # noqa: E402

BEGIN, END = "<!-- config-table: begin (scripts/config_table.py --write) -->", "<!-- config-table: end -->"


def _comments() -> dict[str, str]:
    """field name -> its documentation: the ``#:`` lines above it, else its trailing ``#`` comment."""
    source = (ROOT / "engine" / "broker" / "config.py").read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BrokerConfig")
    out = {}
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        text = " ".join(above)
        if not text and "#" in lines[node.lineno - 1]:
            text = lines[node.lineno - 1].split("#", 1)[1].strip()
        out[node.target.id] = text.replace("|", "\\|")
    return out


def _default(f) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        return "(computed)"
    else:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"{value} ({value >> 20} MiB)"
    return str(value) if value != "" else '""'


def table() -> str:
    docs = _comments()
    rows = ["| property | default | what it does |", "|---|---|---|"]
    for f in fields(BrokerConfig):
        name = _camel(f.name)
        if name not in PROPERTIES:
            continue
        rows.append(f"| `{name}` | {_default(f)} | {docs.get(f.name, '')} |")
    return "\n".join(rows)


def main(argv) -> int:
    page = ROOT / "docs" / "configuration.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        print("docs/configuration.md has no config-table markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if "--check" in argv:
        if new != text:
            print("docs/configuration.md's config table is stale: run python scripts/config_table.py --write",
                  file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        page.write_text(new)
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
