"""The loss curve as inline SVG, rendered server-side from metric points (pure: data in, markup out)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#16a34a", "#d97706", "#9333ea", "#0891b2", "#db2777", "#65a30d", "#475569")


@dataclass(frozen=True)
class Frame:
    width: int = 720
    height: int = 320
    left: int = 56
    right: int = 16
    top: int = 30
    bottom: int = 40

    @property
    def plot_w(self) -> int:
        return self.width - self.left - self.right

    @property
    def plot_h(self) -> int:
        return self.height - self.top - self.bottom


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks


def legend_entry(f: Frame, i: int, name: str, color: str) -> list[str]:
    """The i-th legend entry, in a row above the plot where no curve can hide it."""
    lx = f.left + 120 * i
    return [
        f'<rect class="legend-swatch" x="{lx}" y="{f.top - 20}" width="10" height="10" fill="{color}"/>',
        f'<text class="legend" x="{lx + 15}" y="{f.top - 11}">{escape(name)}</text>',
    ]


def empty_note(f: Frame, text: str) -> str:
    """A note in the middle of an empty plot."""
    return (
        f'<text class="empty" x="{f.left + f.plot_w / 2:.1f}" y="{f.top + f.plot_h / 2:.1f}" '
        f'text-anchor="middle">{escape(text)}</text>'
    )


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if abs(v) >= 100 else f"{v:.3g}"


def loss_curve_svg(
    series: Mapping[str, Sequence[tuple[int, float | None]]],
    *,
    floor: float | None = None,
    uniform: float | None = None,
    total_steps: int | None = None,
    frame: Frame = Frame(),
) -> str:
    """An SVG with one path per region (step → loss), the entropy floor as a dashed line and, for
    scale, the uniform-guess loss. Non-finite losses break a path instead of bending it."""
    points = {r: [(s, v) for s, v in pts if v is None or math.isfinite(v)] for r, pts in series.items()}
    finite = [v for pts in points.values() for _, v in pts if v is not None]
    steps = [s for pts in points.values() for s, _ in pts]
    x_hi = float(max([total_steps or 0, *steps, 1]))
    refs = [v for v in (floor, uniform) if v is not None and math.isfinite(v)]
    y_vals = finite + ([floor] if floor is not None and math.isfinite(floor) else [])
    if not finite:
        y_vals += refs
    y_lo, y_hi = (min(y_vals), max(y_vals)) if y_vals else (0.0, 1.0)
    pad = (y_hi - y_lo) * 0.08 or max(abs(y_hi) * 0.1, 0.1)
    y_lo, y_hi = max(0.0, y_lo - pad), y_hi + pad

    f = frame

    def sx(step: float) -> float:
        return f.left + f.plot_w * step / x_hi

    def sy(loss: float) -> float:
        return f.top + f.plot_h * (1 - (loss - y_lo) / (y_hi - y_lo))

    out = [
        f'<svg class="loss-curve" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {f.width} {f.height}" '
        f'width="{f.width}" height="{f.height}" role="img" aria-label="Loss by step">',
        f'<rect class="plot-bg" x="{f.left}" y="{f.top}" width="{f.plot_w}" height="{f.plot_h}"/>',
    ]
    for t in nice_ticks(y_lo, y_hi):
        y = sy(t)
        out.append(f'<line class="grid" x1="{f.left}" x2="{f.left + f.plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in nice_ticks(0.0, x_hi):
        x = sx(t)
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{f.top + f.plot_h + 16}" text-anchor="middle">{int(t)}</text>'
        )
    out.append(
        f'<text class="axis-label" x="{f.left + f.plot_w / 2:.1f}" y="{f.height - 4}" '
        'text-anchor="middle">step</text>'
    )
    out.append(
        f'<text class="axis-label" x="14" y="{f.top + f.plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {f.top + f.plot_h / 2:.1f})">loss (nats/token)</text>'
    )
    if uniform is not None and math.isfinite(uniform) and y_lo <= uniform <= y_hi:
        y = sy(uniform)
        out.append(
            f'<line class="uniform" x1="{f.left}" x2="{f.left + f.plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text class="uniform-label" x="{f.left + f.plot_w - 4}" y="{y - 5:.1f}" text-anchor="end">'
            f"uniform {uniform:.3f}</text>"
        )
    if floor is not None and math.isfinite(floor):
        y = sy(floor)
        out.append(
            f'<line class="floor" data-value="{floor:.6f}" x1="{f.left}" x2="{f.left + f.plot_w}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text class="floor-label" x="{f.left + f.plot_w - 4}" y="{y + 14:.1f}" text-anchor="end">'
            f"entropy floor {floor:.3f}</text>"
        )
    for i, (region, pts) in enumerate(sorted(points.items())):
        color = PALETTE[i % len(PALETTE)]
        d, pen_down, n = [], False, 0
        for step, loss in pts:
            if loss is None:
                pen_down = False
                continue
            d.append(f"{'L' if pen_down else 'M'}{sx(step):.1f},{sy(loss):.1f}")
            pen_down, n = True, n + 1
        if d:
            out.append(
                f'<path class="series" data-region="{escape(region)}" data-points="{n}" '
                f'stroke="{color}" fill="none" d="{" ".join(d)}"/>'
            )
        out.extend(legend_entry(f, i, region, color))
    if not finite:
        out.append(empty_note(f, "no metrics yet"))
    out.append("</svg>")
    return "\n".join(out)
