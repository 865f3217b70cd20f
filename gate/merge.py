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
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from gdncheck.conformance.judge.records import CaseReport, FirstDivergence, Record, Summary
from gdncheck.errors import GDNError
from gdncheck.untrusted import read_json

from . import summary as gs
from .report import gate_junit, write_report


class MergeError(GDNError):
    """Shard results that do not make one matrix, or cannot be read."""

    code = "gate_merge"


def load_shard(folder: str | Path) -> tuple[Path, dict]:
    """A shard's gate folder (or its gate-summary.json) and its checked gate summary."""
    folder = Path(folder)
    if folder.is_file():
        folder = folder.parent
    doc = read_json(folder / "gate-summary.json", what="gate summary (gdncheck gate --out)", error=MergeError)
    try:
        gs.validate_gate_summary(doc)
    except Exception as exc:  # noqa: BLE001 - jsonschema's ValidationError, reported as the file's problem
        raise MergeError(f"{folder / 'gate-summary.json'}: not a gate summary: {getattr(exc, 'message', exc)}") \
            from None
    return folder, doc


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
            v = read_json(folder / p / f"verify-summary-{p}.json", what=f"verify summary of profile {p}",
                          error=MergeError)
            if not isinstance(v, dict) or v.get("profile") != p or not isinstance(v.get("cases"), list) or \
                    (v.get("fixtures") or {}).get("manifest_sha256") != doc["fixtures"].get("manifest_sha256"):
                raise MergeError(f"{folder / p}: expected the verify summary of profile {p} of this shard's suite, "
                                 f"found one of profile {v.get('profile') if isinstance(v, dict) else None!r} or "
                                 "of another suite")
            ids += [str(c.get("id")) for c in v["cases"] if isinstance(c, dict)]
        out[p] = ids
    return out


def check_cases(shards: list[tuple[Path, dict]], n: int) -> None:
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
    expected = _expected_cases(shards, n)
    for folder, doc, cases in ran:
        i = (doc["selection"].get("shard") or (0, 1))[0]
        got = sorted({c for ids in cases.values() for c in ids})
        if expected is not None:
            want = sorted(expected[i])
            if got != want:
                extra, lost = sorted(set(got) - set(want)), sorted(set(want) - set(got))
                raise MergeError(f"{folder}: shard {i}/{n} of this suite selects {len(want)} case(s), its summary "
                                 f"holds {len(got)}" + (f"; not its own: {', '.join(extra[:3])}" if extra else "")
                                 + (f"; missing: {', '.join(lost[:3])}" if lost else ""))
    total = sum(d["selection"]["selected"] for _, d in shards)
    for folder, doc in shards:
        i = (doc["selection"].get("shard") or (0, 1))[0]
        want = len(range(i, total, n))
        if doc["selection"]["selected"] != want:
            raise MergeError(f"{folder}: shard {i}/{n} of {total} selected case(s) selects {want}, its summary says "
                             f"{doc['selection']['selected']}: a shard of another selection or label")


def _expected_cases(shards: list[tuple[Path, dict]], n: int) -> dict[int, list[str]] | None:
    """Shard index -> the case ids its label selects in the suite the shards name, when that suite's
    manifest is at hand with the shards' sha256 (else None: the counts alone are checked)."""
    from gdncheck.fixtures.manifest import FixtureError, load_manifest, select_cases, sha256_file

    first = shards[0][1]
    folder = Path(str((first.get("fixtures") or {}).get("dir") or ""))
    try:
        if not folder.name or sha256_file(folder / "manifest.json") != first["fixtures"].get("manifest_sha256"):
            return None
        manifest = load_manifest(folder)
        sel = first["selection"]
        return {i: [e["id"] for e in select_cases(manifest, sel.get("cases"), sel.get("tags"),
                                                  (i, n) if n > 1 else None)] for i in range(n)}
    except (FixtureError, OSError, ValueError):
        return None


def _profile(sections: list[dict], summary_path: Path, merged: Summary | None) -> dict:
    """One profile's section over the shards: counts summed, lists joined, and the verdict judged again
    on the merged cases (a shard that got no case of a profile is no verdict on the others')."""
    code = max(s["exit_code"] for s in sections)
    verdict = gs.VERDICTS[code] if code != 2 else "inputs unusable"
    if merged is not None:
        code = gs.profile_code(merged)
        verdict = gs.VERDICTS[code] if code != 2 else merged.verdict()
    totals: dict[str, int] = {}
    for s in sections:
        for k, v in (s.get("totals") or {}).items():
            totals[k] = totals.get(k, 0) + v
    return {
        "verdict": verdict, "exit_code": code, "totals": totals,
        "summary": str(summary_path),
        "implementation": next((s["implementation"] for s in sections if s.get("implementation")), None),
        "seconds": round(sum(s.get("seconds", 0.0) for s in sections), 2),
        "failures": [f for s in sections for f in s.get("failures", [])],
        "not_applicable": [k for s in sections for k in s.get("not_applicable", [])],
        "known_failures": [k for s in sections for k in s.get("known_failures", [])],
    }


def merge_gates(folders: list[str | Path], out: str | Path, *, junit: str | Path | None = None,
                report: str | Path | None = None) -> dict:
    """Merge the shards' gate folders into ``out``; the merged gate summary (``exit_code``, ``verdict``)."""
    if not folders:
        raise MergeError("expected the gate folders of the shards to merge, found none")
    shards = sorted((load_shard(f) for f in folders),
                    key=lambda s: ((s[1].get("selection") or {}).get("shard") or [0])[0])
    n = check_matrix(shards)
    check_cases(shards, n)
    out = Path(out)
    first = shards[0][1]
    profiles = first["selection"]["profiles"]
    summaries: dict[str, Summary] = {}
    doc = gs.head(first["implementation"]["spec"], first["implementation"].get("options", {}), out)
    doc["implementation"] = first["implementation"]
    doc["fixtures"] = first["fixtures"]
    doc["selection"] = {**first["selection"], "shard": None,
                        "selected": sum(d["selection"]["selected"] for _, d in shards),
                        "run": sum(d["selection"]["run"] for _, d in shards),
                        "skipped": [s for _, d in shards for s in d["selection"]["skipped"]]}
    results = sorted((r for _, d in shards for r in (d.get("properties") or {}).get("results", [])),
                     key=lambda r: (r["name"], profiles.index(r["profile"]) if r["profile"] in profiles else 0))
    doc["properties"] = {**(first.get("properties") or {}), "units": sum((d.get("properties") or {}).get("units", 0)
                                                                         for _, d in shards),
                         "results": results, "totals": gs.property_totals(results)}
    out.mkdir(parents=True, exist_ok=True)
    doc["profiles"] = {}
    for p in profiles:
        sections = [d["profiles"][p] for _, d in shards if p in (d.get("profiles") or {})]
        if not sections:
            continue
        parts = [summary_from_json(read_json(folder / p / f"verify-summary-{p}.json",
                                             what=f"verify summary of profile {p}", error=MergeError))
                 for folder, d in shards if p in (d.get("profiles") or {}) and d["profiles"][p].get("totals")]
        path = out / p / f"verify-summary-{p}.json"
        merged = None
        if parts:
            merged = parts[0]
            for more in parts[1:]:
                merged.cases.extend(more.cases)
                merged.notes.extend(n for n in more.notes if n not in merged.notes)
                if more.xfails:  # the known failures of every shard: the merged verdict sets them apart too
                    mine = merged.xfails = merged.xfails or {"file": more.xfails.get("file", ""), "entries": 0,
                                                             "known_failures": [], "stale": []}
                    for key in ("known_failures", "stale", "refused"):
                        mine[key] = [*mine.get(key, []), *more.xfails.get(key, [])]
                    mine.pop("unmatched", None)  # one shard's: the gate summary holds the matrix's
            merged.write(path)
            summaries[p] = merged
        doc["profiles"][p] = _profile(sections, path, merged)
    unmatched = [(d.get("xfails") or {}).get("unmatched", []) for _, d in shards]
    everywhere = set.intersection(*({x["line"] for x in u} for u in unmatched))  # no case of any shard
    doc["xfails"] = {"file": (first.get("xfails") or {}).get("file"),
                     "stale": [x for _, d in shards for x in (d.get("xfails") or {}).get("stale", [])],
                     "refused": [x for _, d in shards for x in (d.get("xfails") or {}).get("refused", [])],
                     "unmatched": [x for x in unmatched[0] if x["line"] in everywhere]}
    doc["environment"] = first.get("environment", {})
    doc["timing"] = {"total_s": max(d["timing"]["total_s"] for _, d in shards),
                     "work_s": round(sum(d["timing"].get("work_s", d["timing"]["total_s"]) for _, d in shards), 2)}
    doc["merged"] = [{"dir": str(folder), "shard": f"{i}/{n}", "exit_code": d["exit_code"], "verdict": d["verdict"],
                      "reason": d.get("reason")}
                     for i, (folder, d) in enumerate(shards)]
    # the verdict as the gate reaches it (gate/run.py's summarise), over the merged profiles and
    # properties; a shard that could not run at all (no profiles) makes the whole result so
    code = max([v["exit_code"] for v in doc["profiles"].values()] + [int(doc["properties"]["totals"]["fail"] > 0)]
               + [d["exit_code"] for _, d in shards if not d.get("profiles")])
    doc["exit_code"], doc["verdict"] = code, gs.VERDICTS[code]
    doc["reason"] = "; ".join(f"shard {m['shard']}: {m['reason']}" for m in doc["merged"] if m["reason"]) or None
    junit_paths = [out / "gate-junit.xml"] + ([Path(junit)] if junit else [])
    doc["outputs"].update(summary=str(out / "gate-summary.json"), junit=[str(p) for p in junit_paths],
                          report=str(report) if report else None)
    known = {p: {k["case"]: k["reason"] for k in v.get("known_failures", [])} for p, v in doc["profiles"].items()}
    xml = gate_junit(doc, summaries, known, {})
    for p in junit_paths:
        xml.write(p)
    if report:
        doc["outputs"]["report_files"] = [str(f) for f in write_report(Path(report), doc, summaries)]
    gs.write_summary(out, doc)
    return doc
