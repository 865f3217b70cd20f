"""Symptoms of a failing tensor: facts measured on the port's tensor, its golden and the case's other
goldens, that hold for any bug, named or not (issue 42; docs/verify.md, "The likely cause").

Kinds of fact, each stated only where the measurement supports it by a clear margin (saying
nothing beats a wrong fact):

- **where** the error sits: which heads (every head; the value heads of one key head; every s-th; one),
  which tokens (from token t on; only token 0; growing with the token; only the first K−1 of each
  sequence), which sequences of a packed call (its verify rows, its plain rows), which slots of a pool
  (the step's own, its snapshot destinations, slots it must not touch), which channels (q, k or v);
- what the tensor **equals** instead: another golden of the case (the state before the step, the zero
  state, another call's tensor, another slot, the state after j draft tokens of a verify window),
  within the judge's own element bound everywhere;
- a **relation** to the golden: a uniform scale (a sign), a scale per head, per channel or per vector,
  the state transposed, the heads permuted (found by assignment), the tokens shifted by one or reversed
  in time; an elementwise map with nothing fitted (SiLU missing, silu(z) replaced by sigmoid(z)), the
  gated norm's parts rearranged; the error's size in a coarser dtype's rounding units;
- a **precision** (the port's values on a coarser grid than the profile keeps), **non-finite** values
  (where they start; the heads whose cumulative decay underflows float32), the decay's **order** (the
  delta rule rerun on the call's goldens), an **eps** (only the smallest-norm vectors fail; the norm per
  vector off only there, more the smaller), an **absolute error** in the gates (it does not shrink with
  the value: log(1 + e^x) in float32), gate **values** lost to exactly 0, the **decay** at an extreme
  (the failing heads are those whose e^g leaves [1e-4, 1 − 1e-4]).

A relation is stated when it leaves at most :data:`EXPLAINED` of the error unexplained (the error's
norm in the judge's units, ``‖(a − r(e)) / d‖ / ‖(a − e) / d‖``). Pure NumPy (and SciPy's assignment);
every fact is a :class:`Fact` with a machine code (``kind:what``) that the kill matrix checks against
each mutant's declared ground truth (``conformance/meta/truth.py``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.stages import STATE_NAMES, STATE_TENSORS, TENSOR_BY_NAME

#: A relation must leave at most this share of the error unexplained to be stated.
EXPLAINED = 0.1
#: A relation fitting one number per vector, per channel or per (head, channel) must explain this much:
#: with that many numbers an error of another shape fits to a few per cent (measured: a gate applied
#: before the norm fits a scale per vector to 0.03), an exact scale of the golden to its rounding.
MANY_FITTED = 0.01
#: A fitted scale is said only when it is this far from 1 (else it is no scale but the error itself).
SCALE_OFF = 0.02
#: The tensors a conv window makes: only there are "the first K−1 tokens" the conv's own
CONV_TENSORS = ("qkv_conv",)
#: The dtypes whose rounding units the error's size is said in, by significand bits (hidden included).
ROUNDING_BITS = {"bf16": 8, "f16": 11}


@dataclass(frozen=True)
class Fact:
    """One measured fact: ``kind`` where / equals / relation / precision / nonfinite / order / eps / error /
    values / decay, ``code`` what it
    says (machine-readable, ``heads:group``, ``tokens:from``, ``equals:before``, ``relation:uniform_scale``,
    ``precision:bf16``...), ``text`` said."""

    kind: str
    code: str
    text: str

    def to_json(self) -> dict:
        return asdict(self)


def _spec(tensor: str):
    return TENSOR_BY_NAME.get(tensor) or next((t for t in STATE_TENSORS if t.name == tensor), None)


def _dims(config: dict | None) -> dict | None:
    if not config:
        return None
    g = lambda k, d=None: config.get(k, d)  # noqa: E731 - Hugging Face keys, read once
    return {"Hk": int(g("linear_num_key_heads", 1)), "Hv": int(g("linear_num_value_heads", 1)),
            "dk": int(g("linear_key_head_dim", 1)), "dv": int(g("linear_value_head_dim", 1)),
            "K": int(g("linear_conv_kernel_dim", 4))}


def explained(a: np.ndarray, e: np.ndarray, c: np.ndarray, d: np.ndarray) -> float:
    """``‖(a − c) / d‖ / ‖(a − e) / d‖`` over the elements the three hold finite (inf: nothing to compare)."""
    ok = np.isfinite(a) & np.isfinite(e) & np.isfinite(c) & (d > 0)
    if not ok.any():
        return math.inf
    den = float(np.sqrt(np.sum(((a[ok] - e[ok]) / d[ok]) ** 2)))
    if den == 0.0:
        return math.inf
    return float(np.sqrt(np.sum(((a[ok] - c[ok]) / d[ok]) ** 2))) / den


def within(a, e, c, d, elem: float) -> float:
    """The share of the failing elements (over the element bound against the golden) that ``c`` puts
    within the bound: a fit seen through the port's rounding (bf16) rather than by its norm. 0 unless
    the failing elements are, in the median, ten times past the bound: near the bound, a fit of many
    numbers puts elements within it whatever the error's shape (measured: an f16 state in bf16 on
    sigmoid-edges, one head a few times past, fitted a scale per (head, channel) to 99 %)."""
    ok = np.isfinite(a) & np.isfinite(e) & np.isfinite(c) & (d > 0)
    with np.errstate(all="ignore"):
        err = np.abs(a - e) / d
        failing = ok & (err > elem)
        if not failing.any() or float(np.median(err[failing])) < 10 * elem:
            return 0.0
        return float(np.mean(np.abs(a[failing] - c[failing]) / d[failing] <= elem))


def _many_fit(r: float, a, e, c, d, elem: float | None) -> bool:
    """One number per channel, per (head, channel) or per vector explains the error: at most
    :data:`MANY_FITTED` of it left, or (the port's own rounding left above that) at most a twentieth
    left and 99 % of the failing elements put within the judge's bound."""
    return r <= MANY_FITTED or (elem is not None and r <= EXPLAINED / 2 and within(a, e, c, d, elem) >= 0.99)


def close(a: np.ndarray, c: np.ndarray, d: np.ndarray, elem: float) -> bool:
    """``a`` equals ``c`` within the judge's element bound everywhere (the same non-finite values too)."""
    if a.shape != c.shape:
        return False
    fa, fc = np.isfinite(a), np.isfinite(c)
    if not np.array_equal(fa, fc) or not np.array_equal(np.where(fa, 0, a), np.where(fc, 0, c), equal_nan=True):
        return False
    with np.errstate(all="ignore"):
        err = np.abs(np.where(fa, a - c, 0.0)) / d
    return bool(np.all(err[fa] <= elem))


def _list(xs) -> str:
    xs = [int(x) for x in xs]
    if len(xs) > 2 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}-{xs[-1]}"
    return ", ".join(str(x) for x in xs) if len(xs) <= 8 else ", ".join(str(x) for x in xs[:8]) + ", ..."


# --- where ---------------------------------------------------------------------------------------


def heads_fact(bad_heads: np.ndarray, n: int, dims: dict | None, kind: str = "value") -> Fact | None:
    """Which heads hold the elements over the bound (``bad_heads``: a boolean per head)."""
    bad = [int(h) for h in np.flatnonzero(bad_heads)]
    if not bad or n < 2:
        return None
    if len(bad) == n:
        return Fact("where", "heads:all", f"every {kind} head")
    if len(bad) == 1:
        return Fact("where", "heads:one", f"only {kind} head {bad[0]} of {n}")
    if dims and kind == "value" and dims["Hv"] == n and n > dims["Hk"] > 1:
        r = n // dims["Hk"]
        groups = {h // r for h in bad}
        if len(groups) == 1 and len(bad) == r:
            kh = groups.pop()
            return Fact("where", "heads:group", f"only the value heads of key head {kh} (heads {_list(bad)} of {n})")
    steps = {b - a for a, b in itertools.pairwise(bad)}
    if len(steps) == 1 and (s := steps.pop()) > 1:
        return Fact("where", "heads:stride",
                    f"every {_ordinal(s)} {kind} head from head {bad[0]} (heads {_list(bad)} of {n})")
    return Fact("where", "heads:some", f"only {kind} heads {_list(bad)} of {n}")


def tokens_fact(bad_tokens: np.ndarray, err_by_token: np.ndarray, elem: float, K: int | None,
                seq_starts: list[int] | None = None) -> Fact | None:
    """Which tokens hold the elements over the bound (``bad_tokens``: per token of a row; ``err_by_token``:
    the worst scaled error of each token)."""
    T = len(bad_tokens)
    bad = np.flatnonzero(bad_tokens)
    if not len(bad) or T < 2:
        return None
    t0 = int(bad[0])
    if seq_starts is None and K and K > 1 and T > K - 1 and bad[-1] < K - 1:
        return Fact("where", "tokens:conv_head", f"only tokens {_list(bad)}, within the first K−1 = {K - 1}, the "
                                                 "tokens whose conv window reaches into the state")
    if len(bad) == 1 and t0 == 0:
        return Fact("where", "tokens:only0", f"only token 0 of {T}")
    if len(bad) == T - t0:  # every token from t0 on
        fin = err_by_token[t0:]
        if T - t0 >= 4 and np.all(np.isfinite(fin)):
            q = max(1, (T - t0) // 4)
            early, late = float(np.median(fin[:q])), float(np.median(fin[-q:]))
            if early > 0 and late > 10.0 * early and np.mean(np.diff(fin) >= 0) > 0.6:
                return Fact("where", "tokens:growing", f"on every token from token {t0} on, growing with the token "
                                                       f"(×{late / early:.2g} from the first quarter to the last)")
        if t0 == 0:
            return Fact("where", "tokens:all", f"on every token (all {T})")
        quiet = float(np.max(err_by_token[:t0]))
        # said only with a clear margin: the tokens before within a tenth of the bound (a bug of every
        # token whose first token happens to fall just under the bound is no "from token t on")
        if quiet <= 0.1 * elem:
            return Fact("where", "tokens:from", f"within a tenth of the bound before token {t0}, over it on every "
                                                f"token from {t0} on")
        return None
    if len(bad) <= 8:
        return Fact("where", "tokens:some", f"only tokens {_list(bad)} of {T}")
    return None


def channels_fact(bad_channels: np.ndarray, dims: dict | None) -> Fact | None:
    """Which q/k/v segment of the conv channels holds the elements over the bound."""
    if dims is None:
        return None
    nq = dims["Hk"] * dims["dk"]
    nv = dims["Hv"] * dims["dv"]
    if len(bad_channels) != 2 * nq + nv:
        return None
    seg = {"q": bad_channels[:nq].any(), "k": bad_channels[nq:2 * nq].any(), "v": bad_channels[2 * nq:].any()}
    on = [s for s, b in seg.items() if b]
    if len(on) in (1, 2):
        return Fact("where", "channels:" + "+".join(on), f"only in the {' and '.join(on)} channels of the conv")
    return None


def rows_fact(bad_tokens: np.ndarray, step: dict) -> Fact | None:
    """Which sequences of a packed call hold the elements over the bound."""
    cu = [int(c) for c in step.get("cu_seqlens", [])]
    if len(cu) < 3:
        return None
    n = len(cu) - 1
    bad = [i for i in range(n) if bad_tokens[cu[i]:cu[i + 1]].any()]
    if not bad or len(bad) == n:
        return None
    flags = step.get("verify")
    if step["op"] == "forward_mixed" and flags:
        verify = {i for i in range(n) if flags[i]}
        if set(bad) <= verify and len(verify) < n:
            return Fact("where", "rows:verify", f"only sequences {_list(bad)} of {n}: verify rows")
        if not set(bad) & verify:
            return Fact("where", "rows:plain", f"only sequences {_list(bad)} of {n}: plain rows")
    if all(step["slots"][i] == PAD_SLOT_ID for i in bad):
        return Fact("where", "rows:padding", f"only the padding sequence(s) {_list(bad)}")
    return Fact("where", "rows:some", f"only sequences {_list(bad)} of {n}")


def slot_roles(step: dict) -> dict[int, str]:
    """Each pool slot a serving step names: ``own`` (a sequence's slot the step writes), ``verify``
    (a verify row's, not written by the call), ``snapshot`` (a snapshot destination)."""
    roles: dict[int, str] = {}
    flags = step.get("verify")
    for i, s in enumerate(step.get("slots", [])):
        if s == PAD_SLOT_ID:
            continue
        if step["op"] == "commit":
            roles[s] = "own" if step["accepted"][i] > 0 else "kept"
        elif step["op"] == "verify_spec" or (flags and flags[i]):
            roles[s] = "verify"
        else:
            roles[s] = "own"
    for s in step.get("snap_slot", []):
        roles[int(s)] = "snapshot"
    return roles


def slots_fact(bad_slots: list[int], step: dict) -> Fact | None:
    """Which slots of a pool hold the elements over the bound, by their role in the step."""
    roles = slot_roles(step)
    kinds = {roles.get(s, "untouched") for s in bad_slots}
    said = {"own": "the step's own slots", "snapshot": "its snapshot destinations", "verify": "verify rows' slots",
            "kept": "slots the step keeps as they were", "untouched": "slots the step must not touch"}
    if len(kinds) == 1:
        k = kinds.pop()
        word = "slot" if len(bad_slots) == 1 else "slots"
        return Fact("where", f"slots:{k}", f"only {word} {_list(bad_slots)}: {said[k]}")
    parts = []
    for k in ("own", "snapshot", "verify", "kept", "untouched"):
        ss = [s for s in bad_slots if roles.get(s, "untouched") == k]
        if ss:
            parts.append(f"{_list(ss)} ({said[k]})")
    return Fact("where", "slots:mixed", "slots " + "; ".join(parts))


# --- equals ----------------------------------------------------------------------------------------


def slot_meaning(step: dict | None, which: str, slot: int) -> str | None:
    """What golden pool slot ``slot`` holds, in a commit's terms: ``which`` "before" (the pool before the
    step) or "after" (the golden after it)."""
    if step is None or step.get("op") != "commit":
        return None
    for i, s in enumerate(step["slots"]):
        if s != slot or s == PAD_SLOT_ID:
            continue
        n = int(step["accepted"][i])
        if which == "before":
            return f"the state before sequence {i}'s draft window (0 draft tokens)"
        if n > 0:
            return f"the state after {n} draft token(s) of sequence {i}"
    for m, d in enumerate(step.get("snap_slot", [])):
        if d == slot and which == "after":
            return f"the state after {step['snap_offset'][m]} draft token(s) of sequence {step['snap_seq'][m]}"
    return None


def asked(step: dict | None, slot: int) -> str | None:
    """What a commit asks slot ``slot`` to hold, said as :func:`slot_meaning` says what it holds."""
    return slot_meaning(step, "after", slot) if step is not None else None


def equals_pool(actual, expected, d, elem, bad_slots, step, others) -> list[Fact]:
    """For each slot over the bound, the golden slot it holds instead: the same or another slot of
    another golden pool of the case (``others``: label -> pool), the zero state, or the slot as it was."""
    facts = []
    for s in bad_slots[:6]:
        a = actual[s]
        if close(a, np.zeros_like(a), d[s], elem):
            facts.append(Fact("equals", "equals:zero", f"slot {s} holds the zero state"))
            continue
        hit = None
        for label, pool in others.items():
            if pool.shape != actual.shape:
                continue
            order = [s] + [t for t in range(pool.shape[0]) if t != s]
            for t in order:
                if close(a, pool[t], d[s], elem):
                    hit = (label, t, pool)
                    break
            if hit:
                break
        if hit is None:
            continue
        label, t, _ = hit
        which = "before" if label == "before" else "after" if label == "after" else None
        meaning = slot_meaning(step, which, t) if which else None
        want = asked(step, s)
        if meaning:
            text = f"slot {s} holds {meaning}" + (f" (the golden of slot {t})" if t != s else "")
            code = "equals:draft_state" if "draft" in meaning and "0 draft" not in meaning else "equals:before"
        elif label == "before":
            text = (f"slot {s} holds what it held before the step (left unchanged)" if t == s
                    else f"slot {s} holds what slot {t} held before the step")
            code = "equals:before" if t == s else "equals:other_slot"
        elif label == "after":
            text, code = f"slot {s} holds the state the step should leave in slot {t}", "equals:other_slot"
        else:
            text = f"slot {s} holds {label}'s slot {t}" if t != s else f"slot {s} holds its state {label}"
            code = "equals:other_call"
        if label == "before" and t == s and s in slot_roles(step) and slot_roles(step)[s] in ("own", "snapshot"):
            text += " (left unchanged, but this step should write it)"
        if want and want != meaning:
            text += f"; the step asked for {want}"
        facts.append(Fact("equals", code, text))
    return facts


def equals_tensor(actual, expected, d, elem, others) -> Fact | None:
    """The golden the whole tensor equals instead: another call's same tensor, the state before the call,
    the zero state."""
    if close(actual, np.zeros_like(actual), d, elem) and not close(expected, np.zeros_like(expected), d, elem):
        return Fact("equals", "equals:zero", "it is all zeros (the zero state)")
    for label, arr in others.items():
        if arr.shape == actual.shape and close(actual, arr, d, elem):
            code = ("equals:before" if label == "before" else "equals:other_tensor" if label.startswith("this call")
                    else "equals:other_call")
            return Fact("equals", code, f"it equals {'the state before the call' if label == 'before' else label}")
    return None


# --- relations -------------------------------------------------------------------------------------


def _fit(a, e, keep_axes) -> np.ndarray:
    ok = np.isfinite(a) & np.isfinite(e)
    aa, ee = np.where(ok, a, 0.0), np.where(ok, e, 0.0)
    axes = tuple(i for i in range(a.ndim) if i not in keep_axes)
    num, den = np.sum(aa * ee, axis=axes, keepdims=True), np.sum(ee * ee, axis=axes, keepdims=True)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)


def _enough(a: np.ndarray, keep: tuple[int, ...]) -> bool:
    """A fit of one number per index of the axes ``keep`` has at least four elements per number (with
    one token a scale per (head, channel) is one per element: it fits anything)."""
    params = int(np.prod([a.shape[i] for i in keep])) if keep else 1
    return a.size >= 4 * params


def _scale_text(alpha: float, dims: dict | None) -> str:
    named = [("2", 2.0), ("1/2", 0.5)]
    if dims:
        named += [("√dk", math.sqrt(dims["dk"])), ("1/√dk", 1 / math.sqrt(dims["dk"]))]
    for name, v in named:
        if abs(alpha / v - 1) < 0.01:
            return f"×{alpha:.4g} (≈ {name})"
    return f"×{alpha:.4g}"


def relations(a, e, d, tensor: str, dims: dict | None, head_axis: int | None, token_axis: int | None,
              elem: float | None = None) -> list[Fact]:
    """The relations of :mod:`this module <symptoms>` that explain the error (at most one of the scales)."""
    out: list[Fact] = []
    if a.shape != e.shape:
        if a.ndim >= 2 and a.shape == e.shape[:-2] + e.shape[-1:] + e.shape[-2:-1]:
            return [Fact("relation", "relation:transpose", "its shape is the golden's last two axes swapped "
                                                            "(the state transposed)")]
        return out
    alpha = float(_fit(a, e, ()).ravel()[0])
    r = explained(a, e, alpha * e, d)
    if r <= EXPLAINED and abs(alpha + 1) < SCALE_OFF:
        out.append(Fact("relation", "relation:sign", f"the golden with its sign flipped (residual {r:.2g})"))
    elif r <= EXPLAINED and abs(alpha - 1) > SCALE_OFF and abs(alpha) >= 0.05:  # ×0 is no scale but a zero
        out.append(Fact("relation", "relation:uniform_scale",
                        f"the golden times one uniform scale {_scale_text(alpha, dims)} (residual {r:.2g})"))
    else:
        fitted = False
        if head_axis is not None and a.shape[head_axis] > 1 and _enough(a, (head_axis,)):
            s = _fit(a, e, (head_axis,))
            r = explained(a, e, s * e, d)
            vals = s.ravel()
            # one number per head fitted: stated at half the residual of a uniform scale, and only with every
            # scale positive and not near zero (a head near zero is no scale of the golden but its loss)
            if r <= EXPLAINED / 2 and np.ptp(vals) > SCALE_OFF and np.max(np.abs(vals - 1)) > SCALE_OFF \
                    and np.min(vals) > 0.05:
                shown = ", ".join(f"{v:.3g}" for v in vals[:8]) + (", ..." if len(vals) > 8 else "")
                out.append(Fact("relation", "relation:per_head_scale",
                                f"the golden times a scale per head [{shown}] (residual {r:.2g})"))
                fitted = True
        feature_last = head_axis != a.ndim - 1  # the last axis a vector's features, not the heads (g, beta)
        if not fitted and feature_last and a.ndim >= 2 and a.shape[-1] > 1:
            # many numbers fitted: stated at MANY_FITTED (a weight's channels may be of any sign)
            last = a.ndim - 1
            tries = [("relation:per_channel_scale", (last,), "the golden times a scale per channel of its last axis")]
            if head_axis is not None and head_axis != last:
                tries.append(("relation:head_channel_scale", (head_axis, last),
                              "the golden times a scale per head and channel (one per weight of a [H, d] vector)"))
            for code, keep, said in tries:
                if not _enough(a, keep):
                    continue
                sc = _fit(a, e, keep)
                rc = explained(a, e, sc * e, d)
                if _many_fit(rc, a, e, sc * e, d, elem) and np.max(np.abs(sc - 1)) > SCALE_OFF:
                    out.append(Fact("relation", code, f"{said} (residual {rc:.2g})"))
                    fitted = True
                    break
        if not fitted and feature_last and a.ndim >= 2 and a.shape[-1] >= 4:
            sv = _fit(a, e, tuple(range(a.ndim - 1)))  # a scale per vector: each last-axis vector as a whole
            rv = explained(a, e, sv * e, d)
            if _many_fit(rv, a, e, sv * e, d, elem) and np.max(np.abs(sv - 1)) > SCALE_OFF and np.min(sv) > 0.05:
                lo, hi = float(np.min(sv)), float(np.max(sv))
                out.append(Fact("relation", "relation:vector_scale",
                                f"each {'head' if head_axis is not None else 'token'}'s vector of the golden scaled as "
                                f"a whole, by {lo:.3g} to {hi:.3g} (residual {rv:.2g})"))
                fitted = True
        if not fitted and head_axis is not None and not feature_last:  # one value per head: g, beta, a, b
            f = monotone_fact(a, e, head_axis)
            if f:
                out.append(f)
    if tensor == "conv_state" and a.shape[-1] > 1:  # [.., C, K]: the window's columns, oldest first
        for code, sa, se, text in (("relation:window_shift", slice(0, -1), slice(1, None),
                                    "each column of the conv window holds the golden's next one (the window one "
                                    "token stale)"),
                                   ("relation:window_shift", slice(1, None), slice(0, -1),
                                    "each column of the conv window holds the golden's previous one")):
            r = explained(a[..., sa], e[..., sa], e[..., se], d[..., sa])
            if r <= EXPLAINED:
                out.append(Fact("relation", code, f"{text} (residual {r:.2g})"))
                break
    if tensor == "recurrent_state" and a.ndim >= 2 and a.shape[-1] == a.shape[-2] and a.shape[-1] > 1:
        r = explained(a, e, np.swapaxes(e, -1, -2), d)
        if r <= EXPLAINED:
            out.append(Fact("relation", "relation:transpose", f"the golden with each head's state transposed "
                                                              f"(residual {r:.2g})"))
    if head_axis is not None and a.shape[head_axis] > 2:
        perm = head_permutation(a, e, d, head_axis)
        if perm is not None:
            r = explained(a, e, np.take(e, perm, axis=head_axis), d)
            if r <= EXPLAINED:
                out.append(Fact("relation", "relation:head_perm", _perm_text(perm, dims) + f" (residual {r:.2g})"))
    if token_axis is not None and a.shape[token_axis] > 2:
        T = a.shape[token_axis]
        for code, src, text in (("relation:shift_late", slice(0, T - 1), "each token holds its predecessor's golden"),
                                ("relation:shift_early", slice(1, T), "each token holds its successor's golden")):
            sl_a = [slice(None)] * a.ndim
            sl_a[token_axis] = slice(1, T) if code.endswith("late") else slice(0, T - 1)
            sl_e = [slice(None)] * a.ndim
            sl_e[token_axis] = src
            r = explained(a[tuple(sl_a)], e[tuple(sl_a)], e[tuple(sl_e)], d[tuple(sl_a)])
            if r <= EXPLAINED:
                out.append(Fact("relation", code, f"{text}: the tokens shifted by one (residual {r:.2g})"))
        r = explained(a, e, np.flip(e, axis=token_axis), d)
        if r <= EXPLAINED:
            out.append(Fact("relation", "relation:reversed",
                            f"the golden's tokens in reverse order (residual {r:.2g})"))
    return out


def monotone_fact(a, e, head_axis: int | None) -> Fact | None:
    """Each head's values (or the whole tensor's) an increasing or a decreasing function of the golden's
    (rank correlation at least 0.999 on every head, the same direction on all), far from the golden
    itself (the error at least 5 % of its size): the same input through another map."""
    from scipy.stats import spearmanr

    groups = ([np.take(a, h, axis=head_axis).ravel() for h in range(a.shape[head_axis])],
              [np.take(e, h, axis=head_axis).ravel() for h in range(a.shape[head_axis])]) \
        if head_axis is not None else ([a.ravel()], [e.ravel()])
    signs = set()
    for ga, ge in zip(*groups):
        ok = np.isfinite(ga) & np.isfinite(ge)
        ga, ge = ga[ok], ge[ok]
        if len(ga) < 8 or np.ptp(ge) == 0 or np.ptp(ga) == 0:
            return None
        rho = float(spearmanr(ga, ge).statistic)
        if not abs(rho) >= 0.999:
            return None
        signs.add(rho > 0)
    if len(signs) != 1:
        return None
    ok = np.isfinite(a) & np.isfinite(e)
    if np.linalg.norm(a[ok] - e[ok]) < 0.05 * np.linalg.norm(e[ok]):
        return None
    way = "an increasing" if signs.pop() else "a decreasing"
    where = "each head's values are" if head_axis is not None else "its values are"
    return Fact("relation", "relation:monotone_map", f"{where} {way} function of the golden's (rank correlation "
                                                     "≥ 0.999), not a scale of them")


def ratio_fact(a, e, others: dict) -> Fact | None:
    """The port's value over the golden's, element by element, a monotone function of another golden
    tensor of the same call (rank correlation at least 0.999 where the golden is not near zero): the
    error is in how that tensor enters (an output gate of z)."""
    from scipy.stats import spearmanr

    ok = np.isfinite(a) & np.isfinite(e) & (np.abs(e) > 1e-3 * max(float(np.max(np.abs(e[np.isfinite(e)]),
                                                                                   initial=0.0)), 1e-30))
    if ok.sum() < 16:
        return None
    ratio = a[ok] / e[ok]
    if np.ptp(ratio) < SCALE_OFF:
        return None
    for label, other in others.items():
        if not label.startswith("this call's golden") or other.shape != a.shape:
            continue
        x = other[ok]
        if not np.all(np.isfinite(x)) or np.ptp(x) == 0:
            continue
        rho = float(spearmanr(ratio, x).statistic)
        if abs(rho) >= 0.999:
            name = label.removeprefix("this call's golden ")
            way = "an increasing" if rho > 0 else "a decreasing"
            return Fact("relation", "relation:ratio_map", f"its ratio to the golden is {way} function of this "
                                                          f"call's {name}, element by element (rank correlation "
                                                          f"{abs(rho):.4f})")
    return None


def calls_fact(step: dict | None, earlier_pass: bool, call: int | None) -> Fact | None:
    """Every call before this one passes, and this one continues requests an earlier call left (every
    sequence at a position past 0): what the state carries between calls is the first thing wrong."""
    if step is None or not call or not earlier_pass:
        return None
    pos = step.get("seq_pos")
    pos = [pos] if isinstance(pos, int) else list(pos or [])
    if not pos or not all(int(p) > 0 for p in pos):
        return None
    return Fact("where", "calls:continuation", f"every call before call {call} passes; call {call} is the first "
                                               "to fail, and every sequence in it continues from an earlier call")


def head_permutation(a, e, d, axis: int) -> np.ndarray | None:
    """The order of the golden's heads that best matches the port's (assignment on the squared scaled
    distance between heads), or None when it is the identity."""
    n = a.shape[axis]
    A, E, D = (np.moveaxis(x, axis, 0).reshape(n, -1) for x in (a, e, np.broadcast_to(d, a.shape)))
    ok = np.isfinite(A).all(0) & np.isfinite(E).all(0) & (D > 0).all(0)
    if not ok.any():
        return None
    A, E, D = A[:, ok], E[:, ok], D[:, ok]
    cost = np.array([[np.sum(((A[i] - E[j]) / D[i]) ** 2) for j in range(n)] for i in range(n)])
    if not np.all(np.isfinite(cost)):  # huge values overflow the squares: no order said
        return None
    _, cols = linear_sum_assignment(cost)
    return None if np.array_equal(cols, np.arange(n)) else cols


def _perm_text(perm, dims: dict | None) -> str:
    n = len(perm)
    if dims and dims["Hk"] > 1 and n % dims["Hk"] == 0 and n > dims["Hk"]:
        hk, r = dims["Hk"], n // dims["Hk"]
        tiled = np.array([(p % hk) * r + p // hk for p in range(n)])
        if np.array_equal(perm, tiled):
            return "the golden's heads in the tiled order (position p holds interleaved head (p % Hk)·r + p // Hk)"
        if np.array_equal(perm, np.argsort(tiled)):
            return "the golden's heads in the interleaved order read as tiled"
    return f"the golden's heads permuted: position p holds head [{_list(perm)}][p]"


def rounding_fact(a, e, bad, profile: str) -> Fact | None:
    """The error's size in a coarser dtype's rounding units, where every failing element is within a
    few of them and most of them are past a tenth of one: an intermediate stored in that dtype."""
    mine = {"f32": 24, "bf16": 8, "f16": 11, "f64": 53}.get(profile, 24)
    fin = bad & np.isfinite(a) & np.isfinite(e) & (e != 0)
    if fin.sum() < 8:
        return None
    for name, bits in ROUNDING_BITS.items():
        if bits >= mine:
            continue
        ulp = 2.0 ** (np.floor(np.log2(np.abs(e[fin]))) - (bits - 1))
        u = np.abs(a[fin] - e[fin]) / ulp
        if float(np.max(u)) <= 2.0 and float(np.median(u)) >= 0.1:
            return Fact("relation", "relation:rounding",
                        f"the error is rounding-sized: at most {np.max(u):.2g} {name} ulp of each failing element "
                        f"(median {np.median(u):.2g}), as a value stored or computed in less precision than "
                        f"{profile} leaves")
    return None


# --- precision, elementwise maps, non-finite values, the decay's order (issue 42, second round) ------


#: The grids a value stored in a coarser dtype sits on, coarsest first, by significand bits.
GRIDS = (("bf16", 8), ("f16", 11))
#: A tensor is said to sit on a grid when this share of its non-zero finite values does (and its golden's
#: at most half: a golden of values that happen to be representable says nothing).
ON_GRID = 0.999
#: The bits each profile stores an activation in (the state is kept in float32 or wider in every profile).
STORAGE_BITS = {"f64": 53, "f32": 24, "bf16": 8, "f16": 11}
#: log of float32's smallest normal number: e^x below it is 0 or subnormal in float32.
LOG_F32_TINY = math.log(float(np.finfo(np.float32).tiny))


def grid_share(x: np.ndarray, grid: str) -> tuple[float, int]:
    """The share of ``x``'s non-zero finite values exactly representable in ``grid`` (bf16, f16), and how
    many there are."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x) & (x != 0)]
    if not x.size:
        return 0.0, 0
    with np.errstate(all="ignore"):
        if grid == "bf16":
            x32 = x.astype(np.float32)
            ok = (x32.astype(np.float64) == x) & ((x32.view(np.uint32) & np.uint32(0xFFFF)) == 0)
        else:
            ok = x.astype(np.float16).astype(np.float64) == x
    return float(np.mean(ok)), int(x.size)


def grid_fact(port: np.ndarray, golden: np.ndarray, tensor: str, profile: str, where: str = "") -> Fact | None:
    """Every value of the port's ``tensor`` on a coarser dtype's grid than the profile stores it in (the
    recurrent state: float32 in every profile; the conv state holds activations, stored as the profile
    stores them), its golden's not: a value stored (rounded) in that dtype."""
    mine = 24 if tensor == "recurrent_state" else STORAGE_BITS.get(profile, 24)
    for grid, bits in GRIDS:
        if bits >= mine:
            continue
        share, n = grid_share(port, grid)
        if n < 32 or share < ON_GRID:
            continue
        if grid_share(golden, grid)[0] > 0.5:
            return None
        return Fact("precision", f"precision:{grid}",
                    f"every value of the port's {tensor}{where} lies on the {grid} grid ({share:.1%} of {n}; "
                    f"the golden's do not): a value stored or rounded in {grid}")
    return None


def _silu(x):
    with np.errstate(all="ignore"):
        return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    with np.errstate(all="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


#: The elementwise maps a stage applies, by the name said.
MAPS = {"SiLU": _silu, "sigmoid": _sigmoid}
#: The gate maps a factor g(x) of the golden may have been replaced by (name -> map).
GATE_MAPS = {"sigmoid({x})": _sigmoid, "{x} itself": lambda x: x, "1 (no gate)": np.ones_like}


def _fixes(a, e, lhs, rhs, d, elem: float) -> bool:
    """``lhs`` equals ``rhs`` (the port against a candidate, or m(port) against the golden) within the
    judge's element bound on 99 % of the elements where the port fails and on 99 % of all, leaving at
    most :data:`EXPLAINED` of the port's error ``a − e``; at least 8 failing elements."""
    ok = np.isfinite(a) & np.isfinite(e) & np.isfinite(lhs) & np.isfinite(rhs) & (d > 0)
    with np.errstate(all="ignore"):
        failing = ok & (np.abs(a - e) / d > elem)
        if failing.sum() < 8 or ok.sum() < 16:
            return False
        off = np.abs(lhs - rhs) / d
        fit = off <= elem
        den = float(np.sqrt(np.sum(((a[ok] - e[ok]) / d[ok]) ** 2)))
        num = float(np.sqrt(np.sum(off[ok] ** 2)))
    return bool(np.mean(fit[failing]) >= 0.99 and np.mean(fit[ok]) >= 0.99 and num <= EXPLAINED * den)


def elementwise_fact(a, e, d, elem: float, others: dict, tensor: str, head_axis: int | None = None) -> Fact | None:
    """A pointwise function relation, none of it fitted: the golden is m(port) for a stage map m (the port's
    tensor taken before its SiLU), the port is m(golden) (a map applied once more), or the port is the
    golden with a factor f(x) of another golden x of the call (the output gate silu(z)) replaced by g(x)."""
    # a map of the golden must beat one scale of it (per head where the tensor has heads): on a tensor whose
    # values cluster, silu(e) = e·sigmoid(e) is nearly a scale (measured: g of a decode in bf16, a per-head
    # scale bug fitted "a SiLU applied once more")
    keep = () if head_axis is None else (head_axis,)
    fwd = explained(a, e, _fit(a, e, keep) * e, d)  # the port as a scale of the golden
    back = explained(e, a, _fit(e, a, keep) * a, d)  # the golden as a scale of the port
    for name, m in MAPS.items():
        if explained(e, a, m(a), d) <= 0.5 * back and _fixes(a, e, m(a), e, d, elem):
            return Fact("relation", "relation:elementwise",
                        f"the golden is {name} of the port's values, element by element: the port's {tensor} is "
                        f"the value before its {name}")
        if explained(a, e, m(e), d) <= 0.5 * fwd and _fixes(a, e, a, m(e), d, elem):
            return Fact("relation", "relation:elementwise",
                        f"the port's values are {name} of the golden's, element by element: a {name} applied "
                        "once more")
    for label, x in others.items():
        if not label.startswith("this call's golden ") or x.shape != a.shape:
            continue
        xname = label.removeprefix("this call's golden ")
        f = _silu(x)
        keep = np.abs(f) > 1e-3 * max(float(np.max(np.abs(f[np.isfinite(f)]), initial=0.0)), 1e-30)
        base = np.where(keep, e / np.where(keep, f, 1.0), np.nan)  # the golden without its factor silu(x)
        for gname, g in GATE_MAPS.items():
            with np.errstate(all="ignore"):
                c = base * g(x)
            if _fixes(a, e, a, c, d, elem):
                return Fact("relation", "relation:elementwise",
                            f"the golden with its factor silu({xname}) replaced by {gname.format(x=xname)}, "
                            "element by element (nothing fitted)")
    return None


def gated_norm_fact(a, e, d, elem: float, others: dict, eps: float) -> Fact | None:
    """The gated norm's parts rearranged, nothing fitted: from this call's goldens ``core`` and ``z`` and the
    weight as the golden applies it (``e / (norm(core)·silu(z))``, element by element), the norm taken
    over ``core·silu(z)`` (the gate before the norm), the eps added outside the square root, or the weight
    applied as ``1 + w`` or as ``w − 1``; stated when one of them reproduces the port's tensor."""
    core, z = others.get("this call's golden core"), others.get("this call's golden z")
    if core is None or z is None or core.shape != a.shape or z.shape != a.shape or a.ndim < 2:
        return None
    with np.errstate(all="ignore"):
        ms = np.mean(core * core, axis=-1, keepdims=True)
        n = core / np.sqrt(ms + eps)
        gate = _silu(z)
        den = n * gate
        keep = np.abs(den) > 1e-3 * max(float(np.max(np.abs(den[np.isfinite(den)]), initial=0.0)), 1e-30)
        w = np.where(keep, e / np.where(keep, den, 1.0), np.nan)
        cg = core * gate
        cands = (("relation:norm_order", "the gate silu(z) applied before the norm (the norm taken over core·silu(z))",
                  cg / np.sqrt(np.mean(cg * cg, axis=-1, keepdims=True) + eps) * w),
                 ("relation:eps_placement", "the norm's eps added outside its square root",
                  core / (np.sqrt(ms) + eps) * w * gate),
                 ("relation:weight_offset", "the norm weight applied as 1 + w where the golden applies w",
                  n * (1.0 + w) * gate),
                 ("relation:weight_offset", "the norm weight applied as w − 1 where the golden applies w",
                  n * (w - 1.0) * gate))
    for code, said, c in cands:
        if _fixes(a, e, a, c, d, elem):
            return Fact("relation", code, f"the golden recomputed from this call's core and z with {said} "
                                          f"reproduces the port's values (nothing fitted; residual "
                                          f"{explained(a, e, c, d):.2g})")
    return None


#: The normed tensors and the golden each normalises (its vectors along the last axis), with the eps read
#: from the config: the input norm's x, the post norm's h, the gated norm's core.
NORMED = {"x_norm": "x", "h_norm": "h", "core_gated": "core"}


def eps_fact(a, e, bad, tensor: str, goldens: dict, others: dict, eps: float) -> Fact | None:
    """The failing vectors of a normed tensor are exactly those whose input vector has the smallest mean
    square (every failing one below every passing one, and below half the median): the error lives where
    the norm's eps weighs most (eps / mean square), whatever else is right."""
    name = NORMED.get(tensor)
    x = goldens.get(name) if name else None
    if x is None:
        x = others.get(f"this call's golden {name}")
    if x is None or x.shape != a.shape or a.ndim < 2 or not eps > 0:
        return None
    with np.errstate(all="ignore"):
        ms = np.mean(np.where(np.isfinite(x), x, 0.0) ** 2, axis=-1).ravel()
    failing = bad.any(axis=-1).ravel()
    n_bad = int(failing.sum())
    if n_bad == 0 or n_bad == failing.size or failing.size < 4:
        return None
    top, rest = float(np.max(ms[failing])), float(np.min(ms[~failing]))
    if not (top < rest and top <= 0.5 * float(np.median(ms)) and n_bad <= failing.size // 2):
        return None
    return Fact("eps", "eps:small_norm",
                f"only the {n_bad} of {failing.size} vectors whose {name} has the smallest mean square fail (each "
                f"at most {top:.2g}, every passing one at least {rest:.2g}; eps {eps:g}): where the norm's eps "
                "weighs most")


#: eps growth: each vector of smallest input mean square must be off by at least this factor in norm (a
#: correct port's rounding is not), and those above the median by a tenth of the least such departure
EPS_RATIO = 1.25


def _norm_input(tensor: str, goldens: dict, others: dict, shape) -> tuple[str | None, np.ndarray | None]:
    name = NORMED.get(tensor)
    x = goldens.get(name) if name else None
    if x is None and name:
        x = others.get(f"this call's golden {name}")
    return (name, x) if x is not None and x.shape == shape else (name, None)


def eps_growth_fact(a, e, tensor: str, goldens: dict, others: dict, eps: float) -> Fact | None:
    """Per vector of a normed tensor, the port's norm over the golden's departs from 1 only where the
    norm's input has the smallest mean square, and further the smaller it is: the vectors off by a factor
    of at least :data:`EPS_RATIO` (two at least, at most half) are those of smallest mean square (a
    boundary swap allowed), all off in one direction, the factor not shrinking from one decade of mean
    square to the next smaller one (10 % allowed: a factor that saturates, x/eps against x/√eps, stays),
    and the vectors above the median off by at most a tenth of the least such factor: an error that lives
    where the norm's eps weighs most, whether or not it crosses the bound."""
    name, x = _norm_input(tensor, goldens, others, a.shape)
    if x is None or a.ndim < 2 or not eps > 0 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(x))):
        return None
    with np.errstate(all="ignore"):
        ms = np.mean(x ** 2, axis=-1).ravel()
        na, ne = np.linalg.norm(a, axis=-1).ravel(), np.linalg.norm(e, axis=-1).ravel()
        lr = np.log(na / ne)
    if np.any(ne == 0) or not np.all(np.isfinite(lr)) or ms.size < 4:
        return None
    o = np.argsort(ms, kind="stable")
    ms, lr = ms[o], lr[o]
    med = float(np.median(ms))
    off = np.flatnonzero(np.abs(lr) >= math.log(EPS_RATIO))
    k = off.size
    if k < 2 or k > ms.size // 2 or not med > 0 or off[-1] >= k + max(1, k // 10):
        return None
    s = lr[off]
    if not (np.all(s > 0) or np.all(s < 0)):
        return None
    dep, m = np.abs(s), ms[off]
    decades = np.floor(np.log10(np.maximum(m, 1e-300)))
    meds = [float(np.median(dep[decades == d_])) for d_ in np.unique(decades)]  # by growing mean square
    if any(b > 1.1 * a_ for a_, b in itertools.pairwise(meds)):
        return None
    if float(np.median(np.abs(lr[ms > med]))) > 0.1 * float(np.min(dep)):
        return None
    return Fact("eps", "eps:grows_small",
                f"the port's vector norm over the golden's is {math.exp(s[0]):.3g} on the vector whose {name} has the "
                f"smallest mean square ({float(m[0]):.2g}), off by {min(math.exp(abs(x_)) for x_ in s):.3g}× or more "
                f"on "
                f"the {k} of smallest mean square (up to {float(m[-1]):.2g}; median {med:.2g}) and not elsewhere, "
                f"more the smaller it is: where the norm's eps (eps {eps:g}) weighs most")


#: a decay e^g this close to 0 or to 1 is extreme: a full forget, or none
EXTREME_DECAY = 1e-4


def decay_extreme_fact(bad, tensor: str, goldens: dict, step: dict | None) -> Fact | None:
    """Where the core or the recurrent state fails: only on (sequence, head) pairs whose decay e^g leaves
    [:data:`EXTREME_DECAY`, 1 − :data:`EXTREME_DECAY`] somewhere in the call (a full forget, or none),
    in the core from that token on, while other pairs keep a decay inside it and pass: an error where
    the decay is at an extreme (a clamp, a floor, a rounding of e^g near 0 or 1)."""
    g = goldens.get("g")
    if g is None or g.ndim != 3 or tensor not in ("core", "recurrent_state") or (step and "cu_seqlens" in step):
        return None
    B, T, H = g.shape
    with np.errstate(all="ignore"):
        ext = (g < math.log(EXTREME_DECAY)) | (g > math.log1p(-EXTREME_DECAY))
    if tensor == "core":
        if bad.shape[:3] != (B, T, H):
            return None
        pairs = bad.any(axis=(1, 3))
    else:
        if bad.ndim != 4 or bad.shape[:2] != (B, H):
            return None
        pairs = bad.any(axis=(2, 3))
    ext_pair = ext.any(axis=1)
    if not pairs.any() or not np.all(ext_pair[pairs]) or ext_pair.all():
        return None
    if tensor == "core":
        for b, h in zip(*np.nonzero(pairs)):
            if int(np.argmax(bad[b, :, h].any(axis=-1))) < int(np.argmax(ext[b, :, h])):
                return None
    heads = np.flatnonzero(pairs.any(axis=0))
    return Fact("decay", "decay:extreme",
                f"only on heads {_list(heads)} of {H}, each where its decay e^g leaves [{EXTREME_DECAY:g}, "
                f"1 − {EXTREME_DECAY:g}] in the call (a full forget, or none)"
                f"{', from that token on' if tensor == 'core' else ''}"
                "; the heads whose decay stays inside pass: the error lives where the decay is at an extreme")


def nonfinite_facts(a, e, tensor: str, goldens: dict, step: dict | None, head_axis: int | None) -> list[Fact]:
    """Where the port's non-finite values stand where the golden is finite: the first token, the heads;
    and whether those heads are the ones whose cumulative log-decay Σg in the call passes float32's
    smallest exponent (e^Σg underflows: a quotient or a product of such exponentials is 0/0 or inf·0)."""
    new = ~np.isfinite(a) & np.isfinite(e)
    if not new.any():
        return []
    nan, inf = int(np.sum(new & np.isnan(a))), int(np.sum(new & np.isinf(a)))
    said = f"{nan} NaN" + (f" and {inf} infinite" if inf else "")
    said += f" value(s) of {new.size} where the golden is finite"
    heads = None
    if a.ndim >= 2:
        tok = np.flatnonzero(new.any(axis=tuple(i for i in range(a.ndim) if i != 1)))
        said += f", first at token {int(tok[0])}"
    if head_axis is not None and a.ndim > head_axis:
        heads = new.any(axis=tuple(i for i in range(a.ndim) if i != head_axis))
        said += f", in heads {_list(np.flatnonzero(heads))} of {len(heads)}"
    facts = [Fact("nonfinite", "nonfinite:appear", said)]
    g = goldens.get("g")
    packed = step is not None and "cu_seqlens" in step
    if heads is not None and g is not None and not packed and tensor in ("core",) and g.ndim == 3 \
            and g.shape[:2] == a.shape[:2] and g.shape[2] == len(heads):
        under = (np.cumsum(np.where(np.isfinite(g), g, 0.0), axis=1) < LOG_F32_TINY).any(axis=(0, 1))
        if heads.any() and np.all(under[heads]):
            facts.append(Fact("nonfinite", "nonfinite:decay_underflow",
                              f"only on heads whose cumulative log-decay Σg in the call falls below {LOG_F32_TINY:.1f} "
                              f"(heads {_list(np.flatnonzero(under))}): e^Σg underflows float32 there, and a quotient "
                              "or a masked product of such exponentials is 0/0 or inf·0"))
    return facts


def _delta_rule(q, k, v, g, beta, S, after: bool):
    """The gated delta rule in float64 on a call's goldens (q unscaled, key heads repeated to the value heads
    in the interleaved order), the decay applied before the write (the spec) or ``after`` it."""
    B, T, Hv, dv = v.shape
    r = Hv // q.shape[2]
    qe, ke = np.repeat(q, r, axis=2) * q.shape[-1] ** -0.5, np.repeat(k, r, axis=2)
    S = S.copy()
    core = np.empty(v.shape)
    decay = np.exp(g)
    for t in range(T):
        if not after:
            S *= decay[:, t, :, None, None]
        m = np.einsum("bhk,bhkv->bhv", ke[:, t], S)
        S += ke[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - m))[:, :, None, :]
        if after:
            S *= decay[:, t, :, None, None]
        core[:, t] = np.einsum("bhk,bhkv->bhv", qe[:, t], S)
    return core


def decay_order_fact(a, e, d, elem: float, goldens: dict, step: dict | None) -> Fact | None:
    """The port's core against the delta rule run on the call's own goldens with the decay applied after
    each token's write instead of before: stated when the spec's order reproduces the golden (the call's
    layout understood) and the other order reproduces the port's."""
    need = ("q", "k", "v", "g", "beta", "state_before")
    if step is None or "cu_seqlens" in step or any(goldens.get(n) is None for n in need):
        return None
    q, k, v, g, beta, S = (goldens[n] for n in need)
    try:
        if v.shape != a.shape or q.shape[:2] != v.shape[:2] or v.shape[2] % q.shape[2] or \
                S.shape != (v.shape[0], v.shape[2], q.shape[3], v.shape[3]) or v.shape[1] * S.size > 4_000_000:
            return None
        with np.errstate(all="ignore"):
            spec = _delta_rule(q, k, v, g, beta, S, after=False)
            if not close(spec, e, d, elem) or not np.all(np.isfinite(spec)):
                return None
            other = _delta_rule(q, k, v, g, beta, S, after=True)
    except (ValueError, IndexError):
        return None
    if _fixes(a, e, a, other, d, elem):
        return Fact("order", "order:decay_after_write",
                    f"the delta rule run on the call's own goldens with each token's decay e^g applied after its "
                    f"write instead of before it reproduces the port's core (residual {explained(a, e, other, d):.2g})")
    return None


#: the tensors whose elements are each one per-element map of the call's inputs (the gates): there a
#: lost small value or an absolute error is a fact about that map
MAPPED = ("g", "beta")
#: an absolute error: the relative error of a head's smaller half at least this many of the profile's
#: rounding units (a correct port's is a few), and its absolute error at least half the larger half's
ABS_UNITS = 64.0


def lost_zero_fact(a, e, bad, tensor: str) -> Fact | None:
    """Every failing element of a per-element map is exactly 0 in the port where the golden is not (and
    some element is not 0 in the port): a small value lost whole, as an underflow or a sum 1 + y that
    rounds to 1 does."""
    if tensor not in MAPPED or not bad.any():
        return None
    fb = bad & np.isfinite(e)
    if not np.array_equal(fb, bad) or np.any(a[bad] != 0) or np.any(e[bad] == 0) \
            or not np.any(a[~bad] != 0):
        return None
    big = float(np.max(np.abs(e[bad])))
    return Fact("values", "values:zero",
                f"the port's value is exactly 0 on all {int(bad.sum())} failing elements, where the golden's is not "
                f"(|golden| at most {big:.3g} there): a small value lost whole, as in an underflow or a 1 + y "
                "that rounds to 1")


def absolute_error_fact(a, e, tensor: str, profile: str, head_axis: int | None) -> Fact | None:
    """On the heads that carry most of the error, the error does not shrink with the value: the half of
    a head's elements of smaller |golden| (its median at most 0.6 of the larger half's) is off by at least
    half as much, in absolute terms, as the larger half, and by 1.5 times more than a relative error
    would be, and its relative error is far past the profile's rounding (at
    least :data:`ABS_UNITS` units) while small (below 1 %): precision lost to a constant absolute error,
    as a small quantity computed through a number near 1 (log(1 + y), 1 − y) gets. Not said beside a
    coarser grid (:func:`grid_fact`; :func:`measure`): a rounding error is absolute within a binade."""
    if tensor not in MAPPED or head_axis is None or a.ndim <= head_axis or a.shape != e.shape:
        return None
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        return None
    u = 2.0 ** -STORAGE_BITS.get(profile, 24)
    heads, weight, total = [], 0.0, 0.0
    for h in range(a.shape[head_axis]):
        x = np.abs(np.take(e, h, axis=head_axis)).ravel()
        y = np.abs(np.take(a, h, axis=head_axis) - np.take(e, h, axis=head_axis)).ravel()
        w = float(np.sum(y / (1.0 + x)))
        total += w
        if x.size < 8 or np.any(x == 0):
            continue
        o = np.argsort(x, kind="stable")
        lo, hi = o[: x.size // 2], o[x.size // 2:]
        mlo, mhi = float(np.median(x[lo])), float(np.median(x[hi]))
        rel = float(np.mean(y[lo] / x[lo]))
        ylo, yhi = float(np.mean(y[lo])), float(np.mean(y[hi]))
        # the values spread (the smaller half's median at most 0.6 of the larger's) and the error does not
        # follow them: a relative error would shrink with them, an absolute one stays (noise allowed: 1.5×)
        if mlo <= 0.6 * mhi and yhi > 0 and ylo >= max(0.5, 1.5 * mlo / mhi) * yhi and ABS_UNITS * u <= rel < 1e-2:
            heads.append((h, ylo, rel))
            weight += w
    if not heads or not total > 0 or weight < 0.5 * total:
        return _pooled_absolute(a, e, profile)
    hs = [h for h, _, _ in heads]
    err, rel = max(x for _, x, _ in heads), max(r for _, _, r in heads)
    return Fact("error", "error:absolute",
                f"on heads {_list(np.array(hs))} (most of the error) the error does not shrink with the value: the "
                f"smaller half of each head's |golden| is off by nearly as much as the larger half (about {err:.2g}), "
                f"up to {rel:.2g} of the value, {rel / u:.0f} {profile} rounding units: a constant absolute error, "
                "as a small "
                "quantity computed through a number near 1 (log(1 + y), 1 − y) has")


def _pooled_absolute(a, e, profile: str) -> Fact | None:
    """Too few elements per head (a call of one token a sequence): over the whole tensor, the half of
    smaller |golden| has a relative error far past the profile's rounding (at least :data:`ABS_UNITS`
    units, below 1 %) and at least 8 times the larger half's."""
    x, y = np.abs(e).ravel(), np.abs(a - e).ravel()
    if x.size < 8 or np.any(x == 0):
        return None
    u = 2.0 ** -STORAGE_BITS.get(profile, 24)
    o = np.argsort(x, kind="stable")
    lo, hi = o[: x.size // 2], o[x.size // 2:]
    rlo, rhi = float(np.mean(y[lo] / x[lo])), float(np.mean(y[hi] / x[hi]))
    spread = float(np.median(x[lo])) <= 0.5 * float(np.median(x[hi]))
    if not (ABS_UNITS * u <= rlo < 1e-2 and rlo >= 8.0 * rhi and spread):
        return None
    return Fact("error", "error:absolute",
                f"the relative error grows as the value shrinks: {rlo:.2g} ({rlo / u:.0f} {profile} rounding units) on "
                f"the half of smaller |golden|, {rhi:.2g} on the larger half: precision lost to an absolute error, as "
                "a small quantity computed through a number near 1 (log(1 + y), 1 − y) has")


# --- all together ----------------------------------------------------------------------------------


def measure(actual, expected, tensor: str, *, scale, elem: float, profile: str, config: dict | None = None,
            step: dict | None = None, others: dict | None = None, call_step: dict | None = None,
            call: int | None = None, earlier_pass: bool = False, goldens: dict | None = None,
            port_states: dict | None = None) -> list[Fact]:
    """The facts of one failing tensor (module docstring). ``actual``/``expected`` as the judge saw them
    (a packed stage tensor as one row ``[1, total_tokens, ...]``), ``scale`` the judge's denominator,
    ``elem`` its element bound, ``step`` the program step (a packed call's layout, a commit's request),
    ``others``: label -> another golden of the case to search (``before``: the state before the step;
    ``after``: this step's golden, searched slot by slot; ``this call's golden X``: another tensor of the
    call; other labels: other calls' tensors); ``call_step`` the step (for :func:`calls_fact`, with
    ``call`` and ``earlier_pass``: whether every record of the earlier steps passes); ``goldens``: name ->
    this call's golden of any shape (``g`` for :func:`nonfinite_facts`; ``q k v g beta state_before`` for
    :func:`decay_order_fact`); ``port_states``: name -> (port, golden) of the step's failing states
    (:func:`grid_fact`)."""
    a, e = np.atleast_1d(np.asarray(actual, dtype=np.float64)), np.atleast_1d(np.asarray(expected, dtype=np.float64))
    others = {k: np.asarray(v, dtype=np.float64) for k, v in (others or {}).items()}
    dims = _dims(config)
    if a.shape != e.shape:
        return relations(a, e, None, tensor, dims, None, None)
    d = np.broadcast_to(np.asarray(1.0 if scale is None else scale, dtype=np.float64), a.shape)
    with np.errstate(all="ignore"):
        err = np.where(np.isfinite(a) & np.isfinite(e), np.abs(a - e) / d, np.where(np.isnan(a) | np.isnan(e)
                       | (a != e), np.inf, 0.0))
    bad = err > elem
    if not bad.any():  # failed on its mean square error alone: only how the error grows with the value
        spec = _spec(tensor)
        gold = {k: np.asarray(v, dtype=np.float64) for k, v in (goldens or {}).items() if v is not None}
        f = (absolute_error_fact(a, e, tensor, profile, spec.head_axis + 1 if spec is not None
                                 and spec.head_axis is not None else None)
             if grid_fact(a, e, tensor, profile) is None else None) or \
            eps_growth_fact(a, e, tensor, gold, others, float((config or {}).get("rms_norm_eps", 1e-6)))
        return [f] if f else []
    facts: list[Fact] = []
    f = calls_fact(call_step, earlier_pass, call)
    if f:
        facts.append(f)
    spec = _spec(tensor)
    is_state = tensor in STATE_NAMES
    pool = is_state and step is not None and "slots" in step
    head_axis = spec.head_axis + 1 if spec is not None and spec.head_axis is not None else None
    if head_axis is not None and a.ndim <= head_axis:  # a tensor of another shape than its spec's (0-d)
        head_axis = None
    token_axis = None if is_state or a.ndim < 2 else 1
    if head_axis is not None and a.ndim > head_axis:
        kind = "key" if spec.shape[spec.head_axis] == "Hk" else "value"
        f = heads_fact(bad.any(axis=tuple(i for i in range(a.ndim) if i != head_axis)), a.shape[head_axis], dims, kind)
        if f:
            facts.append(f)
    if token_axis is not None and a.shape[1] > 1:
        per = err.max(axis=tuple(i for i in range(a.ndim) if i != 1))
        bt = bad.any(axis=tuple(i for i in range(a.ndim) if i != 1))
        if step is not None and "cu_seqlens" in step:
            f = rows_fact(bt, step)
            if f:
                facts.append(f)
            facts += _packed_tokens(bt, step, dims if tensor in CONV_TENSORS else None)
        else:
            f = tokens_fact(bt, per, elem, dims["K"] if dims and tensor in CONV_TENSORS else None)
            if f:
                facts.append(f)
    if tensor in ("qkv", "qkv_conv", "conv_state") and a.ndim >= 2:
        ch_axis = a.ndim - 1 if tensor != "conv_state" else 1
        f = channels_fact(bad.any(axis=tuple(i for i in range(a.ndim) if i != ch_axis)), dims)
        if f:
            facts.append(f)
    if pool:
        bad_slots = [int(s) for s in np.flatnonzero(bad.reshape(a.shape[0], -1).any(axis=1))]
        f = slots_fact(bad_slots, step)
        if f:
            facts.append(f)
        facts += equals_pool(a, e, d, elem, bad_slots, step, {k: v for k, v in others.items()
                                                              if k in ("before", "after")})
    else:
        f = equals_tensor(a, e, d, elem, others)
        if f:
            facts.append(f)
    goldens = {k: np.asarray(v, dtype=np.float64) for k, v in (goldens or {}).items() if v is not None}
    if not pool:
        f = decay_extreme_fact(bad, tensor, goldens, call_step)
        if f:
            facts.append(f)
    facts += nonfinite_facts(a, e, tensor, goldens, step if step is not None else call_step, head_axis)
    zero = not np.any(np.where(np.isfinite(a), a, 1.0))  # all zeros: "equals the zero state", no scale of anything
    if not pool and not zero:
        rel = relations(a, e, d, tensor, dims, head_axis, token_axis, elem)
        if not rel:
            f = elementwise_fact(a, e, d, elem, others, tensor, head_axis) or ratio_fact(a, e, others)
            if f is None and tensor == "core_gated":
                f = gated_norm_fact(a, e, d, elem, others, float((config or {}).get("rms_norm_eps", 1e-6)))
            rel = [f] if f else []
        facts += rel
        if tensor == "core":
            f = decay_order_fact(a, e, d, elem, goldens, call_step)
            if f:
                facts.append(f)
    if not pool and not zero and not any(x.kind == "relation" for x in facts):
        eps = float((config or {}).get("rms_norm_eps", 1e-6))
        f = eps_fact(a, e, bad, tensor, goldens, others, eps) or eps_growth_fact(a, e, tensor, goldens, others, eps)
        if f:
            facts.append(f)
    if not pool and not zero and not any(x.kind == "relation" for x in facts):
        # an error of values stored on a coarser grid is absolute within a binade: the grid says it
        f = lost_zero_fact(a, e, bad, tensor) or (absolute_error_fact(a, e, tensor, profile, head_axis)
                                                   if grid_fact(a, e, tensor, profile) is None else None)
        if f:
            facts.append(f)
    grids = [grid_fact(a, e, tensor, profile)]
    for name, (pa, pe) in (port_states or {}).items():
        if name != tensor:
            grids.append(grid_fact(np.asarray(pa, np.float64), np.asarray(pe, np.float64), name, profile,
                                   " after this call"))
    grids = [f for f in grids if f]
    # the error's size in rounding units only beside a value found on that grid: a bug whose error happens
    # to be small (softplus against sigmoid far below zero, both e^x) is rounding-sized without rounding
    f = rounding_fact(a, e, bad, profile)
    if f and grids and not any(x.kind == "relation" for x in facts):
        facts.append(f)
    return facts + grids


def _packed_tokens(bad_tokens: np.ndarray, step: dict, dims: dict | None) -> list[Fact]:
    """Tokens of a packed call's failing sequences: only the first K−1 of each, or from a token on."""
    cu = [int(c) for c in step["cu_seqlens"]]
    K = dims["K"] if dims else None
    firsts, heads_only = [], K is not None
    for i in range(len(cu) - 1):
        seg = bad_tokens[cu[i]:cu[i + 1]]
        if seg.any():
            idx = np.flatnonzero(seg)
            firsts.append(int(idx[0]))
            heads_only &= bool(K and idx[-1] < K - 1 and len(seg) > K - 1)
    if not firsts:
        return []
    if heads_only:
        return [Fact("where", "tokens:conv_head", f"only within the first K−1 = {K - 1} tokens of each failing "
                                                  "sequence, those whose conv window reaches into the slot")]
    if all(f == 0 for f in firsts):
        return [Fact("where", "tokens:seq_start", "from the first token of each failing sequence")]
    return []


def text(facts: list[Fact]) -> str:
    """The facts said in one clause: ``where …; equals …; relation …``."""
    return "; ".join(f.text for f in facts)


def _ordinal(n: int) -> str:
    return f"{n}{'nd' if n % 10 == 2 and n % 100 != 12 else 'rd' if n % 10 == 3 and n % 100 != 13 else 'th'}"
