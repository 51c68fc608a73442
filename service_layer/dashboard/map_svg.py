"""The region map as inline SVG (pure: map data in, markup out; the same data gives the same bytes).

Regions sit on an ellipse in name order, starting at the top. A directed link is a line from its
source region's card to its destination's, drawn a few pixels to the right of its direction so
both directions of a pair stay visible: solid when agents measured it, dashed when it is only
declared, thicker the more bytes/s cross it now. With a job, its regions stand out with its
devices, and the links its sync sends on are drawn over the map as arrows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from service_layer.dashboard.region_map import JobOverlay, LinkLine, RegionBox

WIDTH = 960
LABELS_UP_TO = 40  # more directed links than this: figures in each line's tooltip only
COLORS = {"measured": "#15803d", "declared": "#4f46e5"}
SEGMENTS = (("job", "#ea580c"), ("used", "#2563eb"), ("free", "#22c55e"), ("down", "#9ca3af"))


@dataclass(frozen=True)
class _Layout:
    height: int
    card_w: int
    card_h: int
    compact: bool
    centers: dict[str, tuple[float, float]]


def _layout(names: list[str], job: bool) -> _Layout:
    n = len(names)
    compact = n > 8
    card_w, card_h = (132, 58) if compact else (200, 100 if job else 86)
    rx = WIDTH / 2 - card_w / 2 - 24
    ry = 190 + (12 * (n - 8) if compact else 0)
    top = 72 + card_h / 2  # below the legend
    height = int(top + 2 * ry + card_h / 2 + 16) if n > 2 else int(top + card_h / 2 + 150)
    cy = top + ry if n > 2 else top + 60
    if n == 1:
        return _Layout(height, card_w, card_h, compact, {names[0]: (WIDTH / 2, cy)})
    if n == 2:
        gap = WIDTH / 2 - card_w / 2 - 60
        return _Layout(
            height,
            card_w,
            card_h,
            compact,
            {names[0]: (WIDTH / 2 - gap, cy), names[1]: (WIDTH / 2 + gap, cy)},
        )
    centers = {
        name: (WIDTH / 2 + rx * math.cos(a), cy + ry * math.sin(a))
        for i, name in enumerate(names)
        for a in [-math.pi / 2 + 2 * math.pi * i / n]
    }
    height = int(max(y for _, y in centers.values()) + card_h / 2 + 24)
    return _Layout(height, card_w, card_h, compact, centers)


def _to_edge(hw: float, hh: float, ux: float, uy: float) -> float:
    """Distance from a card's centre to its border along the unit direction (ux, uy)."""
    return min(hw / abs(ux) if ux else math.inf, hh / abs(uy) if uy else math.inf)


def _segment(
    lay: _Layout, src: str, dst: str, offset: float, gap: float = 4.0
) -> tuple[float, float, float, float, float, float]:
    """The visible part of src→dst (card border to card border), shifted ``offset`` px to the
    right of its direction; also the unit direction."""
    (x1, y1), (x2, y2) = lay.centers[src], lay.centers[dst]
    length = math.hypot(x2 - x1, y2 - y1) or 1.0
    ux, uy = (x2 - x1) / length, (y2 - y1) / length
    nx, ny = -uy, ux  # right of the direction, in SVG's y-down coordinates
    hw, hh = lay.card_w / 2, lay.card_h / 2
    a = _to_edge(hw, hh, ux, uy) + gap
    b = _to_edge(hw, hh, ux, uy) + gap + 4
    return (
        x1 + ux * a + nx * offset,
        y1 + uy * a + ny * offset,
        x2 - ux * b + nx * offset,
        y2 - uy * b + ny * offset,
        ux,
        uy,
    )


def bandwidth_text(gbps: float) -> str:
    return f"{gbps * 1000:.0f} Mb/s" if gbps < 1 else f"{gbps:.3g} Gb/s"


def rate_text(bps: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.0f} B/s"


def bytes_text(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _legend(job: JobOverlay | None) -> list[str]:
    """Two rows above the map: how links are drawn, then what the device bars and arrows mean."""
    out = ['<g class="map-legend">']
    x = 12
    for kind, dash, label in (("measured", "", "measured link"), ("declared", "7 5", "declared link")):
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x}" y1="16" x2="{x + 30}" y2="16" stroke="{COLORS[kind]}" '
            f'stroke-width="2"{dash_attr}/>'
        )
        out.append(f'<text class="legend" x="{x + 36}" y="20">{label}</text>')
        x += 140
    out.append(f'<line x1="{x}" y1="16" x2="{x + 30}" y2="16" stroke="#64748b" stroke-width="7"/>')
    out.append(f'<text class="legend" x="{x + 36}" y="20">line width: bytes/s in use now</text>')
    x = 12
    for key, color in SEGMENTS:
        if key == "job" and job is None:
            continue
        label = "this job's devices" if key == "job" else f"{key} devices"
        out.append(f'<rect x="{x}" y="32" width="12" height="12" rx="2" fill="{color}"/>')
        out.append(f'<text class="legend" x="{x + 17}" y="42">{label}</text>')
        x += 30 + 6.5 * len(label)
    if job is not None and job.sync.edges:
        out.append(
            f'<line x1="{x}" y1="38" x2="{x + 30}" y2="38" stroke="{SEGMENTS[0][1]}" stroke-width="3" '
            'marker-end="url(#arrow-sync)"/>'
        )
        out.append(
            f'<text class="legend" x="{x + 38}" y="42">this job\'s sync ({escape(job.sync.shape)})</text>'
        )
    out.append("</g>")
    return out


def _fit(text: str, width: float, char_w: float = 6.0) -> str:
    """The text cut to about ``width`` px (the card's tooltip has it whole)."""
    n = max(4, int(width / char_w))
    return text if len(text) <= n else text[: n - 1] + "…"


def _card(lay: _Layout, r: RegionBox, job: JobOverlay | None) -> list[str]:
    cx, cy = lay.centers[r.name]
    w, h = lay.card_w, lay.card_h
    x, y = cx - w / 2, cy - h / 2
    in_job = job is not None and job.devices.get(r.name, 0) > 0
    cls = "region" + (" in-job" if in_job else " dimmed" if job is not None else "")
    job_devices = job.devices.get(r.name, 0) if job is not None else 0
    title = (
        f"{r.name}: clusters {', '.join(r.clusters) or 'none'}; {r.nodes_alive}/{r.nodes} nodes alive; "
        f"{r.devices_free} free, {r.devices_used} used, {r.devices_down} down; "
        f"sent {bytes_text(r.sent_bytes)}"
    )
    out = [
        f'<g class="{cls}" data-region="{escape(r.name)}" data-free="{r.devices_free}" '
        f'data-used="{r.devices_used}" data-down="{r.devices_down}" data-job-devices="{job_devices}">',
        f"<title>{escape(title)}</title>",
        f'<rect class="card" x="{x:.1f}" y="{y:.1f}" width="{w}" height="{h}" rx="8"/>',
        f'<text class="region-name" x="{x + 10:.1f}" y="{y + 19:.1f}">'
        f"{escape(_fit(r.name, w - 44, 8.2))}</text>",
    ]
    if r.jurisdiction and not lay.compact:
        out.append(
            f'<text class="jurisdiction" x="{x + w - 10:.1f}" y="{y + 19:.1f}" text-anchor="end">'
            f"{escape(r.jurisdiction)}</text>"
        )
    line = y + 19
    if not lay.compact:
        line += 17
        n_clusters = len(r.clusters)
        out.append(
            f'<text class="region-sub" x="{x + 10:.1f}" y="{line:.1f}">{n_clusters} cluster'
            f"{'s' if n_clusters != 1 else ''} · {r.nodes_alive}/{r.nodes} nodes alive</text>"
        )
    # Devices as one bar: this job's, others' held, free, down.
    counts = {
        "job": job_devices,
        "used": max(0, r.devices_used - job_devices),
        "free": r.devices_free,
        "down": r.devices_down,
    }
    total = sum(counts.values())
    bar_y, bar_w = line + 8, w - 20
    out.append(f'<rect class="bar-bg" x="{x + 10:.1f}" y="{bar_y:.1f}" width="{bar_w}" height="9" rx="2"/>')
    at = x + 10
    for key, color in SEGMENTS:
        if counts[key] and total:
            seg = bar_w * counts[key] / total
            out.append(
                f'<rect class="bar-{key}" x="{at:.1f}" y="{bar_y:.1f}" width="{seg:.1f}" height="9" '
                f'fill="{color}"/>'
            )
            at += seg
    line = bar_y + 22
    text = f"{r.devices_free} free · {r.devices_used} used"
    if r.devices_down:
        text += f" · {r.devices_down} down"
    if not lay.compact and r.sent_bytes > 0:
        text += f" · sent {bytes_text(r.sent_bytes)}"
    out.append(
        f'<text class="region-sub" x="{x + 10:.1f}" y="{line:.1f}">{escape(_fit(text, w - 20))}</text>'
    )
    if in_job and job is not None and not lay.compact:
        line += 16
        where = ", ".join(job.clusters.get(r.name, ())) or "placed"
        note = f"this job: {job_devices} device{'s' if job_devices != 1 else ''} · {where}"
        out.append(
            f'<text class="job-note" x="{x + 10:.1f}" y="{line:.1f}">{escape(_fit(note, w - 20))}</text>'
        )
    out.append("</g>")
    return out


def _link(lay: _Layout, ln: LinkLine, max_use: float) -> list[str]:
    x1, y1, x2, y2, _, _ = _segment(lay, ln.src, ln.dst, offset=5.0)
    width = 1.6 + (6.0 * ln.use_bps / max_use if max_use > 0 else 0.0)
    color = COLORS.get(ln.source, COLORS["declared"])
    dash = ' stroke-dasharray="7 5"' if ln.source != "measured" else ""
    use = f"{rate_text(ln.use_bps)} in use" if ln.use_bps > 0 else "idle"
    title = f"{ln.src} → {ln.dst}: {ln.source}, {_figures(ln)}, {use}"
    return [
        f'<g class="link {escape(ln.source)}" data-src="{escape(ln.src)}" data-dst="{escape(ln.dst)}" '
        f'data-use="{ln.use_bps:.6g}">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
        f'stroke-width="{width:.2f}"{dash} marker-end="url(#arrow-{escape(ln.source)})"/>',
        "</g>",
    ]


def _figures(ln: LinkLine) -> str:
    return f"{bandwidth_text(ln.bandwidth_gbps)} · {ln.latency_ms:.3g} ms"


Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _labels(lay: _Layout, links: list[LinkLine]) -> list[str]:
    """Each link's figures beside its line, on the line's own side, at the first spot along it
    where the text covers no card and no label placed before; a link with no such spot keeps its
    figures in its tooltip. Busy links are placed first."""
    taken: list[Box] = [
        (cx - lay.card_w / 2 - 2, cy - lay.card_h / 2 - 2, cx + lay.card_w / 2 + 2, cy + lay.card_h / 2 + 2)
        for cx, cy in lay.centers.values()
    ]
    out = []
    for ln in sorted(links, key=lambda ln: (-ln.use_bps, ln.src, ln.dst)):
        x1, y1, x2, y2, ux, uy = _segment(lay, ln.src, ln.dst, offset=5.0)
        figures, use = _figures(ln), f"{rate_text(ln.use_bps)} in use" if ln.use_bps > 0 else ""
        half_w = 3.2 * max(len(figures), len(use)) + 4
        half_h = (14.0 if use else 7.0) + 2
        # off the line by as much as the text's box needs at this angle
        d = half_w * abs(uy) + half_h * abs(ux) + 5
        for t in (0.3, 0.45, 0.2, 0.6, 0.12):
            lx, ly = x1 + (x2 - x1) * t - uy * d, y1 + (y2 - y1) * t + ux * d
            box = (lx - half_w, ly - half_h, lx + half_w, ly + half_h)
            if box[0] < 0 or box[2] > WIDTH or box[1] < 50 or box[3] > lay.height:
                continue
            if not any(_overlaps(box, other) for other in taken):
                break
        else:
            continue
        taken.append(box)
        top = ly - half_h + 12  # the first baseline
        out.append(
            f'<text class="link-label" data-src="{escape(ln.src)}" data-dst="{escape(ln.dst)}" x="{lx:.1f}" '
            f'y="{top:.1f}" text-anchor="middle">{escape(figures)}'
            + (f'<tspan class="link-use" x="{lx:.1f}" dy="13">{escape(use)}</tspan>' if use else "")
            + "</text>"
        )
    return out


def _sync_edge(lay: _Layout, src: str, dst: str) -> str:
    """The job's sync along src→dst: a curve bowing to the right of the link lines."""
    x1, y1, x2, y2, ux, uy = _segment(lay, src, dst, offset=0.0, gap=8.0)
    bow = min(80.0, max(30.0, 0.18 * math.hypot(x2 - x1, y2 - y1)))
    mx, my = (x1 + x2) / 2 - uy * bow, (y1 + y2) / 2 + ux * bow
    return (
        f'<path class="sync-edge" data-src="{escape(src)}" data-dst="{escape(dst)}" '
        f'd="M{x1:.1f},{y1:.1f} Q{mx:.1f},{my:.1f} {x2:.1f},{y2:.1f}" marker-end="url(#arrow-sync)"/>'
    )


def _markers() -> str:
    out = ["<defs>"]
    for name, color in (*COLORS.items(), ("sync", SEGMENTS[0][1])):
        out.append(
            f'<marker id="arrow-{name}" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="10" '
            f'markerHeight="10" markerUnits="userSpaceOnUse" orient="auto">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>'
        )
    out.append("</defs>")
    return "".join(out)


def region_map_svg(
    regions: tuple[RegionBox, ...], links: tuple[LinkLine, ...], job: JobOverlay | None = None
) -> str:
    """The map; with ``job``, that job's placement and sync drawn over it."""
    names = sorted(r.name for r in regions)
    lay = _layout(names, job is not None) if names else _Layout(140, 0, 0, False, {})
    label = "Region map" if job is None else f"Placement of {job.name}"
    out = [
        f'<svg class="region-map" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {lay.height}" '
        f'width="{WIDTH}" height="{lay.height}" role="img" aria-label="{escape(label)}">',
        _markers(),
        *_legend(job),
    ]
    if not names:
        out.append(
            f'<text class="empty" x="{WIDTH / 2}" y="{lay.height / 2 + 10}" text-anchor="middle">'
            "no regions yet: they appear when an agent registers</text>"
        )
        out.append("</svg>")
        return "\n".join(out)
    drawn = [ln for ln in links if ln.src in lay.centers and ln.dst in lay.centers and ln.src != ln.dst]
    max_use = max((ln.use_bps for ln in drawn), default=0.0)
    out.append('<g class="links">')
    for ln in sorted(drawn, key=lambda ln: (ln.src, ln.dst)):
        out.extend(_link(lay, ln, max_use))
    out.append("</g>")
    if job is not None and job.sync.edges:
        out.append('<g class="sync">')
        out.extend(_sync_edge(lay, a, b) for a, b in job.sync.edges if a in lay.centers and b in lay.centers)
        out.append("</g>")
    for r in sorted(regions, key=lambda r: r.name):
        out.extend(_card(lay, r, job))
    out.append('<g class="link-labels">')
    out.extend(_labels(lay, drawn) if len(drawn) <= LABELS_UP_TO else [])
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
