"""An incident's evidence as pictures (pure): the affected pairs as a src x dst heat map of loss,
and the culprit's loss over the windows that named it as a small line chart. SVG strings."""

from __future__ import annotations

from html import escape

CELL = 14
LABEL_W = 8  # px per character of a NIC name


def _color(loss: float) -> str:
    """Green at 0, through yellow, to red at 20 % and beyond (what an operator sees at a glance)."""
    x = max(0.0, min(1.0, loss / 0.2))
    return f"hsl({round(120 * (1 - x))}, 70%, {round(45 + 10 * (1 - x))}%)"


def heatmap_svg(pairs: list[dict], title: str) -> str:
    """Rows: sources, columns: destinations; a cell per measured pair, colored by its loss."""
    if not pairs:
        return ""
    srcs = sorted({p["src"] for p in pairs})
    dsts = sorted({p["dst"] for p in pairs})
    left = max(len(s) for s in srcs) * LABEL_W + 8
    top = max(len(d) for d in dsts) * LABEL_W // 1.4 + 12
    width, height = left + CELL * len(dsts) + 4, int(top) + CELL * len(srcs) + 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" id="heatmap" role="img" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}"><title>{escape(title)}</title>']
    for i, s in enumerate(srcs):
        parts.append(f'<text x="{left - 4}" y="{int(top) + CELL * i + CELL - 3}" text-anchor="end" '
                     f'class="label">{escape(s)}</text>')
    for j, d in enumerate(dsts):
        x = left + CELL * j + CELL // 2
        parts.append(f'<text transform="translate({x},{int(top) - 4}) rotate(-45)" class="label">{escape(d)}</text>')
    col, row = {d: j for j, d in enumerate(dsts)}, {s: i for i, s in enumerate(srcs)}
    for p in pairs:
        loss = p.get("loss", 0.0)
        delay = f", p99 {p['p99_us']:.0f} µs" if "p99_us" in p else ""
        parts.append(f'<rect class="cell" data-src="{escape(p["src"])}" data-dst="{escape(p["dst"])}" '
                     f'data-loss="{loss}" x="{left + CELL * col[p["dst"]]}" y="{int(top) + CELL * row[p["src"]]}" '
                     f'width="{CELL - 1}" height="{CELL - 1}" fill="{_color(loss)}"><title>{escape(p["src"])} → '
                     f'{escape(p["dst"])}: {loss:.1%} lost{delay}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(points: list[tuple[float, float]], title: str, width: int = 480, height: int = 80) -> str:
    """(seconds since the first point, loss rate) as a line; empty without two points."""
    if len(points) < 2:
        return ""
    t_max = max(t for t, _ in points) or 1.0
    y_max = max(0.01, max(v for _, v in points))
    xy = " ".join(f"{4 + (width - 8) * t / t_max:.1f},{height - 4 - (height - 8) * v / y_max:.1f}"
                  for t, v in points)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" id="loss-timeline" role="img" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
            f'<polyline fill="none" stroke="currentColor" stroke-width="2" points="{xy}"/></svg>')
