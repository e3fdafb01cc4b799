"""A run's report for people: an HTML page with SVG plots, from the metrics document.

Plain SVG keeps the report free of a plotting dependency and byte-identical for the same
run (no timestamps, no fonts embedded). The caller writes the files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["line_chart", "render_html"]

_SVG = "http://www.w3.org/2000/svg"
_W, _H, _PAD = 640, 300, 48
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _scale(lo: float, hi: float, size: float) -> tuple[float, float]:
    span = (hi - lo) or 1.0
    return lo, size / span


def line_chart(
    series: dict[str, Sequence[Sequence[float]]], *, title: str, x_label: str, y_label: str
) -> str:
    """An SVG line chart of ``{name: [[x, y], ...]}``."""
    points = [p for line in series.values() for p in line]
    if not points:
        return (
            f'<svg xmlns="{_SVG}" width="{_W}" height="40">'
            f'<text x="8" y="24">{html.escape(title)}: no data</text></svg>'
        )
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, xk = _scale(min(xs), max(xs), _W - 2 * _PAD)
    y_lo = min(ys) - (max(ys) - min(ys)) / 10  # a baseline near the data shows its moves
    y0, yk = _scale(y_lo, max(ys), _H - 2 * _PAD)

    def at(x: float, y: float) -> str:
        return f"{_PAD + (x - x0) * xk:.1f},{_H - _PAD - (y - y0) * yk:.1f}"

    parts = [
        f'<svg xmlns="{_SVG}" width="{_W}" height="{_H}" font-family="sans-serif" font-size="11">',
        f'<text x="{_W / 2}" y="16" text-anchor="middle" font-size="13">'
        f"{html.escape(title)}</text>",
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#000"/>',
        f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#000"/>',
        f'<text x="{_W / 2}" y="{_H - 12}" text-anchor="middle">{html.escape(x_label)}</text>',
        f'<text x="12" y="{_H / 2}" transform="rotate(-90 12 {_H / 2})" text-anchor="middle">'
        f"{html.escape(y_label)}</text>",
        f'<text x="{_PAD - 4}" y="{_PAD + 4}" text-anchor="end">{max(ys):g}</text>',
        f'<text x="{_PAD - 4}" y="{_H - _PAD}" text-anchor="end">{y_lo:.0f}</text>',
        f'<text x="{_PAD}" y="{_H - _PAD + 14}">{min(xs):g}</text>',
        f'<text x="{_W - _PAD}" y="{_H - _PAD + 14}" text-anchor="end">{max(xs):g}</text>',
    ]
    for i, (name, line) in enumerate(sorted(series.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        path = " ".join(at(x, y) for x, y in line)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>'
        )
        parts.append(
            f'<text x="{_W - _PAD}" y="{_PAD + 14 * i}" text-anchor="end" fill="{colour}">'
            f"{html.escape(name)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def price_chart(doc: dict[str, Any]) -> str:
    return line_chart(
        doc["price_path"],
        title=f"{doc['scenario']}: median agreed CPU price per job class",
        x_label="simulated minute",
        y_label="micro-credits per core-hour",
    )


def render_html(doc: dict[str, Any]) -> str:
    """The report page: headline figures, the price plot, adversaries, the full JSON."""
    jobs = doc["jobs"]
    traffic = doc["traffic"]
    rows = [
        ("nodes", f"{doc['nodes']} ({doc['providers']} providers, {doc['buyers']} honest buyers)"),
        ("simulated", f"{doc['minutes']:g} minutes, topics {doc['topics']}, seed {doc['seed']}"),
        (
            "jobs",
            f"{jobs['submitted']} submitted, {jobs['matched']} matched, {jobs['settled']} settled",
        ),
        ("match rate", str(doc["match_rate"])),
        (
            "time to match",
            f"p50 {doc['time_to_match_ms']['p50']} ms, p99 {doc['time_to_match_ms']['p99']} ms",
        ),
        ("fairness (Jain)", str(doc["fairness"])),
        ("work per credit", f"{doc['work_per_credit']} core-hours"),
        (
            "gossip",
            f"{traffic['gossip_deliveries']} deliveries, {traffic['admissions']} admissions",
        ),
        ("per node", f"{traffic['per_node']['gossip_bytes']['mean']} bytes received (mean)"),
        (
            "invariants",
            "ok" if doc["invariants"]["ok"] else "; ".join(doc["invariants"]["problems"]),
        ),
        ("digest", doc["digest"]),
    ]
    table = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows
    )
    adversaries = "\n".join(
        f"<tr><th>{html.escape(kind)}</th>"
        f"<td><code>{html.escape(json.dumps(score, sort_keys=True))}</code></td></tr>"
        for kind, score in sorted(doc["adversaries"].items())
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>cx sim: {html.escape(doc["scenario"])}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
th{{text-align:left;padding-right:1em}}</style>
</head><body>
<h1>cx sim: {html.escape(doc["scenario"])}</h1>
<table>{table}</table>
<h2>Prices</h2>
{price_chart(doc)}
<h2>Adversaries</h2>
<table>{adversaries or "<tr><td>none</td></tr>"}</table>
<h2>Metrics</h2>
<pre>{html.escape(json.dumps(doc, indent=2, sort_keys=True))}</pre>
</body></html>
"""
