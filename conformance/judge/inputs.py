"""What verify reads of a case before judging it: the golden file checked, the outputs file's
metadata checked, and what the implementation declared there (an error it raised, a step it cannot
express). Anything wrong here makes the case unusable (status ``error``), not a failure.
"""

from __future__ import annotations

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.fixtures.manifest import FixtureError
from gdncheck.harness import END_TO_END, OUTPUTS_FORMAT, call_key, call_steps, has_input, is_packed, mode_name
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import STATE_NAMES


def check_golden(entry: dict, gold: SafetensorsFile) -> None:
    """Every expected tensor the manifest promises is in the file, float64, finite, [B, T, ...] (a
    serving step's: [total_tokens, ...], its states the pool's [S, ...] with S = batch)."""
    B = entry["batch"]
    for step in call_steps(entry["program"]):
        k = step["call"]
        if has_input(step) and call_key(k, "x") not in gold:
            raise FixtureError(f"{entry['file']}: input {call_key(k, 'x')} is missing (fixture damaged)")
        if entry["kind"] == "error":
            continue
        for name in step["expected"]:
            key = call_key(k, name)
            if key not in gold:
                raise FixtureError(f"{entry['file']}: expected tensor {key} is missing (fixture damaged)")
            if gold.dtype_of(key) != "F64":
                raise FixtureError(f"{entry['file']}: {key} is {gold.dtype_of(key)}, expected F64 (fixture damaged)")
            shape = gold.shape_of(key)
            if is_packed(step):
                lead, want = shape[0], (B if name in STATE_NAMES else step["T"])
                if lead != want:
                    raise FixtureError(f"{entry['file']}: {key} has shape {list(shape)}, expected "
                                       f"[{want}, ...] (fixture damaged)")
            elif shape[0] != B or (name not in STATE_NAMES and shape[1] != step["T"]):
                raise FixtureError(f"{entry['file']}: {key} has shape {list(shape)}, expected [B={B}, T={step['T']}, "
                                   f"...] (fixture damaged)")
            if not np.isfinite(gold.read(key)).all():
                raise FixtureError(f"{entry['file']}: {key} holds NaN or inf (fixture damaged)")


def check_outputs_meta(entry: dict, meta: dict, stage_isolated: bool) -> None:
    """The outputs file is of our format, for this case, made from this fixture, in verify's mode."""
    if meta.get("format") != OUTPUTS_FORMAT:
        raise FixtureError(f"expected metadata format={OUTPUTS_FORMAT!r} in the outputs file, found "
                           f"{meta.get('format')!r} (FORMAT.md §7)")
    if meta.get("case") != entry["id"]:
        raise FixtureError(f"the outputs file is for case {meta.get('case')!r}, expected {entry['id']!r}")
    sha = meta.get("fixture_sha256")
    if sha and sha != entry["sha256"]:
        raise FixtureError(f"the outputs were made from a fixture file of sha256 {sha[:16]}..., but this fixture's "
                           f"is {entry['sha256'][:16]}...: rerun the implementation on the current fixtures")
    mode = meta.get("mode", END_TO_END)
    if mode != mode_name(stage_isolated):
        raise FixtureError(f"the outputs were made in mode {mode}, but verify runs in {mode_name(stage_isolated)} "
                           f"(add or drop --stage-isolated)")


def dims(entry: dict) -> dict[str, int] | None:
    """The case's shape symbols (name-table widths), None when its config does not parse."""
    try:
        return GDNConfig.from_hf(dict(entry["config"])).dims()
    except Exception:  # noqa: BLE001 - an error case's config may be broken on purpose
        return None


def raised(meta: dict) -> dict | None:
    """``{code, message, step}`` of the error the implementation raised (FORMAT.md §7), if it did."""
    if "error_code" not in meta:
        return None
    try:
        step = int(meta.get("error_step", "-1"))
    except ValueError:
        step = -1
    return {"code": meta["error_code"], "message": meta.get("error_message", ""), "step": step}


def not_applicable(meta: dict, steps: list) -> dict | None:
    """``{step, op, reason}`` when the implementation declared the case not applicable (FORMAT.md §7)."""
    if "not_applicable" not in meta:
        return None
    try:
        step = int(meta.get("not_applicable_step", "0"))
    except ValueError:
        step = 0
    return {"step": step, "op": op_at(steps, step), "reason": meta["not_applicable"]}


def op_at(steps: list, step) -> str:
    """The op of ``steps[step]``, ``?`` when the step is no index of the program."""
    return steps[step]["op"] if isinstance(step, int) and 0 <= step < len(steps) else "?"
