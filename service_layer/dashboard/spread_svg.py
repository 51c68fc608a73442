"""Gossip's spread over time as inline SVG: how far the regions' models are from one model at each
check (pure: data in, markup out). The last point of a finished job is the final exact average."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

from service_layer.dashboard.svg import PALETTE, Frame, _fmt, empty_note, legend_entry, nice_ticks


def spread_curve_svg(
    series: Mapping[str, Sequence[tuple[int, float]]],
    *,
    total_steps: int | None = None,
    frame: Frame = Frame(height=240),
) -> str:
    """One path per region (step → spread), on a linear axis from 0 so the end at 0 is visible,
    with a marker at every check. Non-finite or negative values are left out."""
    points = {r: [(s, v) for s, v in pts if math.isfinite(v) and v >= 0] for r, pts in series.items()}
    values = [v for pts in points.values() for _, v in pts]
    steps = [s for pts in points.values() for s, _ in pts]
    x_hi = float(max([total_steps or 0, *steps, 1]))
    y_hi = max(values, default=0.0) * 1.08 or 1.0
    f = frame

    def sx(step: float) -> float:
        return f.left + f.plot_w * step / x_hi

    def sy(v: float) -> float:
        return f.top + f.plot_h * (1 - v / y_hi)

    out = [
        f'<svg class="spread-curve" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {f.width} {f.height}" '
        f'width="{f.width}" height="{f.height}" role="img" aria-label="Gossip spread by step">',
        f'<rect class="plot-bg" x="{f.left}" y="{f.top}" width="{f.plot_w}" height="{f.plot_h}"/>',
    ]
    for t in nice_ticks(0.0, y_hi):
        y = sy(t)
        out.append(f'<line class="grid" x1="{f.left}" x2="{f.left + f.plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in nice_ticks(0.0, x_hi):
        y = f.top + f.plot_h + 16
        out.append(f'<text class="tick" x="{sx(t):.1f}" y="{y}" text-anchor="middle">{int(t)}</text>')
    out.append(
        f'<text class="axis-label" x="{f.left + f.plot_w / 2:.1f}" y="{f.height - 4}" '
        'text-anchor="middle">step</text>'
    )
    out.append(
        f'<text class="axis-label" x="14" y="{f.top + f.plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {f.top + f.plot_h / 2:.1f})">spread</text>'
    )
    for i, (region, pts) in enumerate(sorted(points.items())):
        color = PALETTE[i % len(PALETTE)]
        if pts:
            d = " ".join(f"{'L' if j else 'M'}{sx(s):.1f},{sy(v):.1f}" for j, (s, v) in enumerate(pts))
            last = pts[-1][1]
            out.append(
                f'<path class="series" data-region="{escape(region)}" data-points="{len(pts)}" '
                f'data-last="{last:.6g}" stroke="{color}" fill="none" d="{d}"/>'
            )
            out.extend(
                f'<circle class="check" cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="2.5" fill="{color}"/>'
                for s, v in pts
            )
        out.extend(legend_entry(f, i, region, color))
    if not values:
        out.append(empty_note(f, "no spread check yet"))
    out.append("</svg>")
    return "\n".join(out)
