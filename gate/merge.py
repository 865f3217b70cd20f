"""``gdncheck gate --merge``: the shards of a CI matrix as one result.

Each runner of a GPU matrix runs ``gdncheck gate --shard I/N`` and uploads its ``OUT/gate-summary.json``
and ``OUT/PROFILE/verify-summary-PROFILE.json``. :func:`merge_gates` reads those folders, refuses a
set that is not one complete matrix (another implementation, another fixture suite, other profiles,
another plan, a shard missing or twice: :func:`check_matrix`) and a label its cases belie (a case or
a property in two shards, a shard whose cases are not those its label selects: :func:`check_cases`;
a shard's label is its own word, its cases are checked), and writes one result as a gate does:
``OUT/gate-summary.json`` (the verdict over every case and property), one verify summary per profile
with every shard's cases, ``OUT/gate-junit.xml`` and, with ``report``, the report folder (each
profile's HTML report and the index). The shards are disjoint (every N-th case and property unit);
each profile's verdict is judged again on the merged cases, known failures and coverage included.

A merge takes no shard's word it can check (:func:`rejudge`): every case a shard's verify summary
lists is judged again from that shard's outputs files (``SHARD/PROFILE/ID.safetensors``) against the
fixture suite the shards name (found by its manifest's sha256: ``--fixtures``, the shards' own
folder, or the committed suite); a case whose outputs are missing, unusable or judge otherwise than
its summary says refuses the merge (exit 2, one line naming the shard and the case). The merged verify
summaries are these judgements, not the shards' files. A summary or outputs file that is a link out of
its shard's folder is refused. What cannot be judged again is said: the property results are the
shards' (a merge runs nothing), a case a shard skipped must be one the gate skips on the interpreter.

Every path a merge writes is checked first by the plain gate's own check
(:func:`.folders.refuse_gate_writes`): no fixture suite, nothing of a user's replaced (``OUT/PROFILE``
the gate's folders, ``--junit`` a new file or a JUnit file gdncheck wrote), and no output that is, lies
inside or contains a shard folder. ``OUT`` is locked as a gate's is.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from gdncheck.conformance.judge.records import CaseReport, FirstDivergence, Record, Summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.errors import GDNError
from gdncheck.fixtures.manifest import DEFAULT_DIR, FixtureError, load_manifest, sha256_file
from gdncheck.untrusted import UnsafePathError, folder_lock, one_line, read_json, safe_path, safe_text

from . import summary as gs
from .folders import JUNIT_NAME, OUTPUTS_MARKER, SUMMARY_NAME, fresh, refuse_gate_writes, remove_stale
from .plan import interpreter_skip_reason
from .report import gate_junit, write_report
from .xfails import DEFAULT_PATH as DEFAULT_XFAILS
from .xfails import load_xfails


class MergeError(GDNError):
    """Shard results that do not make one matrix, or cannot be read."""

    code = "gate_merge"


def load_shard(folder: str | Path) -> tuple[Path, dict]:
    """A shard's gate folder (or its gate-summary.json) and its checked gate summary."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    doc = read_json(shard_file(folder, SUMMARY_NAME, "gate summary (gdncheck gate --out)"),
                    what="gate summary (gdncheck gate --out)", error=MergeError)
    try:
        gs.validate_gate_summary(doc)
    except Exception as exc:  # noqa: BLE001 - jsonschema's ValidationError, reported as the file's problem
        raise MergeError(f"{folder / 'gate-summary.json'}: not a gate summary: {getattr(exc, 'message', exc)}") \
            from None
    return folder, doc


def shard_file(folder: Path, name: str, what: str, profile: str | None = None) -> Path:
    """``folder[/profile]/name``, a file read from a shard: it stays inside the shard's folder (no link
    out, no device or folder in its place; :func:`gdncheck.untrusted.safe_path`), else :class:`MergeError`."""
    try:
        base = safe_path(folder, profile, "the profile folder of a shard", kind="dir") if profile else folder
        return safe_path(base, name, what)
    except UnsafePathError as exc:
        raise MergeError(f"shard {folder}: {exc}; a merge reads only what lies inside each shard's folder") from None


def read_verify_summary(folder: Path, p: str) -> dict:
    return read_json(shard_file(folder, f"verify-summary-{p}.json", f"verify summary of profile {p}", p),
                     what=f"verify summary of profile {p}", error=MergeError)


def summary_from_json(doc: dict) -> Summary:
    """A verify summary read back (:meth:`Summary.to_json`'s inverse, as far as JUnit and merging need)."""
    names = {f.name for f in fields(CaseReport)}
    cases = []
    for c in doc["cases"]:
        kw = {k: v for k, v in c.items() if k in names and k not in ("records", "first_divergence")}
        cases.append(CaseReport(**kw, first_divergence=FirstDivergence.from_json(c.get("first_divergence")),
                                records=[Record.from_json(r) for r in c.get("records", [])]))
    return Summary(profile=doc["profile"], mode=doc["mode"], implementation=doc["implementation"],
                   tolerances=doc["tolerances"], fixtures=doc["fixtures"], outputs=doc["outputs"],
                   environment=doc["environment"], tool=doc["tool"], cases=cases, notes=list(doc.get("notes", [])),
                   bounds=doc.get("bounds"), xfails=doc.get("xfails"))


def _same(shards: list[tuple[Path, dict]], what: str, get) -> object:
    values = [(folder, get(doc)) for folder, doc in shards]
    first = values[0][1]
    for folder, v in values[1:]:
        if v != first:
            raise MergeError(f"expected shards of one gate run; {folder} has {what} {v!r}, "
                             f"{values[0][0]} has {first!r}")
    return first


def check_matrix(shards: list[tuple[Path, dict]]) -> int:
    """The matrix size N, once the shards are I/N for every I exactly once, of one implementation,
    suite, set of profiles and plan (selection, options, property settings, known-failures file)."""
    _same(shards, "implementation", lambda d: d["implementation"].get("spec"))
    _same(shards, "implementation options", lambda d: d["implementation"].get("options"))
    _same(shards, "fixture suite (manifest sha256)", lambda d: (d.get("fixtures") or {}).get("manifest_sha256"))
    _same(shards, "profiles", lambda d: (d.get("selection") or {}).get("profiles"))
    _same(shards, "selection (--case, --tag)",
          lambda d: [(d.get("selection") or {}).get(k) for k in ("cases", "tags")])
    _same(shards, "property settings (max_examples, hypothesis_profile, shrink)",
          lambda d: [(d.get("properties") or {}).get(k) for k in ("max_examples", "hypothesis_profile", "shrink")])
    _same(shards, "known-failures file", lambda d: (d.get("xfails") or {}).get("file"))
    got = [(folder, tuple((d.get("selection") or {}).get("shard") or (0, 1))) for folder, d in shards]
    n = got[0][1][1]
    for folder, (_, m) in got:
        if m != n:
            raise MergeError(f"expected shards of one matrix of {n}; {folder} is a shard of {m}")
    seen: dict[int, Path] = {}
    for folder, (i, _) in got:
        if i in seen:
            raise MergeError(f"shard {i}/{n} given twice: {seen[i]} and {folder}")
        seen[i] = folder
    missing = [f"{i}/{n}" for i in range(n) if i not in seen]
    if missing:
        raise MergeError(f"expected every shard of the matrix of {n}; missing {', '.join(missing)}")
    return n


def shard_cases(folder: Path, doc: dict) -> dict[str, list[str]]:
    """profile -> the case ids a shard judged (its verify summary's) and skipped (its selection's),
    its verify summaries checked to be of that profile and of the shard's suite."""
    out = {}
    skipped = [s["case"] for s in (doc.get("selection") or {}).get("skipped", [])]
    for p, section in (doc.get("profiles") or {}).items():
        ids = list(skipped)
        if section.get("totals"):
            v = read_verify_summary(folder, p)
            if not isinstance(v, dict) or v.get("profile") != p or not isinstance(v.get("cases"), list) or \
                    (v.get("fixtures") or {}).get("manifest_sha256") != doc["fixtures"].get("manifest_sha256"):
                raise MergeError(f"{folder / p}: expected the verify summary of profile {p} of this shard's suite, "
                                 f"found one of profile {v.get('profile') if isinstance(v, dict) else None!r} or "
                                 "of another suite")
            ids += [str(c.get("id")) for c in v["cases"] if isinstance(c, dict)]
        out[p] = ids
    return out


def check_cases(shards: list[tuple[Path, dict]], n: int, fixtures: Path | None = None) -> None:
    """Each case judged by one shard only, and by the shard its label says (``select_cases``' every
    N-th case from the I-th, read off the suite when its manifest is at hand; else the counts a
    label implies): a relabelled copy of a shard, or a shard of another plan, is refused."""
    owner: dict[tuple[str, str], str] = {}
    per_shard = []
    for folder, doc in shards:
        label = "{}/{}".format(*((doc.get("selection") or {}).get("shard") or (0, 1)))
        cases = shard_cases(folder, doc)
        per_shard.append(cases)
        for p, ids in cases.items():
            for case in ids:
                if owner.get((p, case)) == f"{label} ({folder})":
                    raise MergeError(f"{folder}: shard {label} lists case {case} ({p}) twice (judged and skipped, "
                                     f"or judged twice); expected each case once")
                if (p, case) in owner:
                    raise MergeError(f"expected disjoint shards; case {case} ({p}) is in shard {owner[p, case]} and "
                                     f"in shard {label} ({folder}): a copy of one shard under another label?")
                owner[p, case] = f"{label} ({folder})"
    props: dict[tuple[str, str], Path] = {}
    for folder, doc in shards:
        for r in (doc.get("properties") or {}).get("results", []):
            key = (r.get("name"), r.get("profile"))
            if key in props:
                raise MergeError(f"expected disjoint shards; property {key[0]} ({key[1]}) was searched by {props[key]} "
                                 f"and by {folder}")
            props[key] = folder
    ran = [(folder, doc, cases) for (folder, doc), cases in zip(shards, per_shard) if doc.get("profiles")]
    if len(ran) < len(shards):  # a shard that could not run: the merged verdict says so, nothing to compare
        return
    expected = _expected_cases(shards, n, fixtures)
    profiles = (shards[0][1].get("selection") or {}).get("profiles") or []
    for folder, doc, cases in ran:
        i = (doc["selection"].get("shard") or (0, 1))[0]
        absent = [p for p in profiles if p not in cases]
        if absent:
            raise MergeError(f"{folder}: shard {i}/{n} ran, but its summary has no section for profile(s) "
                             f"{', '.join(absent)} of its selection {', '.join(profiles)}")
        for p, ids in cases.items():  # every profile judges (or skips) every case of the shard
            got = sorted(set(ids))
            if expected is not None:
                want = sorted(expected[i])
                if got != want:
                    extra, lost = sorted(set(got) - set(want)), sorted(set(want) - set(got))
                    raise MergeError(f"{folder}: shard {i}/{n} of this suite selects {len(want)} case(s), its "
                                     f"summary holds {len(got)} in profile {p}"
                                     + (f"; not its own: {', '.join(extra[:3])}" if extra else "")
                                     + (f"; missing: {', '.join(lost[:3])}" if lost else ""))
    total = sum(d["selection"]["selected"] for _, d in shards)
    for folder, doc in shards:
        i = (doc["selection"].get("shard") or (0, 1))[0]
        want = len(range(i, total, n))
        if doc["selection"]["selected"] != want:
            raise MergeError(f"{folder}: shard {i}/{n} of {total} selected case(s) selects {want}, its summary says "
                             f"{doc['selection']['selected']}: a shard of another selection or label")


def _expected_cases(shards: list[tuple[Path, dict]], n: int,
                    fixtures: Path | None = None) -> dict[int, list[str]] | None:
    """Shard index -> the case ids its label selects in the suite the shards name, when that suite's
    manifest is at hand with the shards' sha256 (else None: the counts alone are checked)."""
    from gdncheck.fixtures.manifest import select_cases

    first = shards[0][1]
    folder = fixtures if fixtures is not None else Path(str((first.get("fixtures") or {}).get("dir") or ""))
    try:
        if not folder.name or sha256_file(folder / "manifest.json") != first["fixtures"].get("manifest_sha256"):
            return None
        manifest = load_manifest(folder)
        sel = first["selection"]
        return {i: [e["id"] for e in select_cases(manifest, sel.get("cases"), sel.get("tags"),
                                                  (i, n) if n > 1 else None)] for i in range(n)}
    except (FixtureError, OSError, ValueError):
        return None


def find_suite(shards: list[tuple[Path, dict]], fixtures: str | Path | None = None,
               fixtures_sha256: str | None = None) -> Path:
    """The fixture suite the shards were judged against, here: the folder whose ``manifest.json`` has
    the sha256 the shards record (``fixtures``, else the shards' own folder, else the committed suite);
    ``fixtures_sha256`` pins it. :class:`MergeError` when it is not at hand: the shards' outputs cannot
    be judged again, and a merge takes no summary on trust."""
    first = shards[0][1]
    want = str((first.get("fixtures") or {}).get("manifest_sha256") or "")
    if fixtures_sha256 is not None and fixtures_sha256 != want:
        raise MergeError(f"--fixtures-sha256 pins the manifest {fixtures_sha256}; the shards were judged against "
                         f"the manifest {want or 'none'}")
    recorded = str((first.get("fixtures") or {}).get("dir") or "")
    candidates = [Path(fixtures)] if fixtures else [p for p in (Path(recorded) if recorded else None, DEFAULT_DIR) if p]
    found = []
    for folder in candidates:
        try:
            sha = sha256_file(folder / "manifest.json")
        except (OSError, FixtureError):
            found.append(f"{folder}: no manifest.json")
            continue
        if sha == want:
            return folder
        found.append(f"{folder}: manifest sha256 {sha}")
    raise MergeError(safe_text(f"expected the fixture suite the shards were judged against (manifest sha256 "
                               f"{want or 'none'}) to judge their outputs again, found {'; '.join(found)}; pass "
                               f"--fixtures DIR (a merge takes no shard's verdict on trust)"))


def check_skips(shards: list[tuple[Path, dict]], fixtures: Path) -> None:
    """Each case a shard lists as skipped is one the gate skips on Triton's interpreter
    (:func:`.plan.interpreter_skip_reason`), by a shard that ran there: a skip is not a verdict, and
    a shard may not move a case it failed into its skipped list."""
    entries = {e["id"]: e for e in load_manifest(fixtures)["cases"] if isinstance(e, dict) and "id" in e}
    for folder, doc in shards:
        label = _label(doc)
        for s in (doc.get("selection") or {}).get("skipped", []):
            case = s.get("case")
            reason = interpreter_skip_reason(entries[case]) if case in entries else None
            if reason is None or not (doc.get("implementation") or {}).get("interpreter"):
                raise MergeError(safe_text(
                    f"{folder}: shard {label} lists case {case} as skipped, which a gate "
                    + ("on the interpreter runs" if case in entries else "cannot select: no such case in the suite")
                    + (" (this shard did not run on the interpreter)"
                       if case in entries and reason is not None else "")
                    + "; a skipped case is no verdict a merge can take"))
            s["reason"] = f"skipped on the interpreter: {reason}"


def _label(doc: dict) -> str:
    return "{}/{}".format(*((doc.get("selection") or {}).get("shard") or (0, 1)))


def _record_keys(records) -> list[tuple]:
    return [(r.get("step"), r.get("call"), r.get("tensor"), r.get("verdict")) if isinstance(r, dict) else (None,)
            for r in records]


def _claim(c: dict) -> str:
    recs = c.get("records") if isinstance(c.get("records"), list) else []
    failing = sum(isinstance(r, dict) and r.get("verdict") == "fail" for r in recs)
    return f"{c.get('status')} ({len(recs)} record(s), {failing} failing)"


def rejudge(folder: Path, doc: dict, p: str, fixtures: Path, xfails: list | None) -> Summary:
    """Profile ``p`` of one shard judged again from its outputs files: ``verify`` of ``SHARD/p/`` against
    ``fixtures`` for the cases its verify summary lists. Each case must judge as the summary says (its
    status, and the verdict of every record: step, call, tensor), else :class:`MergeError` naming the
    shard and the case; the shard's likely cause (advice, never a verdict) is kept on an agreeing case."""
    label = _label(doc)
    claimed = read_verify_summary(folder, p)
    cases = [c for c in claimed.get("cases", []) if isinstance(c, dict)]
    ids = [str(c.get("id")) for c in cases]
    outputs = folder / p
    try:
        if outputs.is_symlink() or not outputs.is_dir():
            raise MergeError(f"{folder}: shard {label} has no outputs folder {outputs} (a folder inside the shard), "
                             f"so its {len(ids)} case(s) of profile {p} cannot be judged again; a merge takes no "
                             f"shard's verdict on trust (upload the whole gate folder, outputs files included)")
        summary = verify(fixtures, outputs, p, cases=ids, xfails=xfails,
                         manifest_sha256=doc["fixtures"].get("manifest_sha256"))
    except FixtureError as exc:
        raise MergeError(safe_text(f"{folder}: shard {label}: its cases of profile {p} cannot be judged again: "
                                   f"{one_line(str(exc))}")) from None
    judged = {c.id: c for c in summary.cases}
    for c, case_id in zip(cases, ids, strict=True):
        mine = judged.get(case_id)
        where = f"{folder}: shard {label}, case {case_id} ({p})"
        if mine is None:
            raise MergeError(safe_text(f"{where}: its summary lists a case the suite does not select"))
        if mine.status != c.get("status") or \
                [(r.step, r.call, r.tensor, r.verdict) for r in mine.records] != _record_keys(c.get("records") or []):
            found = f"{mine.status} ({len(mine.records)} record(s), " \
                    f"{sum(r.verdict == 'fail' for r in mine.records)} failing)"
            why = f": {mine.problem}" if mine.status == "error" and mine.problem else ""
            raise MergeError(one_line(safe_text(
                f"{where}: expected its outputs to judge as its summary says, {_claim(c)}; its outputs "
                f"{outputs / (case_id + '.safetensors')} judge {found}{why}; a merge takes no shard's "
                f"verdict on trust")))
        if isinstance(c.get("diagnosis"), dict):
            mine.diagnosis = c["diagnosis"]
    summary.cases = [judged[i] for i in ids]  # the summary's cases, each once (an id prefix may select more)
    return summary


def _merge_summaries(parts: list[Summary], xfails_file: str) -> Summary:
    """One profile's verify summary of every shard's cases (judged again), known failures joined."""
    merged = parts[0]
    for more in parts[1:]:
        merged.cases.extend(more.cases)
        merged.notes.extend(n for n in more.notes if n not in merged.notes)
    if merged.xfails is not None:
        merged.xfails["file"] = xfails_file
        for key in ("known_failures", "stale", "refused"):
            merged.xfails[key] = [x for part in parts for x in (part.xfails or {}).get(key, [])]
        lines = set.intersection(*({x["line"] for x in (part.xfails or {}).get("unmatched", [])} for part in parts))
        merged.xfails["unmatched"] = [x for x in merged.xfails.get("unmatched", []) if x["line"] in lines]
    return merged


def merge_gates(folders: list[str | Path], out: str | Path, *, junit: str | Path | None = None,
                report: str | Path | None = None, fixtures: str | Path | None = None,
                fixtures_sha256: str | None = None, xfails: str | Path | None = None) -> dict:
    """Merge the shards' gate folders into ``out``; the merged gate summary (``exit_code``, ``verdict``).

    ``fixtures``: the suite the shards were judged against (default: found by the sha256 they record);
    ``xfails``: the known-failures file the cases are judged again with (default: the shards' own
    ``none``, else the packaged ``gate/xfails.txt``). Raises :class:`MergeError`, or a refusal of a
    path (:class:`~gdncheck.writes.WriteRefused`, :class:`.folders.FolderError`), before anything is
    written."""
    if not folders:
        raise MergeError("expected the gate folders of the shards to merge, found none")
    shards = sorted((load_shard(f) for f in folders),
                    key=lambda s: ((s[1].get("selection") or {}).get("shard") or [0])[0])
    n = check_matrix(shards)
    out = Path(out)
    first = shards[0][1]
    profiles = first["selection"]["profiles"]
    suite = find_suite(shards, fixtures, fixtures_sha256)
    # every path written, before anything is: the plain gate's check, the shards as inputs
    refuse_gate_writes(out, fixtures=suite, junit=junit, report=report, profiles=profiles,
                       inputs=[folder for folder, _ in shards])
    check_cases(shards, n, suite)
    check_skips(shards, suite)
    shard_xfails = (first.get("xfails") or {}).get("file")
    no_xfails = str(xfails if xfails is not None else shard_xfails or "").lower() == "none"
    try:
        entries = None if no_xfails else load_xfails(xfails)
    except GDNError as exc:
        raise MergeError(f"--xfails: {exc}") from None
    xfails_file = "none" if no_xfails else str(xfails or DEFAULT_XFAILS)
    parts_of: dict[str, list[Summary]] = {p: [] for p in profiles}
    shard_codes = []  # each shard's exit code as its own cases, judged again, give it (never its word)
    for folder, d in shards:  # every shard's cases judged again from its outputs files: read only
        codes = [] if d.get("profiles") else [2]  # a shard that could not run at all
        for p in profiles:
            if p in (d.get("profiles") or {}) and d["profiles"][p].get("totals"):
                parts_of[p].append(rejudge(folder, d, p, suite, entries))
                codes.append(parts_of[p][-1].exit_code)
            elif d.get("profiles"):
                codes.append(2)  # nothing judged in this profile
        props = (d.get("properties") or {}).get("results", [])
        shard_codes.append(max(codes + [int(any(r.get("status") == "fail" for r in props))]))
    summaries: dict[str, Summary] = {}
    doc = gs.head(first["implementation"]["spec"], first["implementation"].get("options", {}), out)
    doc["implementation"] = first["implementation"]
    doc["fixtures"] = {**first["fixtures"], "dir": str(suite)}
    doc["selection"] = {**first["selection"], "shard": None,
                        "selected": sum(d["selection"]["selected"] for _, d in shards),
                        "run": sum(d["selection"]["selected"] - len(d["selection"]["skipped"]) for _, d in shards),
                        "skipped": [s for _, d in shards for s in d["selection"]["skipped"]]}
    results = sorted((r for _, d in shards for r in (d.get("properties") or {}).get("results", [])),
                     key=lambda r: (r["name"], profiles.index(r["profile"]) if r["profile"] in profiles else 0))
    doc["properties"] = {**(first.get("properties") or {}), "units": sum((d.get("properties") or {}).get("units", 0)
                                                                         for _, d in shards),
                         "results": results, "totals": gs.property_totals(results)}
    doc["notes"] = [f"each shard's {sum(len(s.cases) for ps in parts_of.values() for s in ps)} case verdict(s) "
                    f"judged again from its outputs files against {suite}; the property results are the shards' "
                    "(a merge runs nothing)"]
    if suite.resolve() != DEFAULT_DIR.resolve() and fixtures_sha256 is None:
        pin = first["fixtures"].get("manifest_sha256")
        doc["notes"].append(f"the manifest of {suite} is not pinned: its case files match it, but nothing says it "
                            f"is the suite you meant; pin it with --fixtures-sha256 {pin}")
    with folder_lock(out, "gate --merge --out"):  # one writer per folder, as a gate's OUT
        remove_stale(out / SUMMARY_NAME, out / JUNIT_NAME, *([Path(junit)] if junit else []))
        doc["profiles"] = {}
        for p in profiles:
            sections = [d["profiles"][p] for _, d in shards if p in (d.get("profiles") or {})]
            if not sections:
                continue
            path = out / p / f"verify-summary-{p}.json"
            fresh(out / p, OUTPUTS_MARKER, f"the outputs folder of profile {p}")  # the gate's folder, as a run's
            if parts_of[p]:
                merged = summaries[p] = _merge_summaries(parts_of[p], xfails_file)
                merged.write(path)
                doc["profiles"][p] = gs.profile_section(merged, path, sum(s.get("seconds", 0.0) for s in sections))
            else:  # every shard skipped every case of this profile: nothing judged, whatever a shard says
                doc["profiles"][p] = gs.nothing_to_verify()
        unmatched = [(s.xfails or {}).get("unmatched", []) for s in summaries.values()]
        everywhere = set.intersection(*({x["line"] for x in u} for u in unmatched)) if unmatched else set()
        doc["xfails"] = {"file": xfails_file,
                         "stale": [{**x, "profile_run": p} for p, s in summaries.items()
                                   for x in (s.xfails or {}).get("stale", [])],
                         "refused": [{**x, "profile_run": p} for p, s in summaries.items()
                                     for x in (s.xfails or {}).get("refused", [])],
                         "unmatched": [x for x in (unmatched[0] if unmatched else []) if x["line"] in everywhere]}
        doc["environment"] = first.get("environment", {})
        doc["timing"] = {"total_s": max(d["timing"]["total_s"] for _, d in shards),
                         "work_s": round(sum(d["timing"].get("work_s", d["timing"]["total_s"]) for _, d in shards), 2)}
        doc["merged"] = [{"dir": str(folder), "shard": f"{i}/{n}", "exit_code": c, "verdict": gs.VERDICTS[c],
                          "reason": safe_text(d.get("reason")) if not d.get("profiles") else None}
                         for i, ((folder, d), c) in enumerate(zip(shards, shard_codes, strict=True))]
        # the verdict as the gate reaches it (gate/run.py's summarise), over the merged profiles and
        # properties; a shard that could not run at all (no profiles) makes the whole result so
        code = max([v["exit_code"] for v in doc["profiles"].values()] + [int(doc["properties"]["totals"]["fail"] > 0)]
                   + [2 for _, d in shards if not d.get("profiles")])
        doc["exit_code"], doc["verdict"] = code, gs.VERDICTS[code]
        doc["reason"] = None
        if code == 2:
            ran = [f"shard {m['shard']} could not run: {m['reason'] or 'no reason given'}" for m in doc["merged"]
                   if m["exit_code"] == 2 and not shards[int(m["shard"].split("/")[0])][1].get("profiles")]
            judged = [gs.could_not_judge_reason(doc)] if any(v["exit_code"] == 2 for v in doc["profiles"].values()) \
                else []
            doc["reason"] = "; ".join([*ran, *judged]) or "a profile could not be judged"
        junit_paths = [out / JUNIT_NAME] + ([Path(junit)] if junit else [])
        doc["outputs"].update(summary=str(out / SUMMARY_NAME), junit=[str(p) for p in junit_paths],
                              report=str(report) if report else None)
        known = {p: {k["case"]: k["reason"] for k in v.get("known_failures", [])} for p, v in doc["profiles"].items()}
        xml = gate_junit(doc, summaries, known, {})
        for p in junit_paths:
            xml.write(p)
        if report:
            doc["outputs"]["report_files"] = [str(f) for f in write_report(Path(report), doc, summaries)]
        gs.write_summary(out, doc)
    return doc
