"""The report's plots, drawn without a plotting library: inline SVG line plots, palette-PNG heatmaps.

Every plot shows the scaled error of docs/tolerances.md against the bound verify applied:

- :func:`heatmap`: the error map of :class:`~.tensors.Heat`, one pixel per (pooled) cell (a palette
  PNG, PIL), coloured in half decades of err / bound (:data:`LEVELS`) — blues under the bound,
  reds over it, NaN black. The page scales it up with crisp edges and draws its axis labels and
  head blocks in HTML; :func:`colorbar` (an SVG file) is its legend, written once per site;
- :func:`histogram`: elements per error bin, both axes logarithmic, the bound drawn;
- :func:`drift`: the largest error per token with the bound and the first token past it marked;
- :func:`calls_curve`: a state's largest error after each call (states have no token axis);
- :func:`sequence_panels`: a packed call's per-token error, a panel per sequence.

The line plots are small SVG documents written here (a path per curve, integer-ish pixel
coordinates, a few ticks): a plot costs well under a millisecond and 1-3 kB inline in its page,
where matplotlib took 0.1-0.5 s and a PNG file each (docs/report.md, "Size and time"). Only numbers
and the report's own words go into them, escaped all the same.
"""

from __future__ import annotations

import html
import io
import math

import numpy as np
from markupsafe import Markup
from PIL import Image

WIDTH, HEIGHT = 528, 152  # px, the size of every line plot
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 8, 30  # plot area margins
FONT = 'font-family="system-ui, sans-serif" font-size="10"'
BOUND_COLOR = "#b2182b"
LINE_COLOR = "#2c5d8a"
INK = "#3a4550"

#: decades of err / bound; blues under the bound, reds over it
LEVELS = np.arange(-3.0, 3.01, 0.5)
UNDER = ["#f1f5fa", "#d8e4f0", "#bdd1e6", "#9dbcdb", "#7aa3cc", "#5a8bbd"]
OVER = ["#fdd49e", "#fdae6b", "#f4804d", "#e0532f", "#bb2a1c", "#8a1010"]
COLORS = UNDER + OVER
N_BINS = len(COLORS)  # palette indices 0..N-1 the bins, N under (far below the bound), N+1 over, N+2 NaN
FAR_UNDER, FAR_OVER, NAN_COLOR = "#ffffff", "#4a0008", "#000000"


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def _palette() -> bytes:
    return bytes(v for c in [*COLORS, FAR_UNDER, FAR_OVER, NAN_COLOR] for v in _hex(c))


def color_index(values: np.ndarray, bound: float) -> np.ndarray:
    """Each error's palette index: its half-decade bin of log10(err / bound) in :data:`LEVELS`."""
    v = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log10(v / bound) if bound > 0 else np.log10(v)
    idx = np.searchsorted(LEVELS, np.where(np.isnan(ratio), 0.0, ratio), side="right") - 1  # -1 under, N over
    idx = np.where(idx < 0, N_BINS, np.where(idx >= N_BINS, N_BINS + 1, idx))
    return np.where(np.isnan(v), N_BINS + 2, idx).astype(np.uint8)


def heatmap(values: np.ndarray, bound: float) -> bytes:
    """A palette PNG with one pixel per cell of ``values`` (rows × cols), coloured by err / bound."""
    img = Image.fromarray(color_index(values, bound), mode="P")
    img.putpalette(_palette())
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


# -- SVG helpers ---------------------------------------------------------------------------------
def _f(v: float) -> str:
    """A coordinate: one decimal, no trailing zero."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def _t(text) -> str:
    return html.escape(str(text), quote=True)


def _num(v: float) -> str:
    return f"{v:.3g}"


def _decade(e: int) -> str:
    return {-2: "0.01", -1: "0.1", 0: "1", 1: "10", 2: "100"}.get(e, f"1e{e}")


class _Log:
    """A log axis from ``lo`` to ``hi`` onto pixels ``a`` .. ``b``."""

    def __init__(self, lo: float, hi: float, a: float, b: float):
        self.l0, self.l1 = math.log10(lo), math.log10(hi)
        if self.l1 - self.l0 < 1e-9:
            self.l0, self.l1 = self.l0 - 0.5, self.l1 + 0.5
        self.a, self.b = a, b

    def __call__(self, v: float) -> float:
        return self.a + (math.log10(v) - self.l0) / (self.l1 - self.l0) * (self.b - self.a)

    def ticks(self) -> list[tuple[float, str]]:
        lo, hi = math.ceil(self.l0 - 1e-9), math.floor(self.l1 + 1e-9)
        if hi < lo:  # less than a decade: its two ends
            return [(10 ** self.l0, _num(10 ** self.l0)), (10 ** self.l1, _num(10 ** self.l1))]
        step = max(1, math.ceil((hi - lo + 1) / 6))
        return [(10.0 ** e, _decade(e)) for e in range(lo, hi + 1, step)]


class _Lin:
    def __init__(self, lo: float, hi: float, a: float, b: float):
        self.lo, self.hi = lo, hi if hi > lo else lo + 1
        self.a, self.b = a, b

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self, n: int = 7) -> list[tuple[float, str]]:
        raw = (self.hi - self.lo) / n
        mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
        step = max(1, next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))
        first = math.ceil(self.lo / step) * step
        return [(v, str(int(v))) for v in np.arange(first, self.hi + 1e-9, step)]


def _svg(kind: str, label: str, points: int, body: list[str], width: int = WIDTH, height: int = HEIGHT) -> Markup:
    """An inline SVG element (no title: the aria-label names it); text inherits the ink colour;
    ``data-points``: how many values it draws (their paths are of class ``data``)."""
    return Markup(f'<svg class="plot {kind}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
                  f'role="img" aria-label="{_t(label)}" data-points="{points}" {FONT} fill="{INK}">'
                  + "".join(body) + "</svg>")


def _axes(x, y, x0: float, x1: float, y0: float, y1: float, xlabel: str, ylabel: str | None,
          xticks: list | None = None) -> list[str]:
    """Both axis lines, their ticks and labels, in the plot area x0..x1 × y0..y1 (y1 the bottom): one
    path for the lines and ticks, a group of labels per alignment."""
    d = [f"M{_f(x0)} {_f(y0)}V{_f(y1)}H{_f(x1)}"]
    left, below = [], []
    for v, text in y.ticks():
        py = y(v)
        d.append(f"M{_f(x0 - 3)} {_f(py)}h3")
        left.append(f'<text x="{_f(x0 - 5)}" y="{_f(py + 3.5)}">{_t(text)}</text>')
    for v, text in (xticks if xticks is not None else x.ticks()):
        px = x(v)
        if x0 - 0.5 <= px <= x1 + 0.5:
            d.append(f"M{_f(px)} {_f(y1)}v3")
            below.append(f'<text x="{_f(px)}" y="{_f(y1 + 13)}">{_t(text)}</text>')
    below.append(f'<text x="{_f((x0 + x1) / 2)}" y="{_f(y1 + 26)}">{_t(xlabel)}</text>')
    if ylabel:
        below.append(f'<text transform="translate(10 {_f((y0 + y1) / 2)}) rotate(-90)">{_t(ylabel)}</text>')
    return [f'<path d="{"".join(d)}" fill="none" stroke="{INK}"/>', f'<g text-anchor="end">{"".join(left)}</g>',
            f'<g text-anchor="middle">{"".join(below)}</g>']


def _label(x: float, y: float, text: str, anchor: str = "start", color: str = INK) -> str:
    """Text on a white halo, over the curves."""
    return (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" fill="{color}" stroke="#fff" stroke-width="3" '
            f'paint-order="stroke">{_t(text)}</text>')


def _clipped(values, bounds) -> tuple[np.ndarray, float, float]:
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v) & (v > 0)]
    floor = min(finite.min() if finite.size else min(bounds), min(bounds)) / 3
    top = max(finite.max() if finite.size else max(bounds), max(bounds)) * 3
    return np.clip(np.where(np.isfinite(v), v, top), floor, top), floor, top


def _step_path(x, y, tokens: np.ndarray, shown: np.ndarray, end: float) -> str:
    xs = [x(float(t)) for t in tokens] + [x(end)]
    d = [f"M{_f(xs[0])} {round(y(float(shown[0])))}"]
    last = None
    for i, v in enumerate(shown):
        py = str(round(y(float(v))))
        if py != last and i:
            d.append(f"V{py}")
        d.append(f"H{_f(xs[i + 1])}")
        last = py
    return "".join(d)


# -- the plots -----------------------------------------------------------------------------------
def histogram(err: np.ndarray, bound: float, label: str = "histogram") -> Markup:
    """Elements per log-spaced bin of scaled error; zeros, NaN and inf counted in the x label."""
    flat = np.asarray(err, dtype=float).ravel()
    nan = int(np.isnan(flat).sum())
    inf = int(np.isposinf(flat).sum())
    pos = flat[np.isfinite(flat) & (flat > 0)]
    zeros = int((flat == 0).sum())
    lo = (min(pos.min(), bound) if pos.size else bound / 10) / 1.5
    hi = (max(pos.max(), bound) if pos.size else bound * 10) * 1.5
    edges = np.logspace(math.log10(lo), math.log10(hi), 41)
    edges = np.unique(np.append(edges[np.abs(np.log(edges / bound)) > 0.02], bound))  # the bound is an edge
    counts, _ = np.histogram(pos, bins=edges)
    over = int((pos > bound).sum()) + inf + nan
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    x = _Log(edges[0], edges[-1], x0, x1)
    y = _Log(0.5, max(2.0, counts.max() * 2.0), y1, y0)
    split = int(np.searchsorted(edges, bound))  # bins from here on lie over the bound
    body = []
    for color, lo_i, hi_i in ((LINE_COLOR, 0, split), (BOUND_COLOR, split, len(counts))):
        if hi_i > lo_i and counts[lo_i:hi_i].any():  # the bins as one outline: up, across, down
            d = [f"M{_f(x(edges[lo_i]))} {_f(y1)}"]
            for i in range(lo_i, hi_i):
                d.append(f"V{_f(y(counts[i]) if counts[i] else y1)}H{_f(x(edges[i + 1]))}")
            body.append(f'<path class="data" d="{"".join(d)}V{_f(y1)}Z" fill="{color}" fill-opacity="0.85"/>')
    bx = x(bound)
    body.append(f'<path d="M{_f(bx)} {_f(y0)}V{_f(y1)}" stroke="{BOUND_COLOR}" stroke-width="1.4" '
                f'stroke-dasharray="5 3"/>')
    right = bx > x0 + 0.6 * (x1 - x0)
    anchor, dx = ("end", -4) if right else ("start", 4)
    body.append(_label(bx + dx, y0 + 10, f"bound {_num(bound)}", anchor, BOUND_COLOR))
    body.append(_label(bx + dx, y0 + 22, f"{over} over", anchor, BOUND_COLOR))
    extra = ", ".join(e for e in (f"{zeros} exactly 0" if zeros else "", f"{nan} NaN" if nan else "",
                                  f"{inf} inf" if inf else "") if e)
    xlabel = "scaled error |a − e| / (|e| + s)" + (f"   (not shown: {extra})" if extra else "")
    return _svg("histogram", label, int(counts.sum()) + nan + inf + zeros,
                _axes(x, y, x0, x1, y0, y1, xlabel, "elements") + body)


#: the most points a curve draws: a longer one is max-pooled (:func:`max_pooled`) to this many
MAX_PLOT_POINTS = 1024


def max_pooled(tokens: np.ndarray, values: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """``tokens`` and ``values`` in at most ``most`` buckets of consecutive points: each bucket's first token
    and its largest value (NaN where it holds one), so no peak and no NaN is lost; as they are when short."""
    n = len(tokens)
    if n <= most:
        return tokens, values
    k = -(-n // most)
    pad = (-n) % k
    v = np.concatenate([values, np.full(pad, -np.inf)]).reshape(-1, k)
    has_nan = np.isnan(v).any(axis=1)
    pooled = np.where(has_nan, np.nan, np.max(np.where(np.isnan(v), -np.inf, v), axis=1))
    return tokens[::k], pooled


def drift(tokens: np.ndarray, values: np.ndarray, bound: float, *, first_token: int | None = None,
          first_position: int | None = None, xlabel: str = "token (index in the call)",
          label: str = "drift") -> Markup:
    """Largest scaled error per token (log), the bound, and the first token over it (two tokens at least:
    a single token is a number, which the page's tables give)."""
    tokens, values = max_pooled(np.asarray(tokens), np.asarray(values, dtype=float), MAX_PLOT_POINTS)
    if len(tokens) < 2:
        raise ValueError("a drift plot needs two tokens at least")
    shown, floor, top = _clipped(values, [bound])
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    end = float(tokens[-1] + (tokens[-1] - tokens[-2]))
    x = _Lin(float(tokens[0]), end, x0, x1)
    y = _Log(floor, top, y1, y0)
    body = [f'<path class="data" d="{_step_path(x, y, tokens, shown, end)}" fill="none" stroke="{LINE_COLOR}"/>']
    by = y(bound)
    body.append(f'<path d="M{x0} {_f(by)}H{x1}" stroke="{BOUND_COLOR}" stroke-width="1.2" stroke-dasharray="5 3"/>')
    body.append(_label(x0 + 4, by - 3, f"bound {_num(bound)}", "start", BOUND_COLOR))
    if first_token is not None:
        fx = x(first_token)
        body.append(f'<path d="M{_f(fx)} {y0}V{y1}" stroke="#000" stroke-dasharray="1.5 2"/>')
        where = f"first over: token {first_token}" + (f" (position {first_position})"
                                                       if first_position is not None else "")
        left = fx <= x0 + 0.6 * (x1 - x0)
        body.append(_label(fx + (4 if left else -4), y0 + 10, where, "start" if left else "end"))
    return _svg("drift", label, len(tokens), _axes(x, y, x0, x1, y0, y1, xlabel, "largest scaled error") + body)


def calls_curve(calls: list[int], values: list[float], bounds: list[float], current: int | None, *,
                snapshot: tuple[int, float] | None = None, label: str = "drift") -> Markup:
    """A state's largest scaled error after each call, the bound, this record's call ringed."""
    shown, floor, top = _clipped(values + ([snapshot[1]] if snapshot else []), bounds)
    xs = list(calls)
    ticks = sorted(set(xs) | ({snapshot[0]} if snapshot else set()))
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, TOP + 12, HEIGHT - BOTTOM
    x = _Lin(min(ticks) - 0.5, max(ticks) + 0.5, x0, x1)
    y = _Log(floor, top, y1, y0)
    pts = [(x(c), y(float(v))) for c, v in zip(xs, shown[:len(xs)])]
    body = [f'<path class="data" d="M{"L".join(f"{_f(a)} {_f(b)}" for a, b in pts)}" fill="none" '
            f'stroke="{LINE_COLOR}"/>']
    body += [f'<circle cx="{_f(a)}" cy="{_f(b)}" r="2.5" fill="{LINE_COLOR}"/>' for a, b in pts]
    body.append(f'<path d="M{"L".join(f"{_f(x(c))} {_f(y(b))}" for c, b in zip(xs, bounds))}" fill="none" '
                f'stroke="{BOUND_COLOR}" stroke-width="1.2" stroke-dasharray="5 3"/>')
    if current is not None and current in xs:
        a, b = pts[xs.index(current)]
        body.append(f'<circle cx="{_f(a)}" cy="{_f(b)}" r="6" fill="none" stroke="#000" stroke-width="1.3"/>')
    legend = [("after the call", LINE_COLOR), ("bound", BOUND_COLOR)]
    if snapshot is not None:
        sx, sy = x(snapshot[0]), y(float(shown[-1]))
        body.append(f'<path d="M{_f(sx)} {_f(sy - 4)}l4 4l-4 4l-4 -4Z" fill="#000"/>')
        legend.append(("saved snapshot", "#000"))
    at = x0 + 6
    for text, color in legend:
        body.append(f'<path d="M{_f(at)} {TOP + 4}h14" stroke="{color}" stroke-width="2"/>'
                    f'<text x="{_f(at + 18)}" y="{TOP + 7.5}">{_t(text)}</text>')
        at += 30 + 6 * len(text)
    return _svg("drift", label, len(pts) + (snapshot is not None),
                _axes(x, y, x0, x1, y0, y1, "after call", "largest scaled error", [(c, str(c)) for c in ticks]) + body)


def sequence_panels(curves: list[tuple[str, np.ndarray, np.ndarray, int | None]], bound: float, xlabel: str,
                    label: str = "per-token error, per sequence") -> Markup:
    """A packed call's largest scaled error per token, one panel per sequence side by side, each over
    the sequence's own tokens (its x axis starts at 0), the y axis shared; the bound dashed and each
    sequence's first token over it dotted. ``curves``: (title, tokens, values, first token over)."""
    shown, floor, top = _clipped(np.concatenate([np.asarray(v, dtype=float) for _, _, v, _ in curves]), [bound])
    y0, y1 = TOP + 12, HEIGHT - BOTTOM
    y = _Log(floor, top, y1, y0)
    gap = 8
    width = (WIDTH - LEFT - RIGHT - gap * (len(curves) - 1)) / len(curves)
    body: list[str] = []
    at = 0
    for i, (title, tokens, values, first) in enumerate(curves):
        px0 = LEFT + i * (width + gap)
        px1 = px0 + width
        tokens = np.asarray(tokens)
        v = shown[at:at + len(values)]
        at += len(values)
        step = tokens[-1] - tokens[-2] if len(tokens) > 1 else 1
        end = float(tokens[-1] + step)
        x = _Lin(0.0, end, px0, px1)
        ticks = x.ticks(3)
        body.append(f'<path d="M{_f(px0)} {y1}H{_f(px1)}{"".join(f"M{_f(x(tv))} {y1}v3" for tv, _ in ticks)}" '
                    f'fill="none" stroke="{INK}"/><g text-anchor="middle">'
                    + "".join(f'<text x="{_f(x(tv))}" y="{y1 + 13}">{_t(text)}</text>' for tv, text in ticks) + "</g>")
        body.append(f'<path class="data" d="{_step_path(x, y, tokens, v, end)}" fill="none" stroke="{LINE_COLOR}"/>')
        body.append(f'<path d="M{_f(px0)} {_f(y(bound))}H{_f(px1)}" stroke="{BOUND_COLOR}" stroke-width="1.2" '
                    f'stroke-dasharray="5 3"/>')
        if first is not None:
            body.append(f'<path d="M{_f(x(first))} {y0}V{y1}" stroke="#000" stroke-dasharray="1.5 2"/>')
        body.append(f'<text x="{_f((px0 + px1) / 2)}" y="{TOP + 6}" text-anchor="middle" font-size="9">'
                    f'{_t(title)}</text>')
    yt = y.ticks()
    body.append(f'<path d="M{LEFT} {y0}V{y1}{"".join(f"M{LEFT - 3} {_f(y(v))}h3" for v, _ in yt)}" fill="none" '
                f'stroke="{INK}"/><g text-anchor="end">'
                + "".join(f'<text x="{LEFT - 5}" y="{_f(y(v) + 3.5)}">{_t(text)}</text>' for v, text in yt) + "</g>")
    body.append(_label(LEFT + 4, y(bound) - 3, f"bound {_num(bound)}", "start", BOUND_COLOR))
    body.append(f'<g text-anchor="middle"><text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{y1 + 26}">{_t(xlabel)}</text>'
                f'<text transform="translate(10 {_f((y0 + y1) / 2)}) rotate(-90)">largest scaled error</text></g>')
    return _svg("seq-drift", label, len(shown), body)


def colorbar() -> bytes:
    """The heatmaps' legend (an SVG file, written once per site): the colour of each half decade of
    err / bound, far under (white) and far over below and above, the bound marked."""
    w, h, bx, bw, top, cell = 60, 184, 6, 16, 12, 13.3
    n = len(COLORS)
    out = []
    for i, c in enumerate(COLORS):  # the first (lowest) bin at the bottom
        y = top + (n - 1 - i) * cell
        out.append(f'<rect x="{bx}" y="{_f(y)}" width="{bw}" height="{_f(cell + 0.3)}" fill="{c}"/>')
    bottom = top + n * cell
    out.append(f'<path d="M{bx} {_f(bottom)}h{bw}l{-bw / 2} 10Z" fill="{FAR_UNDER}" stroke="#999"/>')
    out.append(f'<path d="M{bx} {top}h{bw}l{-bw / 2} -10Z" fill="{FAR_OVER}"/>')
    out.append(f'<rect x="{bx}" y="{top}" width="{bw}" height="{_f(n * cell)}" fill="none" stroke="#333"/>')
    for k, text in zip(range(-3, 4), ["1e-3", "0.01", "0.1", "bound", "10×", "100×", "1e3×"]):
        y = bottom - (k + 3) * 2 * cell
        weight = ' font-weight="bold"' if k == 0 else ""
        out.append(f'<path d="M{bx + bw} {_f(y)}h3" stroke="#333"/><text x="{bx + bw + 5}" y="{_f(y + 3.5)}"'
                   f'{weight}>{text}</text>')
    out.append(f'<path d="M{bx - 2} {_f(bottom - 6 * cell)}h{bw + 4}" stroke="#000" stroke-width="1.6"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
            f'font-family="sans-serif" font-size="9" fill="#1b1f24">{"".join(out)}</svg>\n').encode()
