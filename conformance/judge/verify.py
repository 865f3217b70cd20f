"""``gdncheck verify``: judge a port's outputs against the goldens, per case, call and stage tensor.

:func:`verify` is what the CLI and the gate call. A case whose inputs cannot be used (fixture or
outputs file missing, truncated, damaged, of another fixture version, outside its folder) is
reported with status ``error`` and the reason; every other case is still verified. Nothing is
written here; :meth:`Summary.write` writes the JSON atomically.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gdncheck._version import __version__
from gdncheck.config import GDNConfig
from gdncheck.errors import SafetensorsFormatError
from gdncheck.fixtures.manifest import (
    CaseProblem,
    FixtureError,
    case_file,
    load_manifest,
    safe_file,
    select_cases,
    sha256_file,
)
from gdncheck.harness import OUTPUTS_FORMAT, mode_name
from gdncheck.profiles import VERIFY_PROFILES, choices
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import REQUIRED_OUTPUTS, STATE_STAGE_INDEX, tensor_rank

from . import messages
from .aliases import NamedOutputs, NameTable, load_names
from .metrics import CaseStats
from .records import CaseReport, FirstDivergence, Record, Summary
from .tolerances import ToleranceTable, load_table
from .verdicts import base_record, judge


def verify(fixtures_dir: str | Path, outputs_dir: str | Path, profile: str, *, cases: list[str] | None = None,
           tags: list[str] | None = None, shard: tuple[int, int] | None = None, stage_isolated: bool = False,
           tolerances: str | Path | ToleranceTable | None = None,
           progress: Callable[[CaseReport], None] | None = None, names: str | None = None) -> Summary:
    """Verify the outputs in ``outputs_dir`` against the fixtures in ``fixtures_dir`` at ``profile``.

    ``cases`` (ids or id prefixes), ``tags`` and ``shard=(i, n)`` select cases; ``names`` reads the
    outputs through a name table (:mod:`.aliases`: ``hf``, ``doppler``, ``metrale`` or a path). Raises
    :class:`FixtureError` only when the fixture folder itself is unusable (no readable manifest) or
    the name table is unknown.
    """
    table = tolerances if isinstance(tolerances, ToleranceTable) else load_table(tolerances)
    name_table = load_names(names)
    mode = mode_name(stage_isolated)
    if profile not in VERIFY_PROFILES:
        raise FixtureError(f"expected --profile {choices(VERIFY_PROFILES)}, found {profile!r}")
    problems: list[CaseProblem] = []
    manifest = load_manifest(fixtures_dir, problems)
    entries = select_cases(manifest, cases, tags, shard, also_known=[p.case for p in problems])
    summary = Summary(
        profile=profile, mode=mode, implementation={}, tolerances=table.describe(),
        fixtures={"dir": str(fixtures_dir), "suite": manifest["suite"], "format_version": manifest["format_version"],
                  "manifest_sha256": sha256_file(Path(fixtures_dir) / "manifest.json"),
                  "generator": manifest["generator"]},
        outputs={"dir": str(outputs_dir), "names": name_table.source if name_table else None},
        environment={"python": platform.python_version(), "numpy": np.__version__, "platform": platform.platform()},
        tool={"name": "gdncheck", "version": __version__},
    )
    if stage_isolated:
        skipped = [e["id"] for e in entries if e["kind"] == "error"]
        entries = [e for e in entries if e["kind"] != "error"]
        if skipped:
            summary.notes.append(f"stage-isolated mode: {len(skipped)} expected-error case(s) not applicable")
    for p in problems:
        if not cases or any(p.case.startswith(c) for c in cases):
            summary.cases.append(CaseReport(p.case, "unknown", [], "error", problem=p.message))
    impls: dict[str, dict] = {}
    for entry in entries:
        report = verify_case(Path(fixtures_dir), Path(outputs_dir), entry, profile, table, stage_isolated, impls,
                             names=name_table)
        summary.cases.append(report)
        if progress:
            progress(report)
    summary.implementation = _implementation(impls, profile, summary)
    return summary


def _implementation(impls: dict[str, dict], profile: str, summary: Summary) -> dict:
    names = sorted({m.get("implementation", "unknown") for m in impls.values()})
    profiles = sorted({m.get("profile", "") for m in impls.values()} - {""})
    if profiles and profiles != [profile]:
        summary.notes.append(f"outputs were produced in profile {', '.join(profiles)}, verified at {profile}")
    first = next(iter(impls.values()), {})
    return {"name": ", ".join(names) if names else "unknown", "profile": ", ".join(profiles) or None,
            "device": first.get("device"), "command": first.get("command")}


def verify_case(fx: Path, out: Path, entry: dict, profile: str, table: ToleranceTable, stage_isolated: bool,
                impls: dict[str, dict] | None = None, names: NameTable | None = None) -> CaseReport:
    rep = CaseReport(entry["id"], entry["kind"], list(entry.get("tags", [])), "pass", file=entry["file"])
    rep.repro = messages.repro(str(fx), str(out), profile, entry["id"], stage_isolated=stage_isolated)
    try:
        gold = SafetensorsFile(case_file(fx, entry))
        _check_golden(entry, gold)
    except (FixtureError, SafetensorsFormatError) as exc:
        return _unusable(rep, f"fixture unusable: {exc}")
    name = f"{entry['id']}.safetensors"
    try:
        opath = safe_file(out, name, "outputs file")
        rep.outputs_file = str(opath)
        if not opath.is_file():
            return _unusable(rep, f"no outputs file {name} in {out}: run the implementation on this case first "
                                  f"(gdncheck run ... --case {entry['id']})")
        outs = NamedOutputs(SafetensorsFile(opath), names, _dims(entry))
        meta = outs.metadata
        _check_outputs_meta(entry, meta, stage_isolated)
        rep.notes.extend(outs.notes())
    except (FixtureError, SafetensorsFormatError) as exc:
        return _unusable(rep, f"outputs unusable: {exc}")
    if impls is not None:
        impls[entry["id"]] = meta
    if meta.get("command"):
        rep.repro = messages.repro(str(fx), str(out), profile, entry["id"], stage_isolated=stage_isolated,
                                   run_command=meta["command"])
    err = _raised(meta)
    steps = entry["program"]
    na = _not_applicable(meta, steps)
    if na is not None:  # judge what ran before the step the implementation cannot express
        rep.not_applicable = na
        if entry["kind"] != "error":
            _judge_program(rep, entry, gold, outs, out, profile, table, stage_isolated, fx, until=na["step"])
    elif entry["kind"] == "error":
        _check_error(rep, entry, err)
    elif err is not None:
        op = steps[err["step"]]["op"] if isinstance(err.get("step"), int) and 0 <= err["step"] < len(steps) else "?"
        rep.status, rep.message = "fail", messages.raised(entry["id"], err, op)
        rep.first_divergence = FirstDivergence.at_step(err.get("step"), op, "raised")
    else:
        _judge_program(rep, entry, gold, outs, out, profile, table, stage_isolated, fx)
    return _finish(rep)


def _dims(entry: dict) -> dict[str, int] | None:
    """The case's shape symbols (name-table widths), None when its config does not parse."""
    try:
        return GDNConfig.from_hf(dict(entry["config"])).dims()
    except Exception:  # noqa: BLE001 - an error case's config may be broken on purpose
        return None


def _unusable(rep: CaseReport, problem: str) -> CaseReport:
    rep.status, rep.problem = "error", problem
    return rep


def _check_golden(entry: dict, gold: SafetensorsFile) -> None:
    """Every expected tensor the manifest promises is in the file, float64, finite, [B, T, ...]."""
    B = entry["batch"]
    for step in entry["program"]:
        if step["op"] not in ("forward", "decode"):
            continue
        k = step["call"]
        if f"calls.{k}.x" not in gold:
            raise FixtureError(f"{entry['file']}: input calls.{k}.x is missing (fixture damaged)")
        if entry["kind"] == "error":
            continue
        for name in step["expected"]:
            key = f"calls.{k}.{name}"
            if key not in gold:
                raise FixtureError(f"{entry['file']}: expected tensor {key} is missing (fixture damaged)")
            if gold.dtype_of(key) != "F64":
                raise FixtureError(f"{entry['file']}: {key} is {gold.dtype_of(key)}, expected F64 (fixture damaged)")
            shape = gold.shape_of(key)
            if shape[0] != B or (name not in ("conv_state", "recurrent_state") and shape[1] != step["T"]):
                raise FixtureError(f"{entry['file']}: {key} has shape {list(shape)}, expected [B={B}, T={step['T']}, "
                                   f"...] (fixture damaged)")
            if not np.isfinite(gold.read(key)).all():
                raise FixtureError(f"{entry['file']}: {key} holds NaN or inf (fixture damaged)")


def _check_outputs_meta(entry: dict, meta: dict, stage_isolated: bool) -> None:
    if meta.get("format") != OUTPUTS_FORMAT:
        raise FixtureError(f"expected metadata format={OUTPUTS_FORMAT!r} in the outputs file, found "
                           f"{meta.get('format')!r} (FORMAT.md §7)")
    if meta.get("case") != entry["id"]:
        raise FixtureError(f"the outputs file is for case {meta.get('case')!r}, expected {entry['id']!r}")
    sha = meta.get("fixture_sha256")
    if sha and sha != entry["sha256"]:
        raise FixtureError(f"the outputs were made from a fixture file of sha256 {sha[:16]}..., but this fixture's "
                           f"is {entry['sha256'][:16]}...: rerun the implementation on the current fixtures")
    mode = meta.get("mode", "end_to_end")
    if mode != mode_name(stage_isolated):
        raise FixtureError(f"the outputs were made in mode {mode}, but verify runs in {mode_name(stage_isolated)} "
                           f"(add or drop --stage-isolated)")


def _raised(meta: dict) -> dict | None:
    if "error_code" not in meta:
        return None
    try:
        step = int(meta.get("error_step", "-1"))
    except ValueError:
        step = -1
    return {"code": meta["error_code"], "message": meta.get("error_message", ""), "step": step}


def _not_applicable(meta: dict, steps: list) -> dict | None:
    """``{step, op, reason}`` when the implementation declared the case not applicable (FORMAT.md §7)."""
    if "not_applicable" not in meta:
        return None
    try:
        step = int(meta.get("not_applicable_step", "0"))
    except ValueError:
        step = 0
    op = steps[step]["op"] if 0 <= step < len(steps) else "?"
    return {"step": step, "op": op, "reason": meta["not_applicable"]}


def _check_error(rep: CaseReport, entry: dict, err: dict | None) -> None:
    expected = entry["expected_error"]
    op = entry["program"][expected["step"]]["op"]
    check = {"expected": expected["code"], "accept": expected["accept"], "step": expected["step"],
             "actual": err["code"] if err else None, "actual_step": err["step"] if err else None,
             "actual_message": err["message"] if err else None, "match": None}
    if err is None:
        rep.status, rep.message = "fail", messages.error_expected(entry["id"], expected, op)
    elif err["code"] in expected["accept"] and err["step"] == expected["step"]:
        check["match"] = "exact" if err["code"] == expected["code"] else "family"
    else:
        rep.status, rep.message = "fail", messages.wrong_error(entry["id"], err, expected, op)
    rep.error_check = check
    if rep.status == "fail":
        rep.first_divergence = FirstDivergence.at_step(expected["step"], op,
                                                       "error_expected" if err is None else "wrong_error")


def _read(outs: NamedOutputs, key: str, shape=None) -> tuple[np.ndarray | None, str | None]:
    if key not in outs:
        return None, None
    return outs.read(key, shape), outs.dtype_of(key)


def _judge_program(rep, entry, gold, outs, out: Path, profile, table, stage_isolated, fx,
                   until: int | None = None) -> None:
    """Judge every call (and saved snapshot) of the program, or of its steps before ``until``."""
    mode = mode_name(stage_isolated)
    required = () if stage_isolated else REQUIRED_OUTPUTS
    case = entry["id"]
    stats = case_stats(entry, gold)
    for i, step in enumerate(entry["program"]):
        if until is not None and i >= until:
            break
        op = step["op"]
        if op in ("forward", "decode"):
            k = step["call"]
            loc = messages.where(case, i, op, step["seq_pos"])
            for name in step["expected"]:
                key = f"calls.{k}.{name}"
                actual, dtype = _read(outs, key, gold.shape_of(key))
                rec = base_record(case, i, op, k, name, seq_pos=list(step["seq_pos"]),
                                  expected_ref={"file": str(Path(fx) / entry["file"]), "key": key},
                                  actual_ref=outs.ref(rep.outputs_file, key))
                judge(rec, actual, dtype, gold.read(key), table.bound(name, profile, mode, case),
                      required=name in required, subject=messages.subject(name, rec.stage, k), loc=loc,
                      stats=stats.get(name))
                rep.records.append(rec)
            if not stage_isolated:
                _judge_seq_len(rep, outs, step, i, loc)
        elif op == "save" and not stage_isolated:
            _judge_snapshot_file(rep, entry, gold, out, step, i, profile, table, stats, fx, outs.table)


def _judge_seq_len(rep: CaseReport, outs: SafetensorsFile, step: dict, i: int, loc: str) -> None:
    key = f"calls.{step['call']}.seq_len"
    actual, dtype = _read(outs, key)
    if actual is None:
        return
    rec = Record(case=rep.id, step=i, op=step["op"], call=step["call"], tensor="seq_len", stage="state",
                 stage_index=STATE_STAGE_INDEX, verdict="pass", dtype=dtype, shape=list(actual.shape),
                 expected_shape=[len(step["seq_len_after"])], actual_ref={"file": rep.outputs_file, "key": key})
    if dtype is None or not dtype.startswith(("I", "U")) or \
            not np.array_equal(np.asarray(actual).ravel(), np.asarray(step["seq_len_after"])):
        rec.verdict, rec.reason = "fail", "seq_len"
        rec.message = messages.seq_len_failure(f"seq_len after call {step['call']}",
                                               np.asarray(actual).ravel().tolist(), step["seq_len_after"], loc)
    rep.records.append(rec)


def case_stats(entry: dict, gold) -> dict[str, CaseStats]:
    """Per tensor, its scales over every call of the case (metrics.CaseStats), from the goldens."""
    arrays: dict[str, list[np.ndarray]] = {}
    for step in entry["program"]:
        if step["op"] in ("forward", "decode"):
            for name in step["expected"]:
                arrays.setdefault(name, []).append(np.asarray(gold[f"calls.{step['call']}.{name}"]))
    return {name: CaseStats(name, arrs) for name, arrs in arrays.items()}


def _judge_snapshot_file(rep, entry, gold, out: Path, step: dict, i: int, profile, table, stats, fx: Path,
                         names: NameTable | None = None) -> None:
    case, c = entry["id"], step["state_of_call"]
    loc = messages.where(case, i, "save")
    cfg = None
    try:
        path = safe_file(out, step["file"], "snapshot file")
        snap = NamedOutputs(SafetensorsFile(path), names, _dims(entry)) if path.is_file() else None
        problem = None if snap is not None else f"file {step['file']} is not in {out}"
    except (FixtureError, SafetensorsFormatError) as exc:
        snap, problem, path = None, str(exc), None
    for name in ("conv_state", "recurrent_state"):
        gkey = f"calls.{c}.{name}" if c is not None else None
        if gkey is not None and gkey not in gold:
            continue  # the fixture keeps this state only after the last call
        if gkey is None:
            cfg = cfg or GDNConfig.from_hf(entry["config"])
            shape = (entry["batch"], cfg.conv_dim, cfg.conv_kernel) if name == "conv_state" else \
                (entry["batch"], cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim)
            expected = np.zeros(shape)
        else:
            expected = gold.read(gkey)
        rec = base_record(case, i, "save", c, name, expected_ref={"file": str(Path(fx) / entry["file"]), "key": gkey},
                          actual_ref=snap.ref(str(path), name) if snap is not None else
                          {"file": str(path) if path else step["file"], "key": name})
        subj = messages.subject(name, rec.stage, c, snapshot=step["file"])
        if snap is None:
            rec.expected_shape = list(expected.shape)
            rec.verdict, rec.reason = "fail", "missing_required"
            rec.message = f"{subj}: {problem}, but should be there (the program saves it) {loc}"
        else:
            actual, dtype = _read(snap, name, expected.shape)
            judge(rec, actual, dtype, expected, table.bound(name, profile, "end_to_end", case), required=True,
                  subject=subj, loc=loc, stats=stats.get(name))
        rep.records.append(rec)


def _finish(rep: CaseReport) -> CaseReport:
    for r in rep.records:
        rep.counts[r.verdict] = rep.counts.get(r.verdict, 0) + 1
    failed = [r for r in rep.records if r.verdict == "fail"]
    if failed and rep.status == "pass":
        rep.status = "fail"
    elif rep.not_applicable is not None and rep.status == "pass":
        na = rep.not_applicable
        rep.status = "not_applicable"
        rep.message = (f"not applicable from step {na['step']} ({na['op']}): {na['reason']}"
                       + (f"; the {len(rep.records)} tensor(s) of the steps before it pass" if rep.records else ""))
    if failed:
        first = min(failed, key=lambda r: (r.step, r.stage_index, tensor_rank(r.tensor)))
        rep.first_divergence = FirstDivergence.of_record(first)
        rep.message = first.message
    return rep

