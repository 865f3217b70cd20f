"""The likely cause of a failing case: at its first divergence, which known bug class does the
port's tensor look like?

The port's tensor at the first divergence (`records.FirstDivergence`) is compared with candidates:
transforms of the golden (`transforms`) and what each mutant of a `catalogue` produces on the same
case and profile (injected from above: `catalogue(case, record) -> {name: (bug class, tensor)}`;
the judge never imports a mutant). The residual of each, measured with the judge's denominator
(`metrics.error_denominator`), decides `matches` (at most `MATCH`), `ambiguous` (bug classes
within `EQUALLY_WELL`) or no known bug class. A diagnosis is advice: it never changes a verdict.

How it decides: docs/meta.md, "How the likely cause is decided"; the record: docs/verify.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.harness import CALL_OPS, call_key
from gdncheck.stages import STATE_NAMES, STATE_TENSORS, TENSOR_BY_NAME

from . import symptoms as symptoms_mod
from .metrics import LOG_DECAY_FLOOR, error_denominator, rule_of
from .packed import as_judged

#: A candidate that leaves at most this share of the error unexplained matches.
MATCH = 0.2
#: Candidates whose residuals differ by less than this (or a factor 2) explain the error equally well.
EQUALLY_WELL = 0.01
#: The transforms in order of preference (fewest fitted numbers first).
TRANSFORM_PREFERENCE = ("sign_flip", "state_transposed", "heads_tiled", "heads_interleaved", "token_late",
                        "token_early", "uniform_scale", "per_head_scale")

#: The transforms that are a bug themselves (heads in the other order, the state transposed): matching
#: one names it. The others (a scale, a sign, a shift) describe the error's shape and are said as
#: symptoms (:mod:`.symptoms`), never as a likely cause: an L2-norm eps dk× too large fits "a scale per
#: head" on the one case that shows it, and was named so (issue 42).
BUG_TRANSFORMS = ("state_transposed", "heads_tiled", "heads_interleaved")

#: A catalogue: (case entry, profile, mode, failing record) -> {name: (bug class, tensor)}.
Catalogue = Callable[[dict, str, str, object], dict]


@dataclass(frozen=True)
class Diagnosis:
    """The likely cause at a case's first divergence (module docstring)."""

    verdict: str  # "matches", "ambiguous" or "none"
    tensor: str
    call: int | None
    bug_class: str | None  # the best candidate's bug class
    candidate: str | None  # its name: a transform, or a mutant of the catalogue
    source: str | None  # "transform" or "mutant"
    residual: float | None  # ‖(a − c) / d‖ / ‖(a − e) / d‖ of the best candidate
    candidates: int  # how many were compared
    alternatives: tuple[str, ...] = ()  # ambiguous: the other bug classes that explain it as well
    closest: dict | None = None  # none: the closest candidate {bug_class, candidate, residual}, never shown
    #: where the first divergence says the state's handling is at fault, not the stage whose tensor
    #: shows it (:func:`state_handling`): {op, why}
    state_handling: dict | None = None
    #: ambiguous at the first divergence, told apart by this later failing tensor of the same step
    told_apart_by: str | None = None
    #: matches: the best candidate of another bug class {bug_class, candidate, residual} (None: no other
    #: class explains any of the error), and how many times worse it is than the best
    runner_up: dict | None = None
    #: the symptoms measured on the failing tensor (:mod:`.symptoms`), said before any class name
    symptoms: tuple = ()

    def class_text(self, runner_up: bool = True) -> str:
        """The class part alone: ``matches: X (residual r; runner-up Y, ×m worse)``, ambiguous, none
        (``runner_up`` False: without the runner-up)."""
        if self.verdict == "matches":
            said = f"matches: {self.bug_class} (residual {self.residual:.2g}"
            ru = self.runner_up if runner_up else None
            if ru and ru.get("residual") is not None and math.isfinite(ru["residual"]):
                if ru["residual"] >= 0.5:
                    said += f"; no other class comes near: the nearest, {ru['bug_class']}, leaves {ru['residual']:.2g}"
                else:
                    said += (f"; runner-up {ru['bug_class']} at {ru['residual']:.2g}, "
                             f"×{ru['residual'] / max(self.residual, 1e-12):.2g} worse")
            said += ")"
            if self.told_apart_by:
                said += f"; told apart from the bug classes giving the same {self.tensor} by {self.told_apart_by}"
        elif self.verdict == "ambiguous":
            said = (f"ambiguous: {' or '.join((self.bug_class, *self.alternatives))} (residual {self.residual:.2g}; "
                    "this case cannot tell them apart)")
        else:
            said = "no known bug class matches"
        return said

    def cause_text(self, runner_up: bool = True) -> str:
        """The class part, and where the state's handling is at fault: the text without the symptoms
        (``runner_up`` False: the class without its runner-up, as ``cause`` carries it)."""
        said = self.class_text(runner_up)
        if self.state_handling:
            said = f"state handling ({self.state_handling['op']}): {said}; {self.state_handling['why']}"
        return said

    def text(self) -> str:
        """The symptoms first, then :meth:`cause_text`."""
        said = self.cause_text()
        if self.symptoms:
            said = f"symptoms of {self.tensor}: {symptoms_mod.text(list(self.symptoms))}; {said}"
        return said

    def to_json(self) -> dict:
        d = asdict(self)
        d["alternatives"] = list(self.alternatives)
        d["symptoms"] = [f.to_json() for f in self.symptoms]
        for doc in (d, d["closest"] or {}, d["runner_up"] or {}):
            if doc.get("residual") is not None and not math.isfinite(doc["residual"]):
                doc["residual"] = None
        d["text"] = self.text()
        d["cause"] = self.cause_text(runner_up=False)
        return d


#: Program steps between two calls that only move the state (FORMAT.md §4): the first call after one
#: that fails may have read a state they left wrong.
STATE_MOVES = ("reset", "free", "restore", "load")


def _get(rec, name):
    return rec.get(name) if isinstance(rec, dict) else getattr(rec, name, None)


def state_handling(first, records, program=None) -> dict | None:
    """Whether a case's first divergence ``first`` (a ``FirstDivergence`` or its JSON) points at the
    state's handling rather than at the stage whose tensor shows it: {op, why}, or None.

    - a ``commit`` step computes nothing: a state it leaves wrong is the commit's (which of the
      verify's states it kept, in which slot);
    - a call whose every failing record is a state (``conv_state``, ``recurrent_state``, ``seq_len``)
      computed its outputs right and left the state wrong (which state it wrote, or where);
    - with ``program``: the first call failing after a step that only moves the state (``reset``,
      ``free``, ``restore``, ``load``) may have read a state that step left wrong.
    ``records``: the case's records (``Record`` objects or their JSON)."""
    step, op, tensor = _get(first, "step"), _get(first, "op"), _get(first, "tensor")
    if step is None or tensor is None:
        return None
    here = [r for r in records if _get(r, "verdict") == "fail" and _get(r, "step") == step]
    if op == "commit":
        return {"op": "commit", "why": f"the commit computes nothing: the {tensor} it left is the wrong one of "
                                      "the verify's states, or in the wrong slot (not a bug of the stage that "
                                      "produced it)"}
    held = (*STATE_NAMES, "seq_len")
    if tensor in held and here and all(_get(r, "tensor") in held for r in here):
        return {"op": op, "why": f"the {op} step's outputs are right and the {tensor} it left is not: which "
                                 "state it wrote, or where"}
    if program is not None:
        before = [s.get("op") for s in program[:step]]
        calls = [i for i, o in enumerate(before) if o not in (None, "construct") and o not in STATE_MOVES
                 and o not in ("snapshot", "save")]
        moves = [o for o in before[(calls[-1] + 1 if calls else 0):] if o in STATE_MOVES]
        if moves and calls:
            return {"op": moves[-1], "why": f"the first failing call follows a {moves[-1]} step: the state it read "
                                            "may be what is wrong"}
    return None


def _heads_axis(tensor: str) -> int | None:
    spec = TENSOR_BY_NAME.get(tensor) or next((t for t in STATE_TENSORS if t.name == tensor), None)
    if spec is None or spec.head_axis is None:
        return None
    return spec.head_axis + 1  # the batch axis first


def tiled_order(num_k_heads: int, num_heads: int) -> np.ndarray:
    """Position p of the tiled order holds interleaved head ``order[p]`` (head j = kh·r + i at i·Hk + kh)."""
    r = num_heads // num_k_heads
    return np.array([(p % num_k_heads) * r + p // num_k_heads for p in range(num_heads)])


def _fit_scale(a: np.ndarray, e: np.ndarray, axes) -> np.ndarray:
    """Least-squares scale of e toward a over ``axes`` (kept), on finite elements."""
    ok = np.isfinite(a) & np.isfinite(e)
    aa, ee = np.where(ok, a, 0.0), np.where(ok, e, 0.0)
    num = np.sum(aa * ee, axis=axes, keepdims=True)
    den = np.sum(ee * ee, axis=axes, keepdims=True)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def transforms(actual: np.ndarray, expected: np.ndarray, tensor: str, config: dict | None) -> dict:
    """Candidates from the expected tensor alone: {name: (bug class, tensor of actual's shape)}."""
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    out: dict[str, tuple[str, np.ndarray]] = {}
    if a.shape != e.shape:
        if tensor == "recurrent_state" and a.shape == e.shape[:-2] + e.shape[-1:] + e.shape[-2:-1]:
            out["state_transposed"] = ("the recurrent state transposed ([dv, dk] per head)", np.swapaxes(e, -1, -2))
        return out
    alpha = float(_fit_scale(a, e, None).ravel()[0])
    out["uniform_scale"] = (f"a uniform scale (x{alpha:.4g})", alpha * e)
    out["sign_flip"] = ("the sign flipped", -e)
    axis = _heads_axis(tensor)
    if axis is not None and e.ndim > axis and e.shape[axis] > 1:
        keep = tuple(i for i in range(e.ndim) if i != axis)
        out["per_head_scale"] = ("a scale per head", _fit_scale(a, e, keep) * e)
        if config is not None:
            cfg = GDNConfig.from_hf(dict(config))
            n, hk = e.shape[axis], cfg.num_k_heads
            if n > hk > 1 and n % hk == 0 and n // hk > 1:
                order = tiled_order(hk, n)
                inverse = np.argsort(order)
                out["heads_tiled"] = ("the heads in the tiled order instead of the interleaved one",
                                      np.take(e, order, axis=axis))
                out["heads_interleaved"] = ("the heads in the interleaved order read as tiled",
                                            np.take(e, inverse, axis=axis))
    if tensor == "recurrent_state" and e.shape[-1] == e.shape[-2]:
        out["state_transposed"] = ("the recurrent state transposed ([dv, dk] per head)", np.swapaxes(e, -1, -2))
    if tensor not in STATE_NAMES and e.ndim >= 2 and e.shape[1] > 1:
        late = np.full_like(e, np.nan)
        late[:, 1:] = e[:, :-1]
        early = np.full_like(e, np.nan)
        early[:, :-1] = e[:, 1:]
        out["token_late"] = ("the tokens shifted one later (each token gets its predecessor's value)", late)
        out["token_early"] = ("the tokens shifted one earlier (each token gets its successor's value)", early)
    return out


def _kind(x: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +inf, 3 -inf."""
    return np.where(np.isnan(x), 1, np.where(np.isposinf(x), 2, np.where(np.isneginf(x), 3, 0)))


def residual(actual: np.ndarray, expected: np.ndarray, candidate: np.ndarray, scale=None, noise=None,
             padded: bool = False) -> float:
    """‖(a − c) / d‖ / ‖(a − e) / d‖ over the elements all three hold finite (``padded``: the candidate
    is a shifted transform, whose NaN padding where ``a`` is finite drops those elements). ``scale`` is ``d``
    (broadcast to ``a``; default 1). ``noise``: the judge's element bound in those units; given, only
    the elements where the port or the candidate departs from the golden by more than it count, so
    that two engines' roundings of the same bug are not told apart by their rounding noise.

    Where ``a`` or the candidate is not finite: the share of those places where they differ (a NaN or
    an infinity the candidate does not have, of the same kind, or one the port does not have) is a
    part of the error left unexplained, and the residual is the larger of it and the finite part's;
    inf when the candidate has none of the port's."""
    a, e, c = (np.asarray(x, dtype=np.float64) for x in (actual, expected, candidate))
    if c.shape != a.shape:
        return math.inf
    bad = ~np.isfinite(a)
    extra = ~np.isfinite(c) & ~bad & (np.isinf(c) if padded else True)  # non-finite where the port is not
    missed = 0.0
    if bad.any() or extra.any():
        unmatched = int(np.sum(bad & (_kind(a) != _kind(c))))
        if bad.any() and unmatched == int(bad.sum()):
            return math.inf
        missed = (unmatched + int(extra.sum())) / int((bad | extra).sum())
    d = np.broadcast_to(1.0 if scale is None else np.asarray(scale, dtype=np.float64), a.shape)
    ok = np.isfinite(a) & np.isfinite(c) & np.isfinite(e) & (d > 0)
    with np.errstate(all="ignore"):
        ea, ec = np.abs(a - e) / d, np.abs(c - e) / d
    if noise is not None:
        ok &= (ea > noise) | (ec > noise)
    num = float(np.sqrt(np.sum(((a[ok] - c[ok]) / d[ok]) ** 2)))
    den = float(np.sqrt(np.sum(((a[ok] - e[ok]) / d[ok]) ** 2)))
    if den == 0.0:
        return missed if num == 0.0 and bad.any() else math.inf
    return max(missed, num / den)


def diagnose_tensor(actual, expected, tensor: str, *, call: int | None = None, config: dict | None = None,
                    extra: dict | None = None, scale=None, noise=None) -> Diagnosis:
    """The best candidate for one failing tensor (transforms, then ``extra``: the catalogue's), with
    residuals measured in units of ``scale`` (the judge's error denominator; default absolute)."""
    if rule_of(tensor) == "log_decay":  # below the floor a decay is zero: g is the floor there (metrics)
        actual, expected = (np.maximum(np.asarray(x, dtype=np.float64), LOG_DECAY_FLOOR) for x in (actual, expected))
        extra = {k: (cls, np.maximum(arr, LOG_DECAY_FLOOR)) for k, (cls, arr) in (extra or {}).items()}
    # in order of preference among candidates that explain the error about equally well: a mutant
    # names the bug itself; of the transforms, those with fewer fitted numbers first (a scale per
    # head always fits at least as well as a uniform one)
    cands = [(name, cls, arr, "mutant") for name, (cls, arr) in (extra or {}).items()]
    found = transforms(actual, expected, tensor, config)
    cands += [(name, *found[name], "transform") for name in TRANSFORM_PREFERENCE if name in found]
    scored = [(residual(actual, expected, arr, scale, noise, padded=name in ("token_late", "token_early")), name, cls,
               source) for name, cls, arr, source in cands]
    finite = [s for s in scored if math.isfinite(s[0])]
    if not finite:
        return Diagnosis("none", tensor, call, None, None, None, None, len(cands))
    best = min(s[0] for s in finite)
    near = [s for s in finite if s[0] <= max(2.0 * best, best + EQUALLY_WELL)]
    r, name, cls, source = near[0]
    if source == "transform" and name not in BUG_TRANSFORMS:  # the error's shape, said as a symptom: no class
        return Diagnosis("none", tensor, call, None, None, None, None, len(cands),
                         closest={"bug_class": cls, "candidate": name, "residual": r})
    if r > MATCH:
        return Diagnosis("none", tensor, call, None, None, None, None, len(cands),
                         closest={"bug_class": cls, "candidate": name, "residual": r})
    # a transform describes the error's shape, a mutant names a bug: only mutants of other bug classes
    # giving the same numbers on this case make it ambiguous (the transforms nest, a sign flip being a
    # uniform scale being a per-head one: their order of preference decides among them)
    # (every one about as good, even past MATCH: 0.19 against 0.21 is the port's rounding, not a bug told apart)
    others = () if source != "mutant" else tuple(dict.fromkeys(
        c for _x, _n, c, src in near if c != cls and src == "mutant"))
    rest = sorted((s for s in finite if s[2] != cls and (s[3] == "mutant" or source == "transform")),
                  key=lambda s: s[0])
    runner = {"bug_class": rest[0][2], "candidate": rest[0][1], "residual": rest[0][0]} if rest else None
    return Diagnosis("ambiguous" if others else "matches", tensor, call, cls, name, source, r, len(cands), others,
                     runner_up=None if others else runner)


class Diagnoser:
    """Diagnoses a failing case at its first divergence (verify's ``diagnose`` hook).

    ``catalogue``: candidates from known bug classes run on the case (``conformance/meta``); without
    one, the transforms alone. ``limit``: diagnose at most this many cases of one verify run (the
    catalogue runs every mutant on a case); later ones are left undiagnosed, with a note.
    """

    def __init__(self, catalogue: Catalogue | None = None, limit: int | None = None):
        self.catalogue = catalogue
        self.limit = limit
        self.done = 0

    def __call__(self, judge, report) -> dict | None:
        fd = report.first_divergence
        if fd is None or fd.tensor is None:
            return None
        rec = next((r for r in report.records if r.verdict == "fail" and r.step == fd.step and r.tensor == fd.tensor),
                   None)
        if rec is None or rec.op == "save":  # a saved snapshot file: its state is judged at its call too
            return None
        if self.limit is not None and self.done >= self.limit:
            return {"verdict": "skipped", "text": f"not diagnosed (only the first {self.limit} failing cases are)",
                    "tensor": rec.tensor, "call": rec.call}
        first = self._diagnose(judge, rec)
        if first is None:
            return None
        self.done += 1
        d = first
        if d.verdict == "ambiguous":
            d = self._tell_apart(judge, report, rec, d)
        handling = state_handling(fd, report.records, judge.entry.get("program"))
        d = replace(d, symptoms=tuple(self.symptoms(judge, rec, report.records)))
        d = (replace(d, state_handling=handling) if handling else d).to_json()
        if d["verdict"] == "none" and rec.reason == "routing" and rec.routing:  # what the routing verdict knows
            tok = rec.routing["first"][0]
            known = ("; the first token routed otherwise sits at an exact tie on the k boundary, but the port "
                     "took an expert outside the tied ones" if tok["exact_tie"] else
                     f"; the first token routed otherwise has a probability margin of {tok['prob_margin']:.3g}, "
                     "beyond any rounding")
            d["text"] += known
            d["cause"] += known
        return d


    def symptoms(self, judge, rec, records=()) -> list:
        """The symptoms of one failing record (:mod:`.symptoms`), measured on the port's tensor, its golden
        and the case's other goldens as the judge saw them; [] where they cannot be read."""
        actual, expected = _read_pair(judge, rec)
        if actual is None or not rec.bound:
            return []
        program = judge.entry["program"]
        step = program[rec.step]
        others = {}
        if rec.tensor in STATE_NAMES:
            before = _golden_before(judge, rec)
            if before is not None:
                others["before"] = before
            others["after"] = expected
        else:
            for name in step.get("expected", ()):  # another tensor of this call (q where k belongs)
                key = call_key(rec.call, name)
                if name != rec.tensor and key in judge.gold and tuple(judge.gold.shape_of(key)) == expected.shape:
                    others[f"this call's golden {name}"] = np.asarray(judge.gold.read(key), np.float64)
            for i, st in enumerate(program):
                if i != rec.step and st.get("op") in CALL_OPS and rec.tensor in st.get("expected", ()):
                    key = call_key(st["call"], rec.tensor)
                    if key in judge.gold and tuple(judge.gold.shape_of(key)) == expected.shape and len(others) < 8:
                        others[f"call {st['call']}'s {rec.tensor}"] = np.asarray(judge.gold.read(key), np.float64)
        actual, expected = as_judged(actual, step, rec.tensor), as_judged(expected, step, rec.tensor)
        others = {k: as_judged(v, step, rec.tensor) for k, v in others.items()}
        stats = (getattr(judge, "stats", None) or {}).get(rec.tensor) if rec.tensor not in STATE_NAMES else None
        scale = error_denominator(expected, rec.tensor, judge.profile, stats, rec.call)
        earlier = [r for r in records if r.step is not None and r.step < rec.step]
        earlier_pass = bool(earlier) and all(r.verdict == "pass" for r in earlier)
        return symptoms_mod.measure(actual, expected, rec.tensor, scale=scale, elem=float(rec.bound["elem"]),
                                    profile=judge.profile, config=judge.entry.get("config"),
                                    step=step if "slots" in step else None, others=others, call_step=step,
                                    call=rec.call, earlier_pass=earlier_pass,
                                    goldens=_call_goldens(judge, rec, step),
                                    port_states=_port_states(judge, rec, records))

    def _diagnose(self, judge, rec) -> Diagnosis | None:
        """The diagnosis of one failing record (None: its tensors cannot be read)."""
        inputs = self._inputs(judge, rec)
        if inputs is None:
            return None
        actual, expected, extra, scale, noise = inputs
        return diagnose_tensor(actual, expected, rec.tensor, call=rec.call, config=judge.entry.get("config"),
                               extra=extra, scale=scale, noise=noise)

    def _inputs(self, judge, rec):
        """(actual, expected, the catalogue's candidates, scale, noise) of one failing record, as the
        judge saw it; None where its tensors cannot be read."""
        actual, expected = _read_pair(judge, rec)
        if actual is None:
            return None
        extra = self.catalogue(judge.entry, judge.profile, judge.mode, rec) if self.catalogue else None
        # a packed call's stage tensor [total_tokens, ...] as the judge saw it (one row): its case
        # statistics, and so the residuals' scale, are of that layout (packed.as_judged)
        step = judge.entry["program"][rec.step]
        actual, expected = as_judged(actual, step, rec.tensor), as_judged(expected, step, rec.tensor)
        extra = {k: (cls, as_judged(arr, step, rec.tensor)) for k, (cls, arr) in (extra or {}).items()}
        stats = (getattr(judge, "stats", None) or {}).get(rec.tensor) if rec.tensor not in STATE_NAMES else None
        scale = error_denominator(expected, rec.tensor, judge.profile, stats, rec.call)
        # where the port's failure is its NaN or infinities, only the elements past the element bound
        # count (its finite part is mostly rounding, another engine's than the catalogue's); elsewhere
        # every element does: measured over the kill matrix, the bound everywhere lost more (a
        # precision loss near its bound: softplus_naive 16 -> 6 of 17 right in f32) than it gained
        noise = (rec.bound or {}).get("elem") if not np.all(np.isfinite(actual)) else None
        return actual, expected, extra, scale, noise

    def _tell_apart(self, judge, report, rec, d: Diagnosis) -> Diagnosis:
        """Bug classes that give the same numbers at the first divergence may not at the other tensors
        that fail in the same step (a stale conv window with or without a stale recurrent state: the same
        qkv_conv, another core): the first of those records, in pipeline order, where one of the
        ambiguous classes explains the error (residual at most ``MATCH``) and every other is worse by
        more than what ``diagnose_tensor`` calls equally well (twice, or ``EQUALLY_WELL`` more) decides,
        and the diagnosis says which tensor told them apart. A class merely past ``MATCH`` there is not
        told apart: measured, an L2-norm eps outside the square root run as a port in fla's placement
        in bf16 gave residuals 0.198 (eps as a max) and 0.202 (itself) at the output, which a cut at
        0.2 had named eps as a max."""
        classes = {d.bug_class, *d.alternatives}
        for other in report.records:
            if other is rec or other.verdict != "fail" or other.step != rec.step or other.op == "save":
                continue
            fit = self._class_residuals(judge, other)
            if not fit:
                continue
            ranked = sorted((*fit.get(c, (math.inf, None)), c) for c in classes)
            (best, name, cls), rest = ranked[0], ranked[1:]
            if best <= MATCH and all(r > max(2.0 * best, best + EQUALLY_WELL) for r, _n, _c in rest):
                return replace(d, verdict="matches", alternatives=(), told_apart_by=other.tensor, bug_class=cls,
                               candidate=name)
        return d

    def _class_residuals(self, judge, rec) -> dict[str, tuple[float, str]]:
        """Each catalogue bug class's best residual on one failing record, with the mutant giving it
        ({} where it cannot be read or no catalogue runs)."""
        inputs = self._inputs(judge, rec)
        if inputs is None:
            return {}
        actual, expected, extra, scale, noise = inputs
        if rule_of(rec.tensor) == "log_decay":  # as diagnose_tensor reads a log decay
            actual, expected = (np.maximum(x, LOG_DECAY_FLOOR) for x in (actual, expected))
            extra = {k: (cls, np.maximum(arr, LOG_DECAY_FLOOR)) for k, (cls, arr) in (extra or {}).items()}
        best: dict[str, tuple[float, str]] = {}
        for name, (cls, arr) in (extra or {}).items():
            r = residual(actual, expected, arr, scale, noise)
            if math.isfinite(r) and r < best.get(cls, (math.inf, ""))[0]:
                best[cls] = (r, name)
        return best


def _read_pair(judge, rec) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The port's tensor and the golden of a call's record, read through the judge's open files."""
    key = (rec.expected_ref or {}).get("key")
    if key is None or judge.outs is None or judge.gold is None or key not in judge.outs or key not in judge.gold:
        return None, None
    shape = tuple(judge.gold.shape_of(key))
    if tuple(judge.outs.shape_of(key, shape)) != shape:  # bounded by the header: never more than the golden
        return None, None
    return (np.asarray(judge.outs.read(key, judge.gold.shape_of(key)), dtype=np.float64),
            np.asarray(judge.gold.read(key), dtype=np.float64))


def _call_goldens(judge, rec, step) -> dict:
    """The goldens of ``rec``'s call that :func:`.symptoms.measure` reads beside the failing tensor: the
    decay ``g`` (where non-finite values start), and for a failing ``core`` of a call that is not packed
    the delta rule's inputs and the recurrent state before the call (the decay's order), for a failing
    ``x_norm`` or ``h_norm`` the norm's input (where the eps decides)."""
    out = {}
    names = ("g", "q", "k", "v", "beta") if rec.tensor == "core" and "cu_seqlens" not in step else ("g",)
    for name in names:
        key = call_key(rec.call, name)
        if name in step.get("expected", ()) and key in judge.gold:
            out[name] = np.asarray(judge.gold.read(key), np.float64)
    norm_input = {"x_norm": "x", "h_norm": "h"}.get(rec.tensor)  # a norm's input, for where its eps decides
    if norm_input and call_key(rec.call, norm_input) in judge.gold and "cu_seqlens" not in step:
        out[norm_input] = np.asarray(judge.gold.read(call_key(rec.call, norm_input)), np.float64)
    if len(out) == 5:
        key = call_key(rec.call, "recurrent_state")
        before = _golden_before(judge, replace(rec, tensor="recurrent_state", expected_ref={"key": key})) \
            if key in judge.gold else None
        if before is not None:
            out["state_before"] = before
    return out


def _port_states(judge, rec, records) -> dict:
    """name -> (the port's, the golden) state of ``rec``'s step, for each state record of it that fails."""
    out = {}
    for r in records:
        if r.step == rec.step and r.tensor in STATE_NAMES and r.verdict == "fail" and r.op != "save":
            a, e = _read_pair(judge, r)
            if a is not None:
                out[r.tensor] = (a, e)
    return out


def _golden_before(judge, rec) -> np.ndarray | None:
    """The golden state ``rec.tensor`` before ``rec``'s step: the previous step's, when that is a call
    that keeps it (a step between, a ``free`` or a ``restore``, changes the state unrecorded); the zero
    state before the first call."""
    program = judge.entry["program"]
    prev = program[rec.step - 1] if rec.step > 0 else None
    key = (rec.expected_ref or {}).get("key")
    if prev is None or key is None:
        return None
    if prev.get("op") == "construct":
        return np.zeros(tuple(judge.gold.shape_of(key)))
    if prev.get("op") not in CALL_OPS or rec.tensor not in prev.get("expected", ()):
        return None
    k = call_key(prev["call"], rec.tensor)
    if k not in judge.gold or tuple(judge.gold.shape_of(k)) != tuple(judge.gold.shape_of(key)):
        return None
    return np.asarray(judge.gold.read(k), dtype=np.float64)


def advise(diagnose: Callable, judge, report) -> dict | None:
    """``diagnose(judge, report)``, or why it could not run: a diagnosis is advice, so nothing it
    raises reaches the verdict (verify's hook), and nothing it computes reaches the console: the
    catalogue's mutants overflow and divide by zero by design (a missing L2 norm in bf16), and NumPy's
    warnings about that are not the user's business."""
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return diagnose(judge, report)
    except Exception as exc:  # noqa: BLE001 - advice only: the verdict stands whatever goes wrong here
        return {"verdict": "error", "text": f"no diagnosis: {type(exc).__name__}: {exc}", "tensor": None, "call": None}
