"""The matrix's judging logic: what one case of a verify summary shows about an engine, and whether a known
finding explains it (``gdncheck engines``, docs/engines.md, The classes). The data it reads lives apart: the
findings of each engine in its folder (``conformance/engines/<name>/engine.py``, gathered by :mod:`.registry`),
their types in :mod:`.schema`.

:func:`classify` names what one case of a verify summary shows about the engine — ``deviation``,
``convention``, ``missing_feature``, ``engine_crash``, ``unusable`` — always from the summary. A findings table,
keyed by (engine, case id prefix, profile or ``'*'``), only adds the explanation and the repro script
(:func:`explain`); an entry explains a case only when its class and ``expect`` are what the summary shows and
every failing record of the case is one it accounts for (its first failing tensor's, or one of its measured
consequences, ``also``: :func:`allows`), so the matrix never hides a new failure behind an old explanation
(``unexplained``, ``mismatch``, ``stale``). Every function that takes a ``table`` reads the registry's
:data:`~.registry.FINDINGS` when it is given none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gdncheck import errors

from .schema import Allow, Finding, Key

CLASSES = ("deviation", "convention", "missing_feature", "engine_crash", "unusable")
#: classes that need an explanation (a FINDINGS entry); the others explain themselves in the summary
NEEDS_EXPLANATION = ("deviation", "engine_crash", "unusable")


def _table(table: Mapping[Key, Finding] | None) -> Mapping[Key, Finding]:
    """``table``, or the registry's findings of every engine."""
    if table is not None:
        return table
    from .registry import FINDINGS

    return FINDINGS


def allows(allow: Allow, group: Mapping[str, Any]) -> bool:
    """Whether ``allow`` accounts for a failing tensor's records (``group``: :func:`failing_tensors`)."""
    return (allow.stage in ("*", group.get("stage")) and allow.tensor in ("*", group.get("tensor"))
            and (allow.nan or not group.get("nan"))
            and (group.get("ratio") is None or group["ratio"] <= allow.ratio)
            and not group.get("no_values"))


def allow_text(allow: Allow) -> str:
    return f"{allow.stage}/{allow.tensor} up to {allow.ratio:.3g}x" + (" or NaN" if allow.nan else "")



def find_entry(engine_name: str, case_id: str, profile: str,
               table: Mapping[Key, Finding] | None = None) -> tuple[Key, Finding] | None:
    """The FINDINGS entry for a case: this engine, the longest case id prefix, this profile before ``'*'``."""
    table = _table(table)
    hits = [(k, f) for k, f in table.items()
            if k[0] == engine_name and case_id.startswith(k[1]) and k[2] in (profile, "*")]
    if not hits:
        return None
    return max(hits, key=lambda kf: (kf[0][2] != "*", len(kf[0][1])))


# --- classification ----------------------------------------------------------------------------------
def error_codes() -> set[str]:
    """Every error code of gdncheck (FORMAT.md §6 and the others of gdncheck/errors.py)."""
    codes, todo = set(), [errors.GDNError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        code = getattr(cls, "code", None)
        if isinstance(code, str):
            codes.add(code)
    return codes


#: Python exceptions that are a crash, never a check: the engine did not refuse the input, it broke on it
CRASHES = ("ZeroDivisionError", "OverflowError", "FloatingPointError", "IndexError", "KeyError", "AttributeError",
           "NameError", "UnboundLocalError", "AssertionError", "RecursionError", "SystemError", "UnicodeError")
_CRASH = re.compile(r"\b(" + "|".join(CRASHES) + r")\b")
_RAISED = re.compile(r"^the implementation raised (\S+) at step (\d+)")


def crash_of(code: str | None, message: str | None) -> str | None:
    """The crash a raised error stands for: a code that is no gdncheck code (an exception's class name
    taken for one), or a crash exception named in the message; else None."""
    if code and code not in error_codes():
        return code
    found = _CRASH.search(message or "")
    return found.group(1) if found else None


def _ratio(rec: Mapping[str, Any]) -> dict | None:
    """error / bound of a record: the largest of max_err / elem bound and nmse / nmse bound (a rank's share of a
    sharded tensor: its ``shard``'s, measured of the whole tensor's scale)."""
    metrics, bound = rec.get("metrics") or {}, rec.get("bound") or {}
    shard = rec.get("shard") or {}
    if not metrics and shard:
        metrics, bound = shard, {"elem": shard.get("elem_bound"), "nmse": shard.get("nmse_bound")}
    best = None
    for measure, err_key, bound_key in (("elem", "max_err", "elem"), ("nmse", "nmse", "nmse")):
        err, lim = metrics.get(err_key), bound.get(bound_key)
        if isinstance(err, int | float) and isinstance(lim, int | float) and lim > 0:
            r = float(err) / float(lim)
            if best is None or r > best["ratio"]:
                best = {"ratio": r, "measure": measure}
    return best


def _first_failing(case: Mapping[str, Any]) -> Mapping[str, Any] | None:
    fd = case.get("first_divergence") or {}
    fails = [r for r in case.get("records", []) if r.get("verdict") == "fail"]
    for r in fails:
        if (r.get("step"), r.get("stage"), r.get("tensor")) == (fd.get("step"), fd.get("stage"), fd.get("tensor")):
            return r
    return fails[0] if fails else None


def failing_tensors(case: Mapping[str, Any]) -> list[dict]:
    """Every failing record of a case, by stage and tensor in the order they first fail: ``{stage, tensor,
    records, ratio, nan, no_values, call, step}`` -- how many records fail, the largest error / bound of those
    without NaN (None: none has a ratio), NaN elements in all, how many fail with no values to measure (a
    missing tensor, a wrong shape or dtype, a wrong seq_len), and where the worst one is."""
    groups: dict[tuple, dict] = {}
    for r in case.get("records", []):
        if r.get("verdict") != "fail":
            continue
        key = (r.get("stage"), r.get("tensor"))
        g = groups.setdefault(key, {"stage": key[0], "tensor": key[1], "records": 0, "ratio": None, "nan": 0,
                                    "no_values": 0, "call": r.get("call"), "step": r.get("step")})
        g["records"] += 1
        nan = (r.get("metrics") or {}).get("nan")
        nan = int(nan) if isinstance(nan, int | float) and nan == nan and nan > 0 else 0
        ratio = _ratio(r)
        if nan:
            g["nan"] += nan
        elif ratio is None:
            g["no_values"] += 1
        elif g["ratio"] is None or ratio["ratio"] > g["ratio"]:
            g.update(ratio=ratio["ratio"], call=r.get("call"), step=r.get("step"))
    return list(groups.values())


def conventions_of(case: Mapping[str, Any]) -> list[dict]:
    return [r["convention"] for r in case.get("records", []) if r.get("convention")]


def classify(case: Mapping[str, Any]) -> dict | None:
    """What one case of a verify summary shows about the engine: ``{class, adjudication, detail, failing}``
    (``failing``: :func:`failing_tensors`, every failing record a finding must account for), or None for a
    clean pass."""
    found = _classify(case)
    if found is not None:
        found["failing"] = failing_tensors(case)
    return found


def _classify(case: Mapping[str, Any]) -> dict | None:
    status, fd = case.get("status"), case.get("first_divergence") or {}
    ec, na = case.get("error_check") or {}, case.get("not_applicable")
    if status == "error":
        return {"class": "unusable", "adjudication": {"kind": "error"}, "detail": case.get("problem")}
    if status == "not_applicable":
        return {"class": "missing_feature", "detail": na.get("reason"),
                "adjudication": {"kind": "not_applicable", "step": na.get("step"), "op": na.get("op")}}
    if status == "pass":
        crash = crash_of(ec.get("actual"), ec.get("actual_message")) if ec.get("actual") else None
        if crash:
            return {"class": "engine_crash", "detail": ec.get("actual_message"),
                    "adjudication": {"kind": "crash", "exception": crash, "code": ec.get("actual"),
                                     "step": ec.get("actual_step"), "accepted_as": ec.get("match")}}
        conv = conventions_of(case)
        if conv:
            choices = sorted({c.get("choice") for c in conv})
            return {"class": "convention", "detail": conv[0].get("text"),
                    "adjudication": {"kind": conv[0].get("kind"), "choice": choices[0] if len(choices) == 1
                                     else "mixed", "tokens": sum(int(c.get("tokens") or 0) for c in conv),
                                     "calls": len(conv)}}
        return None
    # status fail
    reason = fd.get("reason")
    if reason in ("error_expected", "wrong_error"):
        crash = crash_of(ec.get("actual"), ec.get("actual_message")) if ec.get("actual") else None
        adj = {"kind": "error_check", "reason": reason, "expected": ec.get("expected"), "actual": ec.get("actual"),
               "step": ec.get("step"), "actual_step": ec.get("actual_step")}
        if crash:
            return {"class": "engine_crash", "detail": ec.get("actual_message"),
                    "adjudication": {**adj, "kind": "crash", "exception": crash, "code": ec.get("actual")}}
        return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}
    if reason == "raised":
        m = _RAISED.match(case.get("message") or "")
        code = m.group(1) if m else None
        crash = crash_of(code, case.get("message"))
        adj = {"kind": "raised", "code": code, "step": fd.get("step"), "op": fd.get("op")}
        if crash:
            return {"class": "engine_crash", "detail": case.get("message"),
                    "adjudication": {**adj, "kind": "crash", "exception": crash}}
        return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}
    if reason == "nothing_judged":
        return {"class": "missing_feature", "detail": case.get("message"),
                "adjudication": {"kind": "nothing_judged", "step": fd.get("step"), "op": fd.get("op")}}
    if reason == "not_applicable":  # a case every port must run, declared not applicable: fails
        return {"class": "missing_feature", "detail": case.get("message"),
                "adjudication": {"kind": "required_not_applicable", "step": fd.get("step"), "op": fd.get("op"),
                                 "reason": (na or {}).get("reason")}}
    rec = _first_failing(case) or {}
    ratio = _ratio(rec) or {}
    diagnosis = case.get("diagnosis") or {}
    nan = (rec.get("metrics") or {}).get("nan")
    adj = {"kind": "routing" if reason == "routing" else "tensor", "reason": reason, "step": fd.get("step"),
           "call": fd.get("call"), "stage": fd.get("stage"), "tensor": fd.get("tensor"), "token": fd.get("token"),
           # NaN elements: the ratio is then over the finite ones only, and says nothing of the failure
           "nan": int(nan) if isinstance(nan, int | float) and nan == nan else 0,
           "numel": (rec.get("metrics") or {}).get("numel"),
           "ratio": ratio.get("ratio"), "measure": ratio.get("measure"),
           # the class named, without the symptoms before it (the page lists findings by class)
           "likely_cause": diagnosis.get("cause", diagnosis.get("text")) if diagnosis.get("verdict") == "matches"
           else None}
    if reason == "routing":
        adj["tokens_routed_otherwise"] = (rec.get("routing") or {}).get("tokens_routed_otherwise")
    return {"class": "deviation", "detail": case.get("message"), "adjudication": adj}


def explain(found: dict, engine_name: str, case_id: str, profile: str, status: str,
            table: Mapping[tuple[str, str, str], Finding] | None = None) -> dict:
    """``found`` (:func:`classify`) with what FINDINGS adds: the entry's key, explanation and repro when it
    explains the case; ``unexplained`` when the case needs an explanation no entry gives; ``mismatch``
    when an entry names the case but another class or adjudication than the summary shows."""
    out = dict(found)
    hit = find_entry(engine_name, case_id, profile, table)
    needs = status == "fail" or found["class"] in NEEDS_EXPLANATION
    out.update(finding=None, explanation=None, repro=None, mismatch=None)
    if hit is not None:
        key, entry = hit
        wrong = _unmatched(entry.expect, found["adjudication"])
        if entry.cls != found["class"]:
            wrong.insert(0, f"class {found['class']} (FINDINGS: {entry.cls})")
        elif not wrong:
            wrong = _unaccounted(entry, found.get("failing") or [])
        if wrong:
            out["mismatch"] = (f"FINDINGS entry {list(key)} does not explain this case: the summary shows "
                               + "; ".join(wrong))
        else:
            out.update(finding=list(key), explanation=entry.explanation, repro=entry.repro)
    out["unexplained"] = bool(out["mismatch"]) or (needs and out["finding"] is None)
    return out


def _unmatched(expect: Mapping[str, Any], adj: Mapping[str, Any]) -> list[str]:
    """What of ``expect`` (a :class:`Finding`'s) the adjudication does not show: each field as
    ``name value (FINDINGS: expected)``; ``ratio`` a range of error / bound where no element is NaN (with NaN
    the ratio, over the finite elements, says nothing: ``nan`` says whether NaN is expected, True or False;
    without it either is)."""
    wrong = []
    for k, v in expect.items():
        got = adj.get(k)
        if k == "ratio":
            if adj.get("nan"):
                continue  # NaN: judged by ``nan`` (expected False: a mismatch there), never by the ratio
            lo, hi = v
            if not (isinstance(got, int | float) and lo <= got <= hi):
                shown = f"{got:.3g}" if isinstance(got, int | float) else repr(got)
                wrong.append(f"ratio {shown} (FINDINGS: {lo:.3g} to {hi:.3g})")
        elif k == "nan":
            if bool(adj.get("nan")) != bool(v):
                wrong.append(f"NaN {'found' if adj.get('nan') else 'none'} (FINDINGS: {'NaN' if v else 'no NaN'})")
        elif got != v:
            wrong.append(f"{k} {got!r} (FINDINGS: {v!r})")
    return wrong


def _first_allow(expect: Mapping[str, Any]) -> Allow | None:
    """What ``expect`` allows of the first failing tensor's records: its stage and tensor (``'*'`` where it
    names none), error / bound up to its ratio's high end, NaN unless it says ``nan: False``; None for an
    expectation of no tensor (an error check, a crash, a convention, not applicable)."""
    if expect.get("kind") not in ("tensor", "routing") and "stage" not in expect and "tensor" not in expect \
            and "ratio" not in expect:
        return None
    hi = expect["ratio"][1] if "ratio" in expect else float("inf")
    return Allow(expect.get("stage", "*"), expect.get("tensor", "*"), hi, expect.get("nan", True) is not False)


def _unaccounted(entry: Finding, failing: list[dict]) -> list[str]:
    """Each failing tensor of a case that ``entry`` does not account for (its first failing tensor's
    :func:`_first_allow`, or one of its ``also``), said with where and how far it fails."""
    allowed = [a for a in (_first_allow(entry.expect), *entry.also) if a is not None]
    wrong = []
    for g in failing:
        if any(allows(a, g) for a in allowed):
            continue
        if g["no_values"]:
            how = f"{g['no_values']} record(s) failing with no values to measure"
        elif g["nan"] and g["ratio"] is None:
            how = f"NaN in {g['nan']} element(s)"
        else:
            how = (f"{g['ratio']:.3g}x its bound" if g["ratio"] is not None else "no ratio") \
                + (f", NaN in {g['nan']} element(s)" if g["nan"] else "")
        wrong.append(f"{g['stage']}/{g['tensor']} failing (call {g['call']}, step {g['step']}: {how}; "
                     f"{g['records']} record(s)), which it does not account for (it allows "
                     + (", ".join(allow_text(a) for a in allowed) or "no failing tensor") + ")")
    return wrong


def case_findings(summary: Mapping[str, Any], engine_name: str, profile: str,
                  table: Mapping[tuple[str, str, str], Finding] | None = None) -> tuple[list[dict], list[list[str]]]:
    """Every non-clean case of a verify summary, classified and explained; and the stale FINDINGS keys
    (an entry for this engine and profile whose cases all ran clean)."""
    out, used, clean = [], set(), []
    for case in summary.get("cases", []):
        found = classify(case)
        if found is None:
            clean.append(case["id"])
            continue
        item = {"case": case["id"], "status": case.get("status"), **explain(found, engine_name, case["id"], profile,
                                                                            case.get("status"), table)}
        item["gdncheck_repro"] = case.get("repro")
        out.append(item)
        if item["finding"]:
            used.add(tuple(item["finding"]))
    table = _table(table)
    stale = []
    for key in table:
        if key[0] != engine_name or key[2] not in (profile, "*") or key in used or table[key].may_not_occur:
            continue
        matched = [c for c in clean if c.startswith(key[1]) and find_entry(engine_name, c, profile, table)[0] == key]
        if matched:
            stale.append([*key])
    return out, stale


def profile_result(summary: Mapping[str, Any], engine_name: str, profile: str,
                   table: Mapping[tuple[str, str, str], Finding] | None = None) -> dict:
    """One cell of the matrix from a verify summary: counts, the worst passing ratio, the findings."""
    cases = summary.get("cases", [])
    findings, stale = case_findings(summary, engine_name, profile, table)
    # a crash is never a pass: a case verify passed (the adapter mapped the crash to an accepted code) fails here
    crashed = {f["case"] for f in findings if f["class"] == "engine_crash" and f["status"] == "pass"}
    for f in findings:
        if f["case"] in crashed:
            f.update(status="fail", verify_status="pass")
    status = {c.get("id"): ("fail" if c.get("id") in crashed else c.get("status")) for c in cases}
    counts = {s: sum(st == s for st in status.values()) for s in ("pass", "fail", "not_applicable", "error")}
    counts["cases"] = len(cases)
    worst = None
    for c in cases:
        for r in c.get("records", []):
            if r.get("verdict") != "pass":
                continue
            ratio = _ratio(r)
            if ratio and (worst is None or ratio["ratio"] > worst["ratio"]):
                worst = {**ratio, "case": c["id"], "stage": r.get("stage"), "tensor": r.get("tensor"),
                         "call": r.get("call")}
    by_class = {k: sum(f["class"] == k for f in findings) for k in CLASSES}
    conventions: dict[tuple, list[str]] = {}
    for f in findings:
        if f["class"] == "convention":
            conventions.setdefault((f["adjudication"]["kind"], f["adjudication"]["choice"]), []).append(f["case"])
    return {"status": "ran", "verdict": "fail" if crashed else summary.get("verdict"),
            "verify_verdict": summary.get("verdict"), "exit_code": summary.get("exit_code"),
            "mode": summary.get("mode"), "implementation": (summary.get("implementation") or {}).get("name"),
            "counts": counts, "tensors_judged": (summary.get("coverage") or {}).get("tensors_judged"),
            "worst_ratio": worst, "findings": findings, "findings_by_class": by_class,
            "unexplained": sum(f["unexplained"] for f in findings), "stale_findings": stale,
            "conventions": [{"kind": k, "choice": ch, "cases": v} for (k, ch), v in conventions.items()],
            "notes": list(summary.get("notes", []))}
