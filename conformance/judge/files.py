"""A case's files, checked before verify judges it: the golden file (every tensor the manifest
promises, float64, finite, of its shape), the outputs file's metadata, and what the implementation
declared there (an error it raised, a step it cannot express). Anything wrong here makes the case
unusable (status ``error``), not a failure.
"""

from __future__ import annotations

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.features import FormatVersionError, parse_version
from gdncheck.fixtures.manifest import FixtureError
from gdncheck.harness import (
    END_TO_END,
    MODES,
    OUTPUTS_FORMAT,
    OUTPUTS_FORMAT_VERSION,
    call_key,
    call_steps,
    has_input,
    is_packed,
    mode_name,
)
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import KNOWN_TENSORS, STATE_TENSORS
from gdncheck.untrusted import safe_text


def check_golden(entry: dict, gold: SafetensorsFile) -> None:
    """Every expected tensor the manifest promises is in the file, float64, finite, of the shape the
    case's config gives it ([B, T, ...] per call, the states [B, ...]; a serving step's [total_tokens,
    ...], its states the pool's [S, ...] with S = batch), checked before it is read."""
    shapes = dims(entry) if entry["kind"] != "error" else None
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
            want = expected_shape(name, entry["batch"], step["T"], shapes, packed=is_packed(step))
            if gold.shape_of(key) != want:
                raise FixtureError(f"{entry['file']}: {key} has shape {list(gold.shape_of(key))}, expected "
                                   f"{list(want)} (fixture damaged)")
            if not np.isfinite(gold.read(key)).all():
                raise FixtureError(f"{entry['file']}: {key} holds NaN or inf (fixture damaged)")


def expected_shape(name: str, batch: int, T: int, shapes: dict[str, int], *, packed: bool = False
                   ) -> tuple[int, ...]:
    """A call's tensor ``name`` as the case's dimensions shape it: [B, T, ...] for a stage tensor,
    [B, ...] for a state (docs/spec.md §2, §4). Either layer kind's tensors (the sparse block's
    router_logits, ... are expected on a sparse case); a name of neither is a damaged manifest. A serving
    step's (``packed``, FORMAT.md §4.1): a stage tensor packed by token, [T, ...] with T = total_tokens
    (no batch axis); a state the whole pool, [S, ...] with S = the case's batch."""
    spec = KNOWN_TENSORS.get(name) or next((t for t in STATE_TENSORS if t.name == name), None)
    if spec is None:
        raise FixtureError(f"the manifest expects a tensor {safe_text(name)!r}, which is no stage tensor or state "
                           f"of either layer kind (docs/spec.md §2, §4)")
    if shapes is None or any(sym != "T" and sym not in shapes for sym in spec.shape):
        raise FixtureError(f"tensor {safe_text(name)!r} has shape symbols {list(spec.shape)}, but the case's config "
                           f"gives only {sorted(shapes or ())} (a sparse tensor on a dense case?)")
    rest = tuple(T if sym == "T" else shapes[sym] for sym in spec.shape)
    if packed and spec.shape[:1] == ("T",):
        return rest
    return (batch, *rest)


def check_outputs_meta(entry: dict, meta: dict, stage_isolated: bool) -> None:
    """The outputs file is of our format and version, for this case, made from this fixture, in
    verify's mode, and what it declares (an error raised, a step not applicable) names a step of the
    program (FORMAT.md §7)."""
    if meta.get("format") != OUTPUTS_FORMAT:
        raise FixtureError(f"expected metadata format={OUTPUTS_FORMAT!r} in the outputs file, found "
                           f"{meta.get('format')!r} (FORMAT.md §7)")
    if meta.get("format_version") != OUTPUTS_FORMAT_VERSION:
        raise FixtureError(f"expected metadata format_version={OUTPUTS_FORMAT_VERSION!r} in the outputs file, found "
                           f"{meta.get('format_version')!r} (FORMAT.md §7: required; §10: a reader refuses versions "
                           f"it does not know)")
    if "fixture_format_version" in meta:  # optional: the fixture format the port was written for
        try:
            parse_version(meta["fixture_format_version"], "metadata fixture_format_version")
        except FormatVersionError as exc:
            raise FixtureError(f"{exc} (FORMAT.md §7)") from None
    if meta.get("case") != entry["id"]:
        raise FixtureError(f"the outputs file is for case {meta.get('case')!r}, expected {entry['id']!r}")
    sha = meta.get("fixture_sha256")
    if sha and sha != entry["sha256"]:
        raise FixtureError(f"the outputs were made from a fixture file of sha256 {sha[:16]!r}..., but this fixture's "
                           f"is {entry['sha256'][:16]}...: rerun the implementation on the current fixtures")
    mode = meta.get("mode", END_TO_END)
    if mode not in MODES:
        raise FixtureError(f"expected metadata mode one of {', '.join(MODES)}, found {mode!r}")
    if mode != mode_name(stage_isolated):
        raise FixtureError(f"the outputs were made in mode {mode}, but verify runs in {mode_name(stage_isolated)} "
                           f"(add or drop --stage-isolated)")
    steps = len(entry["program"])
    if "error_code" in meta:
        if not meta["error_code"].strip():
            raise FixtureError("metadata error_code is empty; expected the code of the error raised (FORMAT.md §6)")
        _step(meta, "error_step", steps, required=True)
    if "not_applicable" in meta:
        if "error_code" in meta:
            raise FixtureError("expected either error_code or not_applicable in the outputs file's metadata (a case "
                               "stops at one step, for one reason: FORMAT.md §7), found both")
        if not meta["not_applicable"].strip():
            raise FixtureError("metadata not_applicable is empty; expected the reason the case cannot be run")
        _step(meta, "not_applicable_step", steps, required=False)


def _step(meta: dict, key: str, steps: int, *, required: bool) -> int:
    """A step index the metadata declares: a decimal integer in [0, steps)."""
    if key not in meta and not required:
        return 0
    value = meta.get(key)
    # ASCII digits, and few of them: int() of 5000 digits raises (Python's limit), which read as a gdncheck bug
    if value is None or not (value.isascii() and value.isdecimal()) or len(value) > 9 or not int(value) < steps:
        shown = repr(value) if value is None or len(value) <= 40 else f"a string of {len(value)} characters"
        raise FixtureError(f"expected metadata {key} a step index 0..{steps - 1} of the case's program, found "
                           f"{shown} (FORMAT.md §7)")
    return int(value)


def dims(entry: dict) -> dict[str, int] | None:
    """The case's shape symbols (name-table widths), None when its config does not parse."""
    try:
        return GDNConfig.from_hf(dict(entry["config"])).dims()
    except Exception:  # noqa: BLE001 - an error case's config may be broken on purpose
        return None


def raised(meta: dict) -> dict | None:
    """``{code, message, step}`` of the error the implementation raised (FORMAT.md §7), if it did; the
    port's words made one line of visible characters (:func:`gdncheck.untrusted.safe_text`).
    The metadata passed :func:`check_outputs_meta`."""
    if "error_code" not in meta:
        return None
    return {"code": safe_text(meta["error_code"]), "message": safe_text(meta.get("error_message", "")),
            "step": int(meta["error_step"]), "raised_by": safe_text(meta.get("error_raised_by", "implementation"))}


def not_applicable(meta: dict, steps: list) -> dict | None:
    """``{step, op, reason}`` when the implementation declared the case not applicable (FORMAT.md §7)."""
    if "not_applicable" not in meta:
        return None
    step = int(meta.get("not_applicable_step", "0"))
    return {"step": step, "op": op_at(steps, step), "reason": safe_text(meta["not_applicable"])}


def op_at(steps: list, step) -> str:
    """The op of ``steps[step]``, ``?`` when the step is no index of the program."""
    return steps[step]["op"] if isinstance(step, int) and 0 <= step < len(steps) else "?"
