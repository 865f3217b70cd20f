"""Full tensors behind a failing record: reloaded from the fixture and the port's outputs, with the
engine's own scaled error (:func:`gdncheck.conformance.judge.metrics.scaled_error`, the same case-wide
scales verify used), reduced to what the plots and the worst-elements table need.

The page never holds full tensors: heatmaps are max-pooled to at most :data:`HEAT_ROWS` ×
:data:`HEAT_COLS` cells, drift curves to :data:`DRIFT_POINTS` points, the table to ``top_k`` rows.
A file that is gone or unreadable gives a note, never an exception.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gdncheck.conformance.judge.aliases import convert, converted_shape, recorded_conversion
from gdncheck.conformance.judge.metrics import CaseStats, scaled_error
from gdncheck.conformance.judge.metrics import case_stats as metric_stats
from gdncheck.errors import GDNError
from gdncheck.harness import CALL_OPS
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import TENSOR_BY_NAME
from gdncheck.untrusted import UnsafePathError, is_within, safe_path

from . import packed

HEAT_ROWS = 64
HEAT_COLS = 160
DRIFT_POINTS = 160  # 3 px a point across a 472 px plot
#: the largest port tensor read for a tensor judged through a name table, in elements of the judged
#: one: a split's whole (Q|K|V of which q is a part: at most a few times larger), never more
SPLIT_RATIO = 64
STATE_AXES = {"conv_state": ("b", "channel", "slot"), "recurrent_state": ("b", "head", "k", "v")}


def axis_names(tensor: str, ndim: int) -> list[str]:
    """Names of a record's axes, batch first: ``b, t, Hv, dv`` for ``core``."""
    if tensor in STATE_AXES and len(STATE_AXES[tensor]) == ndim:
        return list(STATE_AXES[tensor])
    spec = TENSOR_BY_NAME.get(tensor)
    if spec is not None and len(spec.shape) + 1 == ndim:
        return ["b"] + ["t" if s == "T" else s for s in spec.shape]
    return [f"axis{i}" for i in range(ndim)]


@dataclass
class Heat:
    """A 2-D error map: ``values[row, col]`` (scaled error, max-pooled), block boundaries and labels."""

    values: np.ndarray
    row_label: str
    col_label: str
    rows: int  # extent before pooling, for the axis
    cols: int
    blocks: list[tuple[int, int, str]] = field(default_factory=list)  # (first col, last col + 1, label), pooled
    title: str = ""


@dataclass
class Loaded:
    """A record's full tensors and its error, or the reason they could not be had."""

    actual: np.ndarray | None = None
    expected: np.ndarray | None = None
    err: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)


class CaseFiles:
    """Opens each of a case's files once. A file a summary names is read only inside its folder
    (through :func:`gdncheck.untrusted.safe_path`): with ``fixtures_dir`` / ``outputs_dir`` given (the
    files moved), the file of the same name there; else, or failing that, the recorded file if it
    lies inside the folder the summary records for its side (``roots``). A name that would lead
    anywhere else gives a note, never a read."""

    def __init__(self, fixtures_dir: str | Path | None, outputs_dir: str | Path | None,
                 roots: dict[str, str | None] | None = None, serving: dict[int, dict] | None = None):
        self.dirs = {"expected": fixtures_dir, "actual": outputs_dir}
        self.roots = roots or {}
        self.serving = serving or {}  # step -> its layout (packed.layouts): a packed stream is read as judged
        self._open: dict[str, SafetensorsFile | str] = {}
        self.stats: dict[str, tuple[CaseStats | None, str | None]] = {}
        # the eps of the gated norm's conditions (metrics.gated_norm_conditions): a summary does not
        # carry the case's config; every committed case has transformers' 1e-6
        self.eps = 1e-6

    def resolve(self, side: str, recorded: str | None) -> tuple[Path | None, list[str]]:
        if not recorded:
            return None, []
        tried: list[str] = []
        candidates = []
        if self.dirs[side] is not None:
            candidates.append((Path(self.dirs[side]), os.path.basename(recorded)))
        root = self.roots.get(side)
        if root is not None and is_within(recorded, root) and Path(recorded).resolve() != Path(root).resolve():
            candidates.append((Path(root), os.path.relpath(Path(recorded).resolve(), Path(root).resolve())))
        elif root is not None:
            tried.append(f"{recorded} (refused: outside the summary's folder {root})")
        for folder, name in candidates:
            try:
                p = safe_path(folder, name.replace(os.sep, "/"), "file")
            except UnsafePathError as exc:
                tried.append(str(exc))
                continue
            tried.append(str(p))
            if p.is_file():
                return p, tried
        return None, tried

    def read_judged(self, side: str, rec: dict, ref_key: str, shape_key: str) -> tuple[np.ndarray | None, str | None]:
        """A record's tensor as verify judged it: a packed call's stream tensor, ``[total_tokens, ...]``
        in the file, as one row ``[1, total_tokens, ...]``."""
        lay = self.serving.get(rec["step"])
        declared, expected = rec.get("shape"), rec.get("expected_shape")
        if side == "actual" and declared is not None and expected is not None and \
                math.prod(declared) != math.prod(expected):  # bounded by the golden: a declared 3 GB is never read
            return None, (f"outputs tensor {(rec.get(ref_key) or {}).get('key')} has shape {list(declared)}, not the "
                          f"golden's {list(expected)}: not read")
        arr, note = self.read(side, rec.get(ref_key), packed.judged_shape(lay, rec["tensor"], rec.get(shape_key)))
        return (packed.as_seen(arr, lay, rec["tensor"]) if arr is not None else None), note

    def read(self, side: str, ref: dict | None, shape: list | None = None) -> tuple[np.ndarray | None, str | None]:
        """(array, None) or (None, a note saying why not). ``shape``: what the summary recorded; a
        tensor of another shape (the file changed since) is not read."""
        what = "fixture" if side == "expected" else "outputs"
        if not ref or not ref.get("file"):
            return None, f"the summary names no {what} file for this tensor"
        path, tried = self.resolve(side, ref["file"])
        if path is None:
            flag = "--fixtures" if side == "expected" else "--outputs"
            return None, (f"{what} file not found (tried {', '.join(tried) or 'nothing: no folder'}): pass {flag} DIR "
                          f"to the report to show plots and worst elements")
        key = str(path)
        if key not in self._open:
            try:
                self._open[key] = SafetensorsFile(path)
            except (GDNError, OSError, ValueError) as exc:
                self._open[key] = f"{what} file {path} unreadable: {exc}"
        f = self._open[key]
        if isinstance(f, str):
            return None, f
        if side == "actual" and ref.get("port_key") is not None:  # written under the port's name (verify --names)
            return self._read_named(f, path, ref, shape)
        if ref.get("key") not in f:
            return None, f"{what} file {path} has no tensor {ref.get('key')}"
        if shape is not None and list(f.shape_of(ref["key"])) != list(shape):
            return None, (f"{what} tensor {ref['key']} in {path} has shape {list(f.shape_of(ref['key']))}, not the "
                          f"{list(shape)} verify judged (the file changed since): not read")
        try:
            return np.asarray(f.read(ref["key"]), dtype=np.float64), None
        except (GDNError, OSError, ValueError) as exc:
            return None, f"{what} tensor {ref['key']} in {path} unreadable: {exc}"

    @staticmethod
    def _read_named(f: SafetensorsFile, path: Path, ref: dict, shape: list | None
                    ) -> tuple[np.ndarray | None, str | None]:
        """A tensor verify read through a name table: the port's key, converted as the summary records
        (``convert``: the table's transpose or split slice, then the golden's shape)."""
        port_key, key = ref["port_key"], ref.get("key")
        conv = recorded_conversion(ref)
        if isinstance(port_key, str) and "convert" not in ref:
            return None, (f"the summary records no conversion of the port's {port_key} (read as {key}): a summary "
                          f"of an older gdncheck; verify again to plot it")
        if not isinstance(port_key, str) or conv is None:
            return None, f"the summary's name-table record of {key} is not one verify writes: not read"
        if port_key not in f:
            return None, f"outputs file {path} has no tensor {port_key} (read as {key} through {ref.get('names')})"
        target = tuple(shape) if shape is not None else None
        whole = tuple(f.shape_of(port_key))
        got = converted_shape(whole, conv, target)
        if target is not None and math.prod(whole) > SPLIT_RATIO * max(1, math.prod(target)):
            return None, (f"outputs tensor {port_key} in {path} has shape {list(whole)}, more than {SPLIT_RATIO} "
                          f"times the {list(shape)} verify judged as {key}: not read")
        if target is not None and got != target:
            return None, (f"outputs tensor {port_key} in {path} gives shape {list(got)} as {key}, not the "
                          f"{list(shape)} verify judged (the file changed since): not read")
        try:
            return np.asarray(convert(f.read(port_key), conv, target), dtype=np.float64), None
        except (GDNError, OSError, ValueError) as exc:
            return None, f"outputs tensor {port_key} in {path} unreadable: {exc}"


def case_stats(files: CaseFiles, records: list[dict], tensor: str) -> tuple[CaseStats | None, str | None]:
    """The scales verify used for ``tensor``: its goldens over every call of the case (cached)."""
    if tensor not in files.stats:
        files.stats[tensor] = _case_stats(files, records, tensor)
    return files.stats[tensor]


def _case_stats(files: CaseFiles, records: list[dict], tensor: str) -> tuple[CaseStats | None, str | None]:
    names = (tensor, "core") if tensor == "core_gated" else (tensor,)  # the gated norm's conditions read core
    arrays: dict[str, dict] = {}
    for r in records:
        if r["tensor"] in names and r["op"] in CALL_OPS:
            arr, note = files.read_judged("expected", r, "expected_ref", "expected_shape")
            if arr is None:
                return None, note
            arrays.setdefault(r["tensor"], {})[r["call"]] = arr
    if tensor not in arrays:
        return None, None
    return metric_stats(arrays, files.eps)[tensor], None


def load(files: CaseFiles, rec: dict, case_records: list[dict], profile: str) -> Loaded:
    out = Loaded()
    actual, note = files.read_judged("actual", rec, "actual_ref", "shape")
    if note:
        out.notes.append(note)
        return out
    exp_ref = rec.get("expected_ref") or {}
    if exp_ref.get("key") is None and rec["op"] == "save":
        expected = np.zeros_like(actual)  # the snapshot of the zero state
    else:
        expected, note = files.read_judged("expected", rec, "expected_ref", "expected_shape")
        if note:
            out.notes.append(note)
            return out
    if actual.shape != expected.shape:
        out.notes.append(f"shapes differ ({list(actual.shape)} written, {list(expected.shape)} expected): no plots")
        return out
    stats, note = case_stats(files, case_records, rec["tensor"])
    if note:
        out.notes.append(note)
        return out
    out.actual, out.expected = actual, expected
    out.err = scaled_error(actual, expected, rec["tensor"], profile, stats, rec.get("call"))
    return out


def check_against_record(err: np.ndarray, metrics: dict | None) -> str | None:
    """A note if the recomputed largest error is not the summary's (the files changed after verify)."""
    if not metrics or not isinstance(metrics.get("max_err"), float | int) or metrics.get("nan"):
        return None
    finite = err[np.isfinite(err)]
    mine = float(finite.max()) if finite.size else 0.0
    theirs = float(metrics["max_err"])
    if not np.isclose(mine, theirs, rtol=1e-9, atol=0.0):
        return (f"the largest error recomputed from the files ({mine:.6g}) is not the summary's ({theirs:.6g}): the "
                f"files changed after verify; the plots show the files, the tables the summary")
    return None


def _nanmax_pool(a: np.ndarray, axis: int, bins: int) -> np.ndarray:
    """Max over ``bins`` near-equal consecutive groups along ``axis`` (NaN propagates: it shows)."""
    n = a.shape[axis]
    if n <= bins:
        return a
    edges = np.linspace(0, n, bins + 1).round().astype(int)
    parts = [np.max(np.take(a, range(edges[i], edges[i + 1]), axis=axis), axis=axis, keepdims=True)
             for i in range(bins)]
    return np.concatenate(parts, axis=axis)


def _blocks(per_block: list[np.ndarray], label: str, max_cols: int) -> tuple[np.ndarray, list]:
    """Side-by-side blocks (heads, or Q|K|V), each pooled to an equal share of ``max_cols``."""
    share = max(1, max_cols // len(per_block))
    pooled = [_nanmax_pool(b, 1, share) for b in per_block]
    cols, blocks = 0, []
    for i, b in enumerate(pooled):
        blocks.append((cols, cols + b.shape[1], f"{label} {i}" if label else ""))
        cols += b.shape[1]
    return np.concatenate(pooled, axis=1), blocks


def heat(err: np.ndarray, tensor: str, row: int, split: tuple[int, int, int] | None = None) -> Heat:
    """The error map of one batch row: token × channel (heads as side-by-side blocks), a state's
    dk × dv per head, a conv state's slot × channel (Q|K|V marked when ``split`` gives the sizes)."""
    e = err[row]
    if tensor == "recurrent_state":  # [Hv, dk, dv]
        heads = [e[h] for h in range(e.shape[0])]
        v, blocks = _blocks([_nanmax_pool(b, 0, HEAT_ROWS) for b in heads], "head", HEAT_COLS)
        return Heat(v, "k (dk)", "v (dv), per head", e.shape[1], e.shape[0] * e.shape[2], blocks)
    if tensor == "conv_state":  # [conv_dim, K] -> slot × channel
        t = e.T
        if split and sum(split) == t.shape[1]:
            edges = np.cumsum((0,) + split)
            parts = [t[:, edges[i]:edges[i + 1]] for i in range(3)]
            v, blocks = _blocks(parts, "", HEAT_COLS)
            blocks = [(a, b, n) for (a, b, _), n in zip(blocks, "QKV")]
        else:
            v, blocks = _nanmax_pool(t, 1, HEAT_COLS), []
        return Heat(v, "slot (oldest first)", "conv channel", t.shape[0], t.shape[1], blocks)
    spec = TENSOR_BY_NAME.get(tensor)
    e2 = e.reshape(e.shape[0], -1) if e.ndim >= 2 else e.reshape(-1, 1)
    T = e2.shape[0]
    if spec is not None and spec.head_axis is not None and e.ndim == 3:  # [T, H, d]
        heads = [e[:, h, :] for h in range(e.shape[1])]
        v, blocks = _blocks([_nanmax_pool(b, 0, HEAT_ROWS) for b in heads], "head", HEAT_COLS)
        return Heat(v, "token", f"{spec.shape[-1]}, per head", T, e2.shape[1], blocks)
    if spec is not None and spec.head_axis is not None and e.ndim == 2:  # [T, H]: one value per head
        return Heat(_nanmax_pool(e2, 0, HEAT_ROWS), "token", "head", T, e2.shape[1])
    rows = _nanmax_pool(e2, 0, HEAT_ROWS)
    if split and tensor in ("qkv", "qkv_conv") and sum(split) == e2.shape[1]:
        edges = np.cumsum((0,) + split)
        v, blocks = _blocks([rows[:, edges[i]:edges[i + 1]] for i in range(3)], "", HEAT_COLS)
        return Heat(v, "token", "channel", T, e2.shape[1], [(a, b, n) for (a, b, _), n in zip(blocks, "QKV")])
    return Heat(_nanmax_pool(rows, 1, HEAT_COLS), "token", "channel", T, e2.shape[1])


def token_curve(err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token, largest error of the token over rows and elements), max-pooled to DRIFT_POINTS bins
    (each bin at its first token); NaN counts as inf."""
    e = np.where(np.isnan(err), np.inf, err)
    per = e.reshape(e.shape[0], e.shape[1], -1).max(axis=(0, 2))
    n = len(per)
    if n <= DRIFT_POINTS:
        return np.arange(n), per
    edges = np.linspace(0, n, DRIFT_POINTS + 1).round().astype(int)
    return edges[:-1], np.array([per[edges[i]:edges[i + 1]].max() for i in range(DRIFT_POINTS)])


def worst(loaded: Loaded, tensor: str, bound: float | None, k: int, seq_pos: list | None) -> list[dict]:
    """The ``k`` elements of largest scaled error (NaN first): index, both values, errors."""
    err = loaded.err
    flat = np.where(np.isnan(err), np.inf, err).ravel()
    k = min(k, flat.size)
    if k == 0:
        return []
    top = np.argpartition(-flat, k - 1)[:k]
    top = top[np.lexsort((top, -flat[top]))]
    names = axis_names(tensor, err.ndim)
    rows = []
    for i in top:
        idx = tuple(int(j) for j in np.unravel_index(int(i), err.shape))
        a, e, s = float(loaded.actual[idx]), float(loaded.expected[idx]), float(err[idx])
        pos = None
        if seq_pos and len(names) > 1 and names[1] == "t" and idx[0] < len(seq_pos):
            pos = seq_pos[idx[0]] + idx[1]
        rows.append({"index": list(idx), "coords": dict(zip(names, idx)), "position": pos, "actual": a,
                     "expected": e, "abs": abs(a - e) if np.isfinite(a) else float("nan"), "err": s,
                     "ratio": (s / bound) if bound else None})
    return rows


def qkv_split(case_records: list[dict]) -> tuple[int, int, int] | None:
    """(key_dim, key_dim, value_dim) from the shapes of the case's q and v records, if any."""
    dims = {}
    for r in case_records:
        shape = r.get("expected_shape") or r.get("shape")
        if r["tensor"] in ("q", "v") and shape and len(shape) == 4:
            dims[r["tensor"]] = shape[2] * shape[3]
    if "q" in dims and "v" in dims:
        return dims["q"], dims["q"], dims["v"]
    return None


def over_by_block(err: np.ndarray, tensor: str, bound: float, split: tuple[int, int, int] | None = None
                  ) -> list[tuple[str, int, int]] | None:
    """(head or Q/K/V segment, elements over the bound, elements) over the whole tensor, when the
    tensor has heads or segments; a wrong head mapping or split shows as a few blocks out of many."""
    over = ~(err <= bound)  # NaN counts as over
    spec = TENSOR_BY_NAME.get(tensor)
    if tensor == "recurrent_state" and err.ndim == 4:
        axis, labels = 1, [f"head {h}" for h in range(err.shape[1])]
    elif spec is not None and spec.head_axis is not None and err.ndim == len(spec.shape) + 1:
        axis = spec.head_axis + 1
        labels = [f"head {h}" for h in range(err.shape[axis])]
    elif split and ((tensor in ("qkv", "qkv_conv") and err.ndim == 3 and err.shape[2] == sum(split))
                    or (tensor == "conv_state" and err.ndim == 3 and err.shape[1] == sum(split))):
        axis = 2 if tensor != "conv_state" else 1
        edges = np.cumsum((0,) + split)
        counts = [np.take(over, range(edges[i], edges[i + 1]), axis=axis) for i in range(3)]
        return [(n, int(c.sum()), int(c.size)) for n, c in zip("QKV", counts)]
    else:
        return None
    moved = np.moveaxis(over, axis, 0).reshape(over.shape[axis], -1)
    return [(label, int(row.sum()), int(row.size)) for label, row in zip(labels, moved)]
