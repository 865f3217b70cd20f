"""``gdncheck run``: drive a Python implementation over the fixture cases and write its outputs in
the port format (fixtures/FORMAT.md §7), exactly as a port in another language would.

:func:`run_impl` is what the CLI and the gate call. Each case's outputs file is written atomically
once the case has run (a case whose fixture is unusable is skipped and reported; nothing partial
is left). An exception the implementation raises is a result: its code, message and step go into
the outputs file, and ``verify`` judges them. :class:`~gdncheck.harness.NotApplicable` goes in as metadata
``not_applicable`` (the reason) and ``not_applicable_step``.

Every outputs file carries ``run_config``: the implementation, options, profile and mode of the run
that wrote it (:func:`run_config`). With ``lock=True`` (the ``gdncheck run`` command) a run holds the
lock of its folder (:func:`gdncheck.untrusted.folder_lock`: one writer per folder) and refuses a
folder that holds the outputs of another run (:func:`runs_in`) unless ``overwrite``. Before any
case runs, every file name the run will write is computed (:func:`plan_names`): a case whose
snapshot file is named like another case's outputs file, like a summary, or as another case's
snapshot file, or whose file name is longer than a file system takes, is skipped and reported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gdncheck._version import __version__
from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.filenames import NAME_MAX, plan_names  # noqa: F401 - NAME_MAX: re-exported
from gdncheck.errors import GDNError, SafetensorsFormatError
from gdncheck.experts import mlp_kind_of
from gdncheck.fixtures.manifest import (
    CaseProblem,
    FixtureError,
    SelectionError,
    case_file,
    load_manifest,
    refuse_output_in_suite,
    select_cases,
)
from gdncheck.harness import (
    OUTPUTS_FORMAT,
    OUTPUTS_FORMAT_VERSION,
    CaseInput,
    NotApplicable,
    call_key,
    call_steps,
    error_code,
    execute,
    golden_inputs,
    has_input,
    is_packed,
    mode_name,
    to_numpy,
)
from gdncheck.harness.program import ProgramError
from gdncheck.harness.sharded import isolated_cp_inputs
from gdncheck.profiles import RUN_PROFILES
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors
from gdncheck.stages import layer_stage_names, stage_outputs
from gdncheck.untrusted import folder_lock, no_surrogates, one_line, safe_path, safe_text
from gdncheck.weights import LayerWeights

from .plugin import check_options, load_factory, parse_options
from .sharded_run import (
    case_plan,
    check_world,
    is_sharded,
    not_applicable,
    parse_world,
    run_in_process,
    run_spawned,
    state_in,
)


@dataclass
class CaseRun:
    id: str
    status: str  # ran | raised | not_applicable | skipped
    detail: str = ""
    file: str | None = None


@dataclass
class RunReport:
    implementation: str
    profile: str
    out: str
    cases: list[CaseRun] = field(default_factory=list)

    @property
    def skipped(self) -> list[CaseRun]:
        return [c for c in self.cases if c.status == "skipped"]


def load_case_input(fixtures_dir: Path, entry: dict) -> tuple[CaseInput, SafetensorsFile]:
    """The executor's input from a case file: config, weights, inputs (checksum verified; a forward
    case's inputs [B, T, D], a serving step's [T, D], as the manifest says before they are read)."""
    f = SafetensorsFile(case_file(fixtures_dir, entry))
    weights = {k[len("weights."):]: f.read(k) for k in f if k.startswith("weights.")}
    width = GDNConfig.from_hf(dict(entry["config"])).hidden_size if entry["kind"] == "forward" else None
    inputs = {}
    for step in call_steps(entry["program"]):
        if not has_input(step):
            continue  # commit: no input
        key = call_key(step["call"], "x")
        if key not in f:
            raise FixtureError(f"{entry['file']}: input {key} is missing (fixture damaged)")
        packed = is_packed(step)  # a serving step's input is packed by token: [T, D] (FORMAT.md §4.1)
        want = (step["T"], width) if packed else (entry["batch"], step["T"], width)
        if width is not None and f.shape_of(key) != want:
            raise FixtureError(f"{entry['file']}: input {key} has shape {list(f.shape_of(key))}, expected "
                               f"{'[T, D]' if packed else '[B, T, D]'} = {list(want)} (fixture damaged)")
        inputs[step["call"]] = f.read(key)
    return CaseInput(entry["id"], entry["config"], weights, entry["batch"], entry["program"], inputs), f


def default_command(impl: str, fixtures_dir, out_dir, profile: str, options: Mapping | None,
                    stage_isolated: bool) -> str:
    opts = "".join(f" --option {shlex.quote(f'{k}={v}')}" for k, v in (options or {}).items())
    iso = " --stage-isolated" if stage_isolated else ""
    return (f"gdncheck run {shlex.quote(impl)} --fixtures {shlex.quote(str(fixtures_dir))} "
            f"--out {shlex.quote(str(out_dir))} --profile {profile}{opts}{iso}")


def run_config(name: str, profile: str, options: Mapping | None, stage_isolated: bool) -> str:
    """The ``run_config`` metadata of a run's outputs files: what makes two runs' outputs one run's
    (the implementation as given, its options, the profile, the mode), and not the paths, the
    selection or the shard: shards and reruns of cases into one folder are one run."""
    return json.dumps({"implementation": name, "options": {str(k): str(v) for k, v in sorted((options or {}).items())},
                       "profile": profile, "mode": mode_name(stage_isolated)}, sort_keys=True)


#: The largest header :func:`runs_in` reads to find an outputs file's run (a larger one: not judged here)
_RUN_HEADER_MAX = 16 * 1024 * 1024


def _outputs_metadata(path: Path) -> dict | None:
    """The metadata of a port-format outputs file, or None (not one, or unreadable: verify says why)."""
    import struct

    from gdncheck.untrusted import loads_untrusted

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > _RUN_HEADER_MAX:
                return None
            header = loads_untrusted(fh.read(n))
    except (OSError, ValueError, RecursionError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != OUTPUTS_FORMAT:
        return None
    if not all(isinstance(v, str) for v in meta.values()):
        return None
    return meta


def run_of(meta: Mapping[str, str]) -> tuple[str, str]:
    """``(key, description)`` of the run an outputs file's metadata says made it: its ``run_config``
    (gdncheck run), else its ``command``, else its implementation name; with its profile and mode."""
    if "run_config" in meta:
        key = "run_config " + meta["run_config"]
    elif "command" in meta:
        key = "command " + meta["command"]
    else:
        key = "implementation " + meta.get("implementation", "")
    key += f" | profile {meta.get('profile')} | mode {meta.get('mode')}"
    text = (f"implementation {meta.get('implementation', '?')!r}, profile {meta.get('profile', '?')}"
            + (f", mode {meta['mode']}" if "mode" in meta else "")
            + (f", command {meta['command']!r}" if "command" in meta else ""))
    return key, one_line(text, 400)


def runs_in(folder: str | Path, *, gdncheck_runs_only: bool = False) -> dict[str, tuple[str, list[str]]]:
    """The runs whose outputs files lie in ``folder`` (its ``*.safetensors`` of format
    ``gdncheck-outputs``; snapshot files and unreadable files are left out): ``{key: (description,
    [file names])}``, keys as :func:`run_of` gives them. ``gdncheck_runs_only``: only files ``gdncheck
    run`` wrote (they carry ``run_config``); a port writing its own outputs names its runs its own way."""
    runs: dict[str, tuple[str, list[str]]] = {}
    folder = Path(folder)
    if not folder.is_dir():
        return runs
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(".safetensors") or path.name.startswith(".") or path.is_symlink() \
                or not path.is_file():
            continue
        meta = _outputs_metadata(path)
        if meta is None or (gdncheck_runs_only and "run_config" not in meta):
            continue
        key, text = run_of(meta)
        runs.setdefault(key, (text, []))[1].append(path.name)
    return runs


def mixed_runs_message(folder: str | Path, runs: Mapping[str, tuple[str, list[str]]], flag: str = "--outputs") -> str:
    """One line saying that ``folder`` holds the outputs of several runs, and of which."""
    parts = [f"{text}: {len(files)} file(s), e.g. {files[0]}" for text, files in runs.values()]
    return one_line(f"{flag} {folder} holds the outputs files of {len(runs)} different runs ({'; '.join(parts)}); "
                    f"verify judges one run's outputs, never a mix: run each into its own folder (or rerun with "
                    f"gdncheck run --overwrite)", 3000)


def _other_runs(out_dir: Path, key: str, overwrite: bool) -> None:
    """Refuse (``overwrite`` False) or remove (True) the outputs files of runs other than ``key`` in
    ``out_dir``, with the verify summaries that judged them."""
    others = {k: v for k, v in runs_in(out_dir).items() if k != key}
    if not others:
        return
    if not overwrite:
        text, files = next(iter(others.values()))
        count = sum(len(f) for _, f in others.values())
        raise GDNError(one_line(f"--out {out_dir} holds {count} outputs file(s) of another run ({text}; e.g. "
                                f"{files[0]}): this run would mix with them and verify would judge both; choose "
                                f"another folder, or pass --overwrite to remove them first", 3000))
    for _, files in others.values():
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                (out_dir / name).unlink()
    for stale in out_dir.glob("verify-summary-*.json"):  # the verdicts of what was removed
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()


def run_impl(impl: str | Callable, fixtures_dir: str | Path, out_dir: str | Path, profile: str, *,
             cases: list[str] | None = None, tags: list[str] | None = None, shard: tuple[int, int] | None = None,
             options: Mapping | list[str] | None = None, stage_isolated: bool = False, command: str | None = None,
             progress: Callable[[CaseRun], None] | None = None, lock: bool = False,
             overwrite: bool = False, world: int | str | None = None) -> RunReport:
    """Run ``impl`` (``reference``, ``triton``, ``MODULE:CALLABLE`` or a factory) over the selected cases.

    ``lock``: hold the lock of ``out_dir`` while writing, and refuse a folder holding another run's
    outputs files unless ``overwrite`` (then they are removed first); the ``gdncheck run`` command
    passes it (the gate owns its folders whole and runs one case per call).

    ``world``: run the sharded cases selected on that many spawned ranks (``torch.distributed``), each
    case's plan naming that world (else refused before anything runs); None: rank by rank in this process
    (:mod:`.sharded_run`)."""
    world = parse_world(world)
    if profile not in RUN_PROFILES:
        raise GDNError(f"expected --profile one of {', '.join(RUN_PROFILES)}, found {profile!r}")
    options = parse_options(options) if isinstance(options, list) else dict(options or {})
    factory = load_factory(impl) if isinstance(impl, str) else impl
    name = impl if isinstance(impl, str) else getattr(impl, "__qualname__", repr(impl))
    check_options(factory, options, impl if isinstance(impl, str) else None)
    fixtures_dir, out_dir = Path(fixtures_dir), Path(out_dir)
    refuse_output_in_suite(out_dir, fixtures_dir)
    problems: list[CaseProblem] = []
    manifest = load_manifest(fixtures_dir, problems)
    entries = select_cases(manifest, cases, tags, shard, also_known=[p.case for p in problems])
    if stage_isolated:  # no expected-error case, no sharded case (judged rank by rank, end to end) but for a
        # stage-isolated context-parallel port (fla.ops.cp: gdncheck.harness.sharded), whose ranks are judged by stage
        isolated_cp = bool(isolated_cp_inputs(factory))
        entries = [e for e in entries if e["kind"] != "error" and (isolated_cp or not is_sharded(e))]
        if not entries:
            raise SelectionError("stage-isolated mode runs no expected-error or sharded case, and the selection "
                                 "holds only those")
    check_world(entries, world)
    names = plan_names(entries, stage_isolated)  # every file name known before anything is written
    command = command or default_command(name, fixtures_dir, out_dir, profile, options, stage_isolated)
    config = run_config(name, profile, options, stage_isolated)
    with contextlib.ExitStack() as held:
        if lock:
            held.enter_context(folder_lock(out_dir, "--out", command=command))
            _other_runs(out_dir, run_of({"run_config": config, "profile": profile,
                                         "mode": mode_name(stage_isolated)})[0], overwrite)
        _refuse_foreign_files(out_dir, entries, names)
        out_dir.mkdir(parents=True, exist_ok=True)
        return _run_cases(factory, name, fixtures_dir, out_dir, profile, entries, problems, names, cases, options,
                          stage_isolated, command, config, progress, world=world, impl=impl)


def _refuse_foreign_files(out_dir: Path, entries: list[dict], names: dict[str, str]) -> None:
    """Refuse (before any case runs) a folder where a case's outputs file name is taken by something
    that is no outputs file (FORMAT.md §7): a user's file, a link, a folder. gdncheck never replaces a
    file it did not make (:mod:`gdncheck.writes`); an outputs file of a run or a port is its to replace."""
    if not out_dir.is_dir():
        return
    for entry in entries:
        if entry["id"] in names:
            continue  # not run: nothing written
        paths = [out_dir / f"{entry['id']}.safetensors"]
        if is_sharded(entry):  # and its rank files (FORMAT.md §7.1)
            paths += [out_dir / f"{entry['id']}.rank{r}.safetensors" for r in range(case_plan(entry)[1].world)]
        for path in paths:
            if not os.path.lexists(path):
                continue
            if path.is_symlink() or not path.is_file() or _outputs_metadata(path) is None:
                raise GDNError(one_line(f"--out {out_dir} holds {path.name}, which is not an outputs file (FORMAT.md "
                                        f"§7, format {OUTPUTS_FORMAT}) but the run would write one there: gdncheck "
                                        f"never replaces a file it did not make; choose another folder, or remove it "
                                        f"first"))


def _run_cases(factory, name, fixtures_dir: Path, out_dir: Path, profile: str, entries: list[dict],
               problems: list[CaseProblem], names: dict[str, str], cases, options, stage_isolated: bool,
               command: str, config: str, progress, world: int | None = None, impl=None) -> RunReport:
    report = RunReport(name, profile, str(out_dir))
    spawned = _spawn_sharded(impl if impl is not None else factory, factory, fixtures_dir, out_dir, entries, names,
                             world, profile, options, stage_isolated)
    for p in problems:
        if not cases or any(p.case.startswith(c) for c in cases):
            report.cases.append(CaseRun(p.case, "skipped", f"manifest entry unusable: {p.message}"))
            if progress:
                progress(report.cases[-1])
    for entry in entries:
        if entry["id"] in names:
            report.cases.append(CaseRun(entry["id"], "skipped", f"not run, nothing written: {names[entry['id']]}"))
            if progress:
                progress(report.cases[-1])
            continue
        try:
            inp, gold = load_case_input(fixtures_dir, entry)
            na = None
            if is_sharded(entry):
                report.cases.append(_run_sharded(factory, name, entry, inp, gold, out_dir, profile, options,
                                                 command, config, spawned, stage_isolated))
                if progress:
                    progress(report.cases[-1])
                continue
            if stage_isolated:
                outputs, error, impl_name, na = _run_isolated(factory, inp, gold, profile, options)
            else:
                res = execute(factory, inp, profile=profile, options=options, snapshot_dir=out_dir)
                outputs, error, impl_name, na = res.outputs, res.error, res.implementation, res.not_applicable
        except (FixtureError, SafetensorsFormatError, ProgramError) as exc:
            report.cases.append(CaseRun(entry["id"], "skipped", str(exc)))
            if progress:
                progress(report.cases[-1])
            continue
        meta = {"format": OUTPUTS_FORMAT, "format_version": OUTPUTS_FORMAT_VERSION, "case": entry["id"],
                "implementation": no_surrogates(str(impl_name or name)), "profile": profile,
                "mode": mode_name(stage_isolated),
                "fixture_sha256": entry["sha256"], "generator": f"gdncheck {__version__}", "command": command,
                "run_config": config}
        if error:
            meta.update({"error_code": error["code"], "error_message": error["message"],
                         "error_step": str(error["step"])})
            if error.get("raised_by"):  # gdncheck's own config parser, before the port was called
                meta["error_raised_by"] = error["raised_by"]
        if na:
            meta.update({"not_applicable": na["reason"], "not_applicable_step": str(na["step"])})
        path = safe_path(out_dir, f"{entry['id']}.safetensors", "outputs file")
        write_safetensors(path, {k: np.ascontiguousarray(v) for k, v in outputs.items()}, meta)
        status, detail = "ran", ""
        if error:  # the implementation's own words, one line of visible characters
            status, detail = "raised", safe_text(f"{error['code']} at step {error['step']}: {error['message']}")
        elif na:
            status, detail = "not_applicable", safe_text(f"at step {na['step']}: {na['reason']}")
        report.cases.append(CaseRun(entry["id"], status, detail, str(path)))
        if progress:
            progress(report.cases[-1])
    return report


def _spawn_sharded(impl, factory, fixtures_dir: Path, out_dir: Path, entries: list[dict], names: dict, world,
                   profile: str, options, stage_isolated: bool = False) -> dict:
    """With ``--world``: every sharded case selected that the port runs, on spawned ranks, in one launch."""
    if world is None:
        return {}
    todo = [e for e in entries if is_sharded(e) and e["id"] not in names
            and not_applicable(factory, e, stage_isolated) is None]
    if not todo:
        return {}
    inputs = {}
    for e in todo:
        try:
            inp, gold = load_case_input(fixtures_dir, e)
        except (FixtureError, SafetensorsFormatError):
            continue  # said when the case's turn comes (skipped)
        inputs[e["id"]] = (inp, state_in(gold, e, factory))
    todo = [e for e in todo if e["id"] in inputs]
    with tempfile.TemporaryDirectory(prefix=".gdncheck-ranks-", dir=out_dir) as work:
        return run_spawned(impl, inputs, todo, world, profile, options, Path(work)) if todo else {}


def _run_sharded(factory, name: str, entry: dict, inp: CaseInput, gold: SafetensorsFile, out_dir: Path, profile: str,
                 options, command: str, config: str, spawned: dict, stage_isolated: bool = False) -> CaseRun:
    """A sharded case (FORMAT.md §7.1): ``{case}.safetensors`` with the run's metadata and
    ``{case}.rank{r}.safetensors`` for every rank; not applicable for a port without the sharded method."""
    kind, plan, _ = case_plan(entry)
    na = not_applicable(factory, entry, stage_isolated)
    ranks: list[dict] = []
    status = {"error": None, "not_applicable": na}
    if na is None:
        if entry["id"] in spawned:
            ranks, status = spawned[entry["id"]]
        else:
            ranks, status = run_in_process(factory, entry, inp, gold, profile, options, out_dir)
    error, na = status.get("error"), status.get("not_applicable")
    meta = {"format": OUTPUTS_FORMAT, "format_version": OUTPUTS_FORMAT_VERSION, "case": entry["id"],
            "implementation": no_surrogates(str(name)), "profile": profile, "mode": mode_name(stage_isolated),
            "fixture_sha256": entry["sha256"], "generator": f"gdncheck {__version__}", "command": command,
            "run_config": config, "sharded": kind, "world": str(plan.world)}
    if error:
        meta.update({"error_code": str(error["code"]), "error_message": str(error["message"]),
                     "error_step": str(error["step"])})
    if na:
        meta.update({"not_applicable": str(na["reason"]), "not_applicable_step": str(na["step"])})
    path = safe_path(out_dir, f"{entry['id']}.safetensors", "outputs file")
    if not error and not na:
        for r, tensors in enumerate(ranks):
            write_safetensors(safe_path(out_dir, f"{entry['id']}.rank{r}.safetensors", "outputs file"),
                              {k: np.ascontiguousarray(v) for k, v in tensors.items()}, {**meta, "rank": str(r)})
    write_safetensors(path, {}, meta)
    if error:
        return CaseRun(entry["id"], "raised", safe_text(f"{error['code']} at step {error['step']}: "
                                                       f"{error['message']}"), str(path))
    if na:
        return CaseRun(entry["id"], "not_applicable", safe_text(f"at step {na['step']}: {na['reason']}"), str(path))
    return CaseRun(entry["id"], "ran", f"{plan.world} ranks", str(path))


#: the fields of a packed step a port's ``run_packed_stage`` is given (FORMAT.md §4.1), as int64 arrays
PACKED_FIELDS = ("cu_seqlens", "seq_pos", "slots", "snap_seq", "snap_offset", "snap_slot", "verify")


def packed_layout(step: Mapping) -> dict:
    """A packed step's layout for ``run_packed_stage``: its ``op`` and :data:`PACKED_FIELDS` it holds."""
    return {"op": step["op"], **{f: np.asarray(step[f], dtype=np.int64) for f in PACKED_FIELDS if f in step}}


def _run_isolated(factory, inp: CaseInput, gold: SafetensorsFile, profile: str, options: Mapping):
    """Stage-isolated mode (FORMAT.md §8): every stage of every call from its golden inputs."""
    cfg = GDNConfig.from_hf(dict(inp.config))
    try:
        impl = factory(cfg, LayerWeights(inp.weights, config=cfg), profile=profile, strict=False, **dict(options))
    except NotApplicable as exc:
        return {}, None, None, {"reason": str(exc), "step": 0}
    run_stage = getattr(impl, "run_stage", None)
    if run_stage is None:
        raise GDNError(f"implementation {getattr(impl, 'name', impl)!r} has no run_stage(stage, inputs): it cannot "
                       f"run in stage-isolated mode (FORMAT.md §8)")
    outputs: dict[str, np.ndarray] = {}
    error = None
    kind = mlp_kind_of(inp.weights)  # a sparse layer's pipeline holds the block's stages too
    run_packed = getattr(impl, "run_packed_stage", None)
    calls = call_steps(inp.program)
    if run_packed is None and calls and all(is_packed(s) for s in calls) and any(
            call_key(s["call"], "recurrent_state_in") in gold for s in calls):
        return {}, None, getattr(impl, "name", None), {
            "reason": f"{getattr(impl, 'name', 'the implementation')} has no run_packed_stage(stage, inputs, call): "
                      "the packed calls of a serving case that keeps their stage inputs are not run (FORMAT.md §8)",
            "step": 0}
    for step in calls:
        if step["op"] == "commit" or (is_packed(step) and run_packed is None):
            continue  # a commit has no stages; a port without a packed path runs only the plain calls
        k = step["call"]
        layout = packed_layout(step) if is_packed(step) else None
        for stage in layer_stage_names(kind)[1:]:
            inputs = golden_inputs(gold, k, stage, kind)
            if inputs is None:
                continue
            try:
                result = run_stage(stage, inputs) if layout is None else run_packed(stage, inputs, layout)
            except NotApplicable as exc:  # a call the port does not run (a packed one, say): the case's verdict
                return {}, None, getattr(impl, "name", None), {"reason": str(exc) or "not applicable",
                                                               "step": inp.program.index(step)}
            except Exception as exc:  # noqa: BLE001 - recorded for verify
                error = {"code": error_code(exc), "message": str(exc), "step": inp.program.index(step)}
                return outputs, error, getattr(impl, "name", None), None
            for name in stage_outputs(stage, kind):
                if name in result:
                    outputs[call_key(k, name)] = np.array(to_numpy(result[name]), copy=True)
    return outputs, error, getattr(impl, "name", None), None
