"""What a case page shows beyond the summary's numbers: for each failing record, its plots (PNG
files written beside the page), its worst elements, the heads over the bound and notes, computed
from the full tensors (:func:`render_case`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import packed, plots, tensors
from .model import CaseView, RecordView

#: failure reasons that leave nothing to plot (no values, or values of the wrong shape)
NO_VALUES = ("missing_required", "dtype", "shape")


def plotted(case: CaseView) -> list[RecordView]:
    """The records that get plots: failing, with metrics, of the right shape."""
    return [r for r in case.failing if r.metrics is not None and r.reason not in NO_VALUES]


def render_case(case: CaseView, cases_dir: Path, profile: str, fixtures_dir, outputs_dir, top_k: int,
                roots: dict | None = None) -> None:
    """Plots and worst elements of each failing record (notes where the files do not allow them);
    ``roots``: the folders the summary records, the only places its file names are read in."""
    failing = plotted(case)
    if not failing:
        return
    files = tensors.CaseFiles(fixtures_dir, outputs_dir, roots, case.serving)
    raw_records = case.raw["records"]
    split = tensors.qkv_split(raw_records)
    folder = Path(cases_dir) / case.page
    folder.mkdir(exist_ok=True)
    for r in failing:
        pngs = _record_plots(r, case, files, raw_records, profile, split, top_k)
        for kind, data in pngs.items():
            name = f"{r.anchor}-{kind}.png"
            (folder / name).write_bytes(data)
            r.plots[kind] = f"{case.page}/{name}"
        for q in r.sequences:
            q.plot = r.plots.get(q.plot) if q.plot else None  # a sequence's panel: the path of its figure


def _record_plots(r: RecordView, case: CaseView, files, raw_records, profile, split, top_k) -> dict[str, bytes]:
    bound = r.bound["elem"] if r.bound else None
    loaded = tensors.load(files, r.raw, raw_records, profile)
    r.notes.extend(loaded.notes)
    out: dict[str, bytes] = {}
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
        out["histogram"] = plots.histogram(loaded.err, bound)
        r.blocks = tensors.over_by_block(loaded.err, r.tensor, bound, split)
        r.worst = tensors.worst(loaded, r.tensor, bound, top_k, r.raw.get("seq_pos"))
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
        if tok is not None and len(tok):
            out["drift"] = plots.drift(np.asarray(tok), np.asarray(val, dtype=float), bound,
                                       first_token=r.raw.get("first_bad_token"),
                                       first_position=r.raw.get("first_bad_position"))
    elif bound:
        series = [x for x in case.records if x.tensor == r.tensor and x.op != "save" and x.metrics and x.bound
                  and x.call is not None]
        if series:
            snap = (r.call if r.call is not None else -1, r.metrics["max_err"]) if r.op == "save" else None
            out["drift"] = plots.calls_curve([x.call for x in series], [x.metrics["max_err"] for x in series],
                                             [x.bound["elem"] for x in series], None if r.op == "save" else r.call,
                                             snapshot=snap)
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
    return {"sequences": plots.sequence_panels(curves, bound, f"{word} of each sequence, from its first (0)")}


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
        "ticks": [(100.0 * (t + 0.5) / rows, int(round(t * h.rows / rows))) for t in ticks],
        "blocks": [(100.0 * a / cols, 100.0 * (b - a) / cols, label) for a, b, label in h.blocks],
        "labelled": bool(h.blocks) and len(h.blocks) <= 16,
    }


def _worst_row(r: RecordView, loaded) -> int:
    m = r.metrics or {}
    for key in ("first_nonfinite", "max_err_index"):
        idx = m.get(key)
        if idx and 0 <= idx[0] < loaded.err.shape[0]:
            return int(idx[0])
    return 0
