"""``index.html``: the report's one page, and the progress page shown while Spark works."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# Columns holding UNIX times: shown as UTC date and time.
TIME_COLUMNS = frozenset({"start", "end", "ts", "bucket_start"})

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
.wide { overflow-x: auto; } table { border-collapse: collapse; font-size: .8em; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.ok { color: #2e7d32; font-weight: bold; } .bad { color: #c62828; font-weight: bold; }
.note { color: #555; font-size: .9em; } img { max-width: 100%; border: 1px solid #eee; margin: .3em 0; }
progress { width: 30em; height: 1.2em; }
"""


@dataclass
class Table:
    title: str
    rows: Sequence[dict[str, Any]]
    columns: Sequence[str]
    note: str = ""
    files: Sequence[str] = ()  # links to the full table (CSV, Parquet)
    limit: int = 200


@dataclass
class Section:
    title: str
    intro: str = ""
    verdict: tuple[bool, str] | None = None  # (healthy, text)
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)  # (src, alt)


def _cell(value: Any, column: str = "") -> str:
    if value is None:
        return ""
    if column in TIME_COLUMNS and isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))


def _table(table: Table) -> str:
    out = [f"<h3>{html.escape(table.title)}</h3>"]
    if table.note:
        out.append(f'<p class="note">{html.escape(table.note)}</p>')
    if not table.rows:
        out.append('<p class="note">(no rows)</p>')
    else:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{_cell(row.get(c), c)}</td>" for c in table.columns) + "</tr>"
            for row in table.rows[: table.limit]
        )
        out.append(f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
        if len(table.rows) > table.limit:
            out.append(
                f'<p class="note">first {table.limit:,} of {len(table.rows):,} rows shown; all in the files below</p>'
            )
    if table.files:
        links = " · ".join(f'<a href="{html.escape(f)}">{html.escape(f)}</a>' for f in table.files)
        out.append(f'<p class="note">full table: {links}</p>')
    return "\n".join(out)


def render_report(title: str, summary: Sequence[tuple[str, str]], sections: Sequence[Section]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<table>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary)
        + "</table>",
    ]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.verdict is not None:
            healthy, text = section.verdict
            parts.append(f'<p class="{"ok" if healthy else "bad"}">{html.escape(text)}</p>')
        if section.intro:
            parts.append(f'<p class="note">{html.escape(section.intro)}</p>')
        # Plots first: what a reader looks at before any table.
        for src, alt in section.images:
            parts.append(f'<img src="{html.escape(src)}" alt="{html.escape(alt)}">')
        parts.extend(_table(t) for t in section.tables)
    parts.append("</body></html>")
    return "\n".join(parts)


def render_progress(title: str, done: int, total: int, step: str, detail: str, log: Sequence[str]) -> str:
    """The page while the report runs: it reloads itself every 2 s until the report
    replaces it."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in log)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">',
            f"<title>{html.escape(title)} (working)</title><style>{_STYLE}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>Spark is working: step {done + 1} of {total}, <b>{html.escape(step)}</b></p>",
            f'<progress value="{done}" max="{total}"></progress>',
            f'<p class="note">{html.escape(detail)}</p>',
            f"<ol>{items}</ol>",
            "</body></html>",
        ]
    )
