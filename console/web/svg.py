"""The fabric map as SVG markup, from a layout and the current health of each element.

Written in Python rather than in the template: the large fabric has a few thousand elements, and
string formatting is about fifty times faster than the template engine for them. Every element
carries `data-kind` and `data-name` (what live.js recolors and shows details for), a health class,
and a `<title>` (its name, which browsers show on hover and screen readers announce).
"""

from __future__ import annotations

from html import escape

from django.utils.safestring import SafeString, mark_safe

from workers.fabric.layout import LABEL_PX, NIC_R, Layout

KINDS = ("node", "switch", "nic", "link", "bundle")


def _e(value) -> str:
    return escape(str(value), quote=True)


def _n(value: float) -> str:
    """A coordinate, without a useless fraction."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# The drawing fills the page's width, scaling by at most this much either way; a drawing too wide
# to shrink that far keeps its size and the map scrolls (text stays legible either way).
MIN_SCALE, MAX_SCALE = 0.8, 1.6
# Monospace, so the layout knows how wide each label is (workers.fabric.layout.label_width).
LABEL_FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"


def render_map(drawing: Layout, health: dict[str, dict[str, str]], label: str) -> SafeString:
    """`health` is {kind: {name: health}}; anything missing is drawn as unknown."""

    def h(kind: str, name: str) -> str:
        return "health-" + health.get(kind, {}).get(name, "unknown")

    out = [
        f'<svg id="fabric-map" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {drawing.width} {drawing.height}" preserveAspectRatio="xMidYMin meet" '
        # The page's script applies these (a style attribute would need 'unsafe-inline' in the CSP).
        f'data-min-width="{drawing.width * MIN_SCALE:g}" data-max-width="{drawing.width * MAX_SCALE:g}" '
        f'font-size="{LABEL_PX}" font-family="{LABEL_FONT}" '
        f'data-width="{drawing.width}" data-height="{drawing.height}" role="group" aria-label="{_e(label)}" '
        f'data-aggregated="{"true" if drawing.aggregated else "false"}"><title>{_e(label)}</title>'
    ]
    if drawing.aggregated:
        out.append('<g class="bundles">')
        for b in drawing.bundles:
            out.append(
                f'<path class="bundle {h("bundle", b["id"])}" data-kind="bundle" data-name="{b["id"]}" '
                f'data-label="{_e(b["label"])}" data-count="{b["count"]}" d="{b["d"]}" '
                f'stroke-width="{b["stroke"]}" tabindex="0" role="button"><title>{_e(b["label"])}</title></path>'
            )
        out.append('</g><g class="groups">')
        for g in drawing.groups:
            out.append(
                f'<g class="group group-{g["kind"]}" data-kind="group" data-name="{g["id"]}" '
                f'data-label="{_e(g["label"])}" data-count="{g["count"]}" tabindex="0" role="button">'
                f'<rect x="{_n(g["x"])}" y="{_n(g["y"])}" width="{g["w"]}" height="{g["h"]}" rx="4"></rect>'
                f'<text class="label" x="{_n(g["x"] + g["w"] / 2)}" y="{_n(g["y"] + 13)}">{_e(g["short"])}</text>'
                f'<title>{_e(g["label"])}</title></g>'
            )
        out.append('</g><g class="cells">')
        for kind, css, cells in (("switch", "switch", drawing.switches), ("node", "host", drawing.hosts)):
            for c in cells:
                title = f'{c["name"]} ({c.get("tier") or "switch"})' if kind == "switch" else c["name"]
                tier = f' data-tier="{_e(c["tier"])}"' if kind == "switch" else ""
                out.append(
                    f'<rect class="cell {css} {h(kind, c["name"])}" data-kind="{kind}" data-name="{_e(c["name"])}" '
                    f'data-group="{c["group"]}"{tier} x="{_n(c["x"])}" y="{_n(c["y"])}" width="{c["w"]}" '
                    f'height="{c["h"]}"><title>{_e(title)}</title></rect>'
                )
        out.append("</g>")
    else:
        out.append('<g class="links">')
        for link in drawing.links:
            out.append(
                f'<line class="link {h("link", link["id"])}" data-kind="link" data-name="{_e(link["id"])}" '
                f'data-a="{_e(link["a"])}" data-b="{_e(link["b"])}" x1="{_n(link["x1"])}" y1="{_n(link["y1"])}" '
                f'x2="{_n(link["x2"])}" y2="{_n(link["y2"])}"><title>{_e(link["id"])}</title></line>'
            )
        out.append('</g><g class="switches">')
        for s in drawing.switches:
            out.append(
                f'<g class="switch {h("switch", s["name"])}" data-kind="switch" data-name="{_e(s["name"])}" '
                f'data-tier="{_e(s["tier"])}" tabindex="0" role="button">'
                f'<rect x="{_n(s["x"])}" y="{_n(s["y"])}" width="{s["w"]}" height="{s["h"]}" rx="4"></rect>'
                f'<text class="label" x="{_n(s["x"] + s["w"] / 2)}" y="{_n(s["y"] + 16)}">{_e(s["name"])}</text>'
                f'<title>{_e(s["name"])} ({_e(s["tier"] or "switch")})</title></g>'
            )
        out.append('</g><g class="hosts">')
        for host in drawing.hosts:
            out.append(
                f'<g class="host {h("node", host["name"])}" data-kind="node" data-name="{_e(host["name"])}" '
                f'tabindex="0" role="button">'
                f'<rect x="{_n(host["x"])}" y="{_n(host["y"])}" width="{host["w"]}" height="{host["h"]}" rx="3"></rect>'
                f'<text class="label" x="{_n(host["x"] + host["w"] / 2)}" y="{_n(host["y"] + 29)}">{_e(host["name"])}</text>'
                f'<title>{_e(host["name"])}</title></g>'
            )
        for nic in drawing.nics:
            out.append(
                f'<circle class="nic {h("nic", nic["name"])}" data-kind="nic" data-name="{_e(nic["name"])}" '
                f'data-host="{_e(nic["host"])}" cx="{_n(nic["x"])}" cy="{_n(nic["y"])}" r="{NIC_R}">'
                f'<title>{_e(nic["name"])}</title></circle>'
            )
        out.append("</g>")
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308  (every value above is escaped)
