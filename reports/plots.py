"""The report's plots, rendered offline by matplotlib (Agg, no pyplot state) into small PNGs.

Every plot shows the scaled error of docs/tolerances.md against the bound verify applied:

- :func:`heatmap`: the error map of :class:`~.tensors.Heat`, one pixel per (pooled) cell, coloured
  by matplotlib's colormap :data:`CMAP` through :data:`NORM` in half decades of err / bound —
  blues under the bound, reds over it, NaN black. The page scales it up with crisp edges and draws
  its axis labels and head blocks in HTML; :func:`colorbar` is its legend, drawn once per site;
- :func:`histogram`: elements per error bin, both axes logarithmic, the bound drawn;
- :func:`drift`: the largest error per token with the bound and the first token past it marked;
- :func:`calls_curve`: a state's largest error after each call (states have no token axis).

The line plots reuse one figure per kind (:class:`_Canvas`: building axes and ticks costs more
than drawing them) and are quantised to a small palette (:data:`LINE_PALETTE`); a page of many failing tensors stays
light (docs/report.md gives sizes and times).
"""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator
from PIL import Image

DPI = 80
WIDTH = 6.6  # inches: 528 px
HEIGHT = 1.9
PALETTE = 48  # the colorbar: its 14 colours (12 bins, under, over) and their anti-aliased edges
#: The line plots draw five colours (white, the line, the bound, black, grey text) and their anti-aliasing:
#: 12 palette entries keep them as drawn (checked by eye) and make a drift or histogram PNG about 45%
#: smaller than 48 did, with optimize=True (zlib's best settings) — a report of every tensor failing
#: must hold in 20 MB over the 1879 tensors the default suite judges (tests/reports/test_size.py).
LINE_PALETTE = 12
FONT = {"font.size": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7, "legend.fontsize": 7}
BOUND_COLOR = "#b2182b"
LINE_COLOR = "#2c5d8a"
LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0}

#: decades of err / bound; blues under the bound, reds over it
LEVELS = np.arange(-3.0, 3.01, 0.5)
UNDER = ["#f1f5fa", "#d8e4f0", "#bdd1e6", "#9dbcdb", "#7aa3cc", "#5a8bbd"]
OVER = ["#fdd49e", "#fdae6b", "#f4804d", "#e0532f", "#bb2a1c", "#8a1010"]
CMAP = ListedColormap(UNDER + OVER, name="err_over_bound").with_extremes(under="#ffffff", over="#4a0008",
                                                                          bad="#000000")
NORM = BoundaryNorm(LEVELS, CMAP.N)


def _png(img: Image.Image, colors: int = PALETTE) -> bytes:
    out = io.BytesIO()
    if img.mode != "P":
        img = img.convert("RGB").quantize(colors=colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


# -- heatmap ---------------------------------------------------------------------------------------
def _palette() -> bytes:
    """Palette indices: 0..N-1 the colormap's bins, N under (far below the bound), N+1 over, N+2 NaN."""
    colors = [CMAP(i) for i in range(CMAP.N)] + [CMAP.get_under(), CMAP.get_over(), CMAP.get_bad()]
    return bytes(int(round(c * 255)) for rgba in colors for c in to_rgb(rgba))


def color_index(values: np.ndarray, bound: float) -> np.ndarray:
    """Each error's palette index: its bin of log10(err / bound) in :data:`NORM`."""
    v = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log10(v / bound) if bound > 0 else np.log10(v)
    idx = np.asarray(NORM(np.where(np.isfinite(ratio), ratio, 0.0)), dtype=int)  # -1 under, N over
    idx = np.where(ratio == -np.inf, -1, idx)  # exact zeros: far below
    idx = np.where(ratio == np.inf, CMAP.N, idx)
    idx = np.where(idx < 0, CMAP.N, np.where(idx >= CMAP.N, CMAP.N + 1, idx))
    return np.where(np.isnan(v), CMAP.N + 2, idx).astype(np.uint8)


def heatmap(values: np.ndarray, bound: float) -> bytes:
    """A palette PNG with one pixel per cell of ``values`` (rows × cols), coloured by err / bound."""
    img = Image.fromarray(color_index(values, bound), mode="P")
    img.putpalette(_palette())
    return _png(img)


def colorbar() -> bytes:
    """The heatmaps' legend: the colour of each half decade of err / bound, the bound marked."""
    with matplotlib.rc_context(FONT):
        fig = Figure(figsize=(0.75, 2.3), dpi=DPI)
        FigureCanvasAgg(fig)
        cax = fig.add_axes((0.12, 0.06, 0.22, 0.88))
        cb = fig.colorbar(matplotlib.cm.ScalarMappable(norm=NORM, cmap=CMAP), cax=cax, extend="both")
        cb.set_ticks([-3, -2, -1, 0, 1, 2, 3])
        cb.set_ticklabels(["1e-3", "0.01", "0.1", "bound", "10×", "100×", "1e3×"])
        cb.ax.tick_params(labelsize=7, length=2)
        cb.ax.axhline(0, color="#000000", lw=1.4)
        fig.canvas.draw()
        return _png(Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()))


# -- line plots --------------------------------------------------------------------------------
def _decade(v, _pos=None) -> str:
    """Tick label without mathtext (its parser is the slowest part of a small plot): 1e-3, 0.1, 1, 10, 1e3."""
    if v <= 0:
        return ""
    e = math.floor(math.log10(v) + 1e-9)
    if not math.isclose(v, 10.0 ** e, rel_tol=1e-9):
        return f"{v:.2g}"
    return {-2: "0.01", -1: "0.1", 0: "1", 1: "10", 2: "100"}.get(e, f"1e{e}")


def _log(ax, which: str) -> None:
    """A log axis with a few major ticks and no minor ones (minor log ticks dominate drawing time)."""
    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(LogLocator(base=10, numticks=6))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(_decade))


class _Canvas:
    """One figure and axes kept for every plot of a kind; each plot removes the last one's artists."""

    def __init__(self, xlog: bool, ylabel: str):
        with matplotlib.rc_context(FONT):
            self.fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI)
            FigureCanvasAgg(self.fig)
            self.ax = self.fig.add_axes((0.09, 0.24, 0.89, 0.72))
            for side in ("top", "right"):
                self.ax.spines[side].set_visible(False)
            self.ax.tick_params(length=3, pad=2)
            if xlog:
                _log(self.ax, "x")
            else:
                self.ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
            _log(self.ax, "y")
            self.ax.set_ylabel(ylabel)

    def reset(self):
        ax = self.ax
        for artist in [*ax.patches, *ax.lines, *ax.texts, *ax.collections]:
            artist.remove()
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        return ax

    def png(self) -> bytes:
        self.fig.canvas.draw()
        c = self.fig.canvas
        return _png(Image.frombuffer("RGBA", c.get_width_height(), c.buffer_rgba()), LINE_PALETTE)


_CANVASES: dict[str, _Canvas] = {}


def _canvas(kind: str) -> _Canvas:
    if kind not in _CANVASES:
        _CANVASES[kind] = _Canvas(xlog=kind == "histogram",
                                  ylabel="elements" if kind == "histogram" else "largest scaled error")
    return _CANVASES[kind]


def histogram(err: np.ndarray, bound: float) -> bytes:
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
    split = int(np.searchsorted(edges, bound))
    shown = np.where(counts > 0, counts, 0.5)
    with matplotlib.rc_context(FONT):
        c = _canvas("histogram")
        ax = c.reset()
        ax.stairs(shown[:split], edges[:split + 1], fill=True, color=LINE_COLOR, alpha=0.85, baseline=0.5)
        if split < len(counts):
            ax.stairs(shown[split:], edges[split:], fill=True, color=BOUND_COLOR, alpha=0.85, baseline=0.5)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(0.5, max(2.0, counts.max() * 2.0))
        ax.axvline(bound, color=BOUND_COLOR, lw=1.4, ls="--")
        right = math.log(bound / lo) > 0.6 * math.log(hi / lo)
        ax.text(bound, 0.98, f" bound {bound:.3g} \n {over} over ", color=BOUND_COLOR,
                transform=ax.get_xaxis_transform(), va="top", ha="right" if right else "left", fontsize=7,
                bbox=LABEL_BOX)
        extra = ", ".join(e for e in (f"{zeros} exactly 0" if zeros else "", f"{nan} NaN" if nan else "",
                                      f"{inf} inf" if inf else "") if e)
        ax.set_xlabel("scaled error |a − e| / (|e| + s)" + (f"   (not shown: {extra})" if extra else ""))
        return c.png()


def _clipped(values, bounds) -> tuple[np.ndarray, float, float]:
    v = np.asarray(values, dtype=float)
    finite = v[np.isfinite(v) & (v > 0)]
    floor = min(finite.min() if finite.size else min(bounds), min(bounds)) / 3
    top = max(finite.max() if finite.size else max(bounds), max(bounds)) * 3
    return np.clip(np.where(np.isfinite(v), v, top), floor, top), floor, top


def drift(tokens: np.ndarray, values: np.ndarray, bound: float, *, first_token: int | None = None,
          first_position: int | None = None, xlabel: str = "token (index in the call)") -> bytes:
    """Largest scaled error per token (log), the bound, and the first token over it."""
    tokens = np.asarray(tokens)
    shown, floor, top = _clipped(values, [bound])
    with matplotlib.rc_context(FONT):
        c = _canvas("drift")
        ax = c.reset()
        if len(tokens) == 1:
            ax.plot(tokens, shown, "o", color=LINE_COLOR, ms=4)
            ax.set_xlim(tokens[0] - 1, tokens[0] + 1)
        else:
            step = tokens[-1] - tokens[-2]
            ax.step(np.append(tokens, tokens[-1] + step), np.append(shown, shown[-1]), where="post",
                    color=LINE_COLOR, lw=1.0)
            ax.set_xlim(tokens[0], tokens[-1] + step)
        ax.set_ylim(floor, top)
        ax.axhline(bound, color=BOUND_COLOR, lw=1.2, ls="--")
        ax.text(0.005, bound, f" bound {bound:.3g}", color=BOUND_COLOR, transform=ax.get_yaxis_transform(),
                ha="left", va="bottom", fontsize=7, bbox=LABEL_BOX)
        if first_token is not None:
            ax.axvline(first_token, color="#000000", lw=1.0, ls=":")
            where = f"first over: token {first_token}" + (f" (position {first_position})"
                                                           if first_position is not None else "")
            lo, hi = ax.get_xlim()
            ax.text(first_token, 0.98, f" {where} ", transform=ax.get_xaxis_transform(), va="top",
                    ha="left" if first_token <= lo + 0.6 * (hi - lo) else "right", fontsize=7, bbox=LABEL_BOX)
        ax.set_xlabel(xlabel)
        return c.png()


def calls_curve(calls: list[int], values: list[float], bounds: list[float], current: int | None, *,
                snapshot: tuple[int, float] | None = None) -> bytes:
    """A state's largest scaled error after each call, the bound, this record's call ringed."""
    shown, floor, top = _clipped(values + ([snapshot[1]] if snapshot else []), bounds)
    xs = list(calls)
    with matplotlib.rc_context(FONT):
        c = _canvas("calls")
        ax = c.reset()
        ax.plot(xs, shown[:len(xs)], "-o", color=LINE_COLOR, ms=3.5, lw=1.0, label="after the call")
        ax.plot(xs, bounds, color=BOUND_COLOR, lw=1.2, ls="--", label="bound")
        if current is not None and current in xs:
            ax.plot([current], [shown[xs.index(current)]], "o", ms=9, mfc="none", mec="#000000", mew=1.3)
        if snapshot is not None:
            ax.plot([snapshot[0]], [shown[-1]], "D", ms=6, color="#000000", label="saved snapshot")
        ax.set_ylim(floor, top)
        ticks = sorted(set(xs) | ({snapshot[0]} if snapshot else set()))
        ax.set_xticks(ticks)
        ax.set_xlim(min(ticks) - 0.5, max(ticks) + 0.5)
        ax.set_xlabel("after call")
        ax.legend(loc="best", frameon=False, ncols=3)
        return c.png()


def sequence_panels(curves: list[tuple[str, np.ndarray, np.ndarray, int | None]], bound: float, xlabel: str) -> bytes:
    """A packed call's largest scaled error per token, one panel per sequence side by side, each over
    the sequence's own tokens (its x axis starts at 0), the y axis shared; the bound dashed and each
    sequence's first token over it dotted. ``curves``: (title, tokens, values, first token over)."""
    shown, floor, top = _clipped(np.concatenate([np.asarray(v, dtype=float) for _, _, v, _ in curves]), [bound])
    with matplotlib.rc_context(FONT):
        fig = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI)
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, len(curves), sharey=True, gridspec_kw={"wspace": 0.08, "left": 0.09, "right": 0.98,
                                                                     "bottom": 0.24, "top": 0.88})
        axes = np.atleast_1d(axes)
        at = 0
        for ax, (title, tokens, values, first) in zip(axes, curves):
            y = shown[at:at + len(values)]
            at += len(values)
            tokens = np.asarray(tokens)
            step = tokens[-1] - tokens[-2] if len(tokens) > 1 else 1
            ax.step(np.append(tokens, tokens[-1] + step), np.append(y, y[-1]), where="post", color=LINE_COLOR, lw=1.0)
            ax.set_xlim(0, tokens[-1] + step)
            ax.axhline(bound, color=BOUND_COLOR, lw=1.2, ls="--")
            if first is not None:
                ax.axvline(first, color="#000000", lw=1.0, ls=":")
            ax.set_title(title, fontsize=7, pad=2)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
            ax.tick_params(length=3, pad=2)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        _log(axes[0], "y")
        axes[0].set_ylim(floor, top)
        axes[0].set_ylabel("largest scaled error")
        axes[0].text(0.02, bound, f" bound {bound:.3g}", color=BOUND_COLOR, transform=axes[0].get_yaxis_transform(),
                     ha="left", va="bottom", fontsize=7, bbox=LABEL_BOX)
        fig.supxlabel(xlabel, fontsize=8, y=0.02)
        fig.canvas.draw()
        # line art in four colours and their anti-aliasing: the line plots' palette keeps it light
        return _png(Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()), LINE_PALETTE)
