"""What a case page shows beyond the summary's numbers, computed from the full tensors
(:func:`render_case`): for the case's *featured* records — its first divergence and the
:data:`EXTRA` worst other failing tensors — their plots (a heatmap PNG beside the page, inline SVG
line plots), worst elements, the heads over the bound and notes; for a serving step's failing stream
or pool tensors, their split by sequence and by slot (the step's tables), without plots. Every other
failing tensor is its row in the page's metrics tables, which hold each of its numbers: nothing is
read or drawn for it, so a port failing every case costs a few plots per case, not a few per tensor.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from . import packed, plots, tensors
from .model import NO_VALUES, CaseView, RecordView

#: failing tensors drawn besides the first divergence: the worst by err / bound, one per tensor name
EXTRA = 2
#: worst elements listed for those (the first divergence lists ``top_k``)
EXTRA_TOP_K = 5


def plottable(case: CaseView) -> list[RecordView]:
    """The failing records that could be plotted: with metrics, of the right shape."""
    return [r for r in case.failing if r.metrics is not None and r.reason not in NO_VALUES]


def _badness(r: RecordView) -> float:
    ratio = r.elem_ratio
    return math.inf if ratio is None or math.isnan(ratio) else ratio


def featured(case: CaseView) -> list[RecordView]:
    """The records that get plots: the first divergence, then the :data:`EXTRA` worst failing records
    by err / bound (NaN first) of other tensors (another call of the same tensor says little more)."""
    cands = plottable(case)
    first = [r for r in cands if r.first]
    seen = {r.tensor for r in first}
    extra = []
    for r in sorted((r for r in cands if not r.first), key=lambda r: (-_badness(r), r.step, r.stage_index)):
        if r.tensor not in seen:
            seen.add(r.tensor)
            extra.append(r)
        if len(extra) == EXTRA + (not first):
            break
    return first + extra


def analysed(case: CaseView) -> list[RecordView]:
    """Failing records of serving steps that the step's sequence or slot table splits (read, not drawn)."""
    return [r for r in plottable(case) if r.serving is not None and not r.featured
            and (packed.is_stream(r.serving, r.tensor) or r.tensor in packed.STATE_NAMES)]


def render_case(case: CaseView, cases_dir: Path, profile: str, fixtures_dir, outputs_dir, top_k: int,
                roots: dict | None = None) -> None:
    """Plots and worst elements of each failing record (notes where the files do not allow them);
    ``roots``: the folders the summary records, the only places its file names are read in."""
    chosen = featured(case)
    for r in chosen:
        r.featured = True
    split_only = analysed(case)
    if not chosen and not split_only:
        return
    files = tensors.CaseFiles(fixtures_dir, outputs_dir, roots, case.serving)
    raw_records = case.raw["records"]
    split = tensors.qkv_split(raw_records)
    folder = Path(cases_dir) / case.page
    folder.mkdir(exist_ok=True)
    for r in chosen:
        plots_of = _record_plots(r, case, files, raw_records, profile, split, top_k)
        for kind, data in plots_of.items():
            if isinstance(data, bytes):  # the heatmap: a PNG beside the page
                name = f"{r.anchor}-{kind}.png"
                (folder / name).write_bytes(data)
                r.plots[kind] = f"{case.page}/{name}"
            else:  # an inline SVG
                r.plots[kind] = data
        for q in r.sequences:
            q.plot = r.plots.get(q.plot) if q.plot else None  # a sequence's panel: its figure
    for r in split_only:
        _record_plots(r, case, files, raw_records, profile, split, top_k, draw=False)
    if not any(folder.iterdir()):
        folder.rmdir()


def _label(r: RecordView, kind: str) -> str:
    return f"{kind} of {r.tensor}, {r.where}"


def _record_plots(r: RecordView, case: CaseView, files, raw_records, profile, split, top_k,
                  draw: bool = True) -> dict:
    """The plots of a featured record (kind -> PNG bytes or inline SVG), its worst elements and
    notes; with ``draw`` false, a serving step's split by sequence and by slot only."""
    bound = r.bound["elem"] if r.bound else None
    loaded = tensors.load(files, r.raw, raw_records, profile)
    r.notes.extend(loaded.notes)
    out: dict = {}
    if not draw:
        if loaded.err is not None and bound:
            if packed.is_stream(r.serving, r.tensor):
                r.sequences = packed.split_sequences(loaded.err, r.serving, bound)
            elif loaded.err.ndim >= 1:
                prev = packed.previous_pool(raw_records, r.raw)
                before = files.read_judged("actual", prev, "actual_ref", "shape")[0] if prev else None
                r.slots = packed.split_slots(loaded.err, r.serving, bound, before, loaded.actual)
        return out
    if loaded.err is not None and bound:
        note = tensors.check_against_record(loaded.err, r.metrics)
        if note:
            r.notes.append(note)
        row = _worst_row(r, loaded)
        batch = loaded.err.shape[0]
        h = tensors.heat(loaded.err, r.tensor, row, split)
        out["heatmap"] = plots.heatmap(h.values, bound)
        r.heat = heat_layout(h)
        if batch > 1:
            r.captions["heatmap"] = f"Batch row {row} of {batch} (the row of the worst element)."
        if np.any(np.isfinite(loaded.err) & (loaded.err > 0)):  # else every error is 0, NaN or inf: no bars
            out["histogram"] = plots.histogram(loaded.err, bound, _label(r, "histogram"))
        r.blocks = tensors.over_by_block(loaded.err, r.tensor, bound, split)
        k = top_k if r.first else min(top_k, EXTRA_TOP_K)
        r.worst = tensors.worst(loaded, r.tensor, bound, k, r.raw.get("seq_pos"))
        r.worst_axes = tensors.axis_names(r.tensor, loaded.err.ndim)
        if packed.is_stream(r.serving, r.tensor):
            out.update(_sequence_plots(r, loaded.err, bound))
            return out
        if r.serving is not None and r.tensor in packed.STATE_NAMES and loaded.err.ndim >= 1:
            prev = packed.previous_pool(raw_records, r.raw)
            before = files.read_judged("actual", prev, "actual_ref", "shape")[0] if prev else None
            r.slots = packed.split_slots(loaded.err, r.serving, bound, before, loaded.actual)
            r.worst_axes[0] = "pool slot"
    if bound and not r.is_state and not packed.is_stream(r.serving, r.tensor):
        tok = None
        if loaded.err is not None and loaded.err.ndim >= 2:
            tok, val = tensors.token_curve(loaded.err)
        elif r.token_profile and r.token_profile.get("token"):
            tok, val = r.token_profile["token"], r.token_profile["max_err"]
            r.captions["drift"] = "From the summary's per-token profile (max-pooled to 64 points)."
        if tok is not None and len(tok) > 1:  # one token: its error is a number, no curve
            out["drift"] = plots.drift(np.asarray(tok), np.asarray(val, dtype=float), bound,
                                       first_token=r.raw.get("first_bad_token"),
                                       first_position=r.raw.get("first_bad_position"), label=_label(r, "drift"))
    elif bound:
        series = [x for x in case.records if x.tensor == r.tensor and x.op != "save" and x.metrics and x.bound
                  and x.call is not None]
        if len(series) + (r.op == "save") > 1:  # one call: its error is a number, no curve
            snap = (r.call if r.call is not None else -1, r.metrics["max_err"]) if r.op == "save" else None
            out["drift"] = plots.calls_curve([x.call for x in series], [x.metrics["max_err"] for x in series],
                                             [x.bound["elem"] for x in series], None if r.op == "save" else r.call,
                                             snapshot=snap, label=_label(r, "drift"))
    return out


def _sequence_plots(r: RecordView, err: np.ndarray, bound: float) -> dict[str, bytes]:
    """A packed stream tensor per sequence: each sequence's largest error, and a per-token plot over
    its own tokens (token 0 = its first) for those :func:`packed.plotted_sequences` picks."""
    r.sequences = packed.split_sequences(err, r.serving, bound)
    packed.locate_worst(r.worst, r.serving)
    r.worst_axes[:2] = ["sequence", packed.token_word(r.serving)]
    cu = r.serving["cu_seqlens"]
    r.captions["heatmap"] = f"Rows: the packed stream; its sequences start at tokens {', '.join(map(str, cu[:-1]))}."
    chosen = packed.plotted_sequences(r.sequences)
    if not chosen:
        return {}
    curves = []
    for q in chosen:
        tok, val = tensors.token_curve(err[:, q.seq.start:q.seq.stop])
        curves.append((f"sequence {q.seq.index} ({q.seq.slot_text})", tok, val, q.first_bad))
        q.plot = "sequences"
    word = packed.token_word(r.serving)
    return {"sequences": plots.sequence_panels(curves, bound, f"{word} of each sequence, from its first (0)",
                                               _label(r, "per-token error per sequence"))}


def heat_layout(h: tensors.Heat) -> dict:
    """Where the page draws a heatmap's labels: block edges and row ticks in % of the image, its size."""
    rows, cols = h.values.shape
    n = min(5, rows)
    ticks = np.linspace(0, rows - 1, n).round().astype(int) if n > 1 else np.array([0])
    pooled = (rows, cols) != (h.rows, h.cols)
    return {
        "rows": rows, "cols": cols, "height": int(min(220, max(48, rows * 4))),
        "row_label": h.row_label,
        "col_label": h.col_label + (f"; max-pooled from {h.rows} × {h.cols}" if pooled else ""),
        "ticks": [(round(100.0 * (t + 0.5) / rows, 2), int(round(t * h.rows / rows))) for t in ticks],
        "blocks": [(round(100.0 * a / cols, 2), round(100.0 * (b - a) / cols, 2), label) for a, b, label in h.blocks],
        "labelled": bool(h.blocks) and len(h.blocks) <= 16,
    }


def _worst_row(r: RecordView, loaded) -> int:
    m = r.metrics or {}
    for key in ("first_nonfinite", "max_err_index"):
        idx = m.get(key)
        if idx and 0 <= idx[0] < loaded.err.shape[0]:
            return int(idx[0])
    return 0
