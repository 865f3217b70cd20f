"""Executes a case's program (fixtures/FORMAT.md §4) on an implementation of the port contract.

The same executor builds the goldens (with the float64 reference) and runs any implementation for
``verify``, so both read the program the same way. Outputs are keyed as in the fixture files:
``calls.{k}.{tensor}`` for the stage tensors and the states after call ``k``. The program's ops are
named here once (:data:`PROGRAM_OPS`; :data:`CALL_OPS` are the ones that call the layer).

The serving ops (docs/serving.md, FORMAT.md §4.1) run on the same state, read as a pool of slots
(a state of ``batch`` rows is a pool of ``batch`` slots): their input ``calls.{k}.x`` is packed
``[total_tokens, D]``, their stage tensors are ``[total_tokens, ...]``, and the states kept after
them are the whole pool. An implementation runs them through its optional methods
(``forward_packed``, ``prefix_snapshots``, ``verify_spec``, ``commit``, ``forward_mixed``, ``free``; see
:class:`~.contract.LayerAdapter`); one without them gets the case ``not_applicable``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.features import case_requires, check_declared, not_applicable_reason
from gdncheck.stages import KNOWN_TENSORS, STATE_NAMES, stage_inputs
from gdncheck.untrusted import UnsafePathError, safe_path
from gdncheck.weights import LayerWeights

from .contract import Implementation, NotApplicable, error_code, to_numpy

#: The steps that call the layer: ``forward`` (one call over the step's T tokens) and ``decode`` (T
#: one-token calls, outputs stacked along T); each has a call index and an input ``calls.{k}.x``.
#: The serving ops with a call index (FORMAT.md §4.1): the packed calls (input ``[total_tokens, D]``)
#: and ``commit``, which has no input and keeps the pool it leaves.
SERVING_CALL_OPS: tuple[str, ...] = ("forward_packed", "prefix_snapshots", "verify_spec", "commit", "forward_mixed")
CALL_OPS: tuple[str, ...] = ("forward", "decode", *SERVING_CALL_OPS)
#: Every op a program may hold (FORMAT.md §4), in the order the format lists them.
PROGRAM_OPS: tuple[str, ...] = ("construct", "reset", *CALL_OPS, "free", "snapshot", "restore", "save", "load",
                                 "shard")


@dataclass
class CaseInput:
    """What the executor needs: the case's config dict, weights, batch, program, per-call inputs."""

    id: str
    config: Mapping[str, Any]
    weights: Mapping[str, np.ndarray]
    batch: int
    program: list[Mapping[str, Any]]
    inputs: Mapping[int, np.ndarray]  # call index -> x [B, T, D] (as stored: float32, or ints for error cases)
    expected: Mapping[int, tuple[str, ...]] | None = None  # call -> tensors to keep (None: all)


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    state_in: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # {"code", "message", "step"}
    not_applicable: dict[str, Any] | None = None  # {"reason", "step"}: the implementation cannot express it
    files: list[str] = field(default_factory=list)
    implementation: str | None = None  # the implementation's ``name``


def call_key(call: int, tensor: str) -> str:
    return f"calls.{call}.{tensor}"


def call_steps(program: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The steps of ``program`` that call the layer (:data:`CALL_OPS`), in order."""
    return [step for step in program if step["op"] in CALL_OPS]


def serving_ops(program: list[Mapping[str, Any]]) -> list[str]:
    """The serving steps (:data:`SERVING_CALL_OPS`) a program uses, sorted: what an engine adapter that has
    no packed calls over slots declares not applicable (its ``check_case``)."""
    return sorted({step["op"] for step in program if step.get("op") in SERVING_CALL_OPS})


def is_strict(program: list[Mapping[str, Any]]) -> bool:
    """Whether a program constructs its layer in strict mode (``seq_pos_mismatch`` instead of the reset)."""
    return any(step.get("op") == "construct" and step.get("strict") for step in program)


def is_packed(step: Mapping[str, Any]) -> bool:
    """A serving step: its tensors are packed by token ([total_tokens, ...]), its states the whole pool."""
    return step["op"] in SERVING_CALL_OPS


def has_input(step: Mapping[str, Any]) -> bool:
    """A call step with an input ``calls.{k}.x`` (every one but ``commit``)."""
    return step["op"] in CALL_OPS and step["op"] != "commit"


def _keep(expected, call: int, name: str) -> bool:
    return expected is None or name in expected.get(call, ())


def execute(factory: Callable[..., Implementation], case: CaseInput, *, profile: str, options: Mapping | None = None,
            snapshot_dir: str | os.PathLike | None = None, capture_state_in: bool = False) -> RunResult:
    """Run ``case.program``; an exception at step i ends the program and is recorded (code, message, i),
    :class:`~.contract.NotApplicable` as ``not_applicable`` (reason, i). The factory's optional
    ``check_case(config, program)`` runs first, before the config is parsed. A factory (or the
    implementation it returns) that declares ``features`` (names of :data:`gdncheck.features.FEATURES`)
    gets the case not applicable from the first step that needs a feature it does not declare, with the
    reason ``requires commit_snapshots (format 1.2)`` (FORMAT.md §2 ``requires``; the steps before it run).

    Snapshot files of ``save``/``load`` steps live in ``snapshot_dir`` (a temporary folder if None).
    """
    if snapshot_dir is None:
        with tempfile.TemporaryDirectory(prefix="gdncheck-snapshots-") as tmp:
            return execute(factory, case, profile=profile, options=options, snapshot_dir=tmp,
                           capture_state_in=capture_state_in)
    # the programs reset states on purpose (seq_pos mismatches); gdncheck's own warning about it is noise here
    logger = logging.getLogger("gdncheck")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return _execute(factory, case, profile, options, snapshot_dir, capture_state_in)
    finally:
        logger.setLevel(level)


def _unimplemented(declared: Any, who: str, case: CaseInput) -> tuple[int, str] | None:
    """Where the case needs a feature the implementation does not declare (its ``features``, FORMAT.md §2
    ``requires``): the first step needing one, and the reason (``requires commit_snapshots (format 1.2)``,
    every such feature of the case named); None when it declares none (every feature) or all needed."""
    if declared is None:
        return None
    have = check_declared(declared, who)
    missing = {f: i for f, i in case_requires(case.config, case.program).items() if f not in have}
    if not missing:
        return None
    return min(missing.values()), not_applicable_reason(sorted(missing, key=missing.get))


def _execute(factory, case: CaseInput, profile: str, options, snapshot_dir, capture_state_in: bool) -> RunResult:
    res = RunResult()
    impl = state = None
    slots: dict[str, Any] = {}
    specs: dict[int, Any] = {}  # verify_spec call -> what its implementation returned for the commit
    step_index = 0
    parsing = False  # gdncheck's own config parser is running: an error there is gdncheck's, not the port's
    stop = None  # (step, reason): the first step needing a feature the implementation does not declare
    try:
        stop = _unimplemented(getattr(factory, "features", None), "the factory", case)
        for step_index, step in enumerate(case.program):  # noqa: B007 - read by the handler below
            op = step["op"]
            if stop is not None and step_index == stop[0]:
                raise NotApplicable(stop[1])
            if op == "construct":
                check_case = getattr(factory, "check_case", None)
                if check_case is not None:
                    check_case(dict(case.config), list(case.program))
                parsing = True
                cfg = GDNConfig.from_hf(dict(case.config))
                parsing = False
                weights = LayerWeights(case.weights, source=f"fixture {case.id}", config=cfg)
                impl = factory(cfg, weights, profile=profile, strict=bool(step.get("strict", False)),
                               **dict(options or {}))
                res.implementation = getattr(impl, "name", None)
                if stop is None:  # features declared by the implementation rather than its factory
                    stop = _unimplemented(getattr(impl, "features", None), res.implementation or "the implementation",
                                          case)
                    if stop is not None and stop[0] <= step_index:
                        raise NotApplicable(stop[1])
                state = impl.new_state(case.batch)
            elif op == "reset":
                state = impl.new_state(case.batch)
            elif op in SERVING_CALL_OPS:
                k = int(step["call"])
                if capture_state_in and op != "commit":
                    _capture_pool_in(impl, state, step, k, res)
                trace = _serving(impl, op, step, case.inputs.get(k), state, specs)
                _keep_call(res, case.expected, k, trace, impl.state_arrays(state))
            elif op == "shard":
                pass  # the whole layer runs unsharded (the goldens); each rank's share: gdncheck.harness.sharded
            elif op == "free":
                _method(impl, "free")(state, np.asarray(step["slots"], dtype=np.int64))
            elif op in CALL_OPS:
                k = int(step["call"])
                pos = np.asarray(step["seq_pos"], dtype=np.int64)
                x = case.inputs[k]
                if capture_state_in:
                    _capture_state_in(impl, state, pos, k, res)
                if op == "forward":
                    trace = _forward(impl, x, state, pos)
                else:
                    trace = _decode(impl, x, state, pos)
                _keep_call(res, case.expected, k, trace, impl.state_arrays(state))
            elif op == "snapshot":
                slots[step["slot"]] = impl.snapshot(state)
            elif op == "restore":
                impl.restore(state, slots[step["slot"]])
            elif op == "save":
                path = snapshot_file(snapshot_dir, step["file"])
                impl.save_snapshot(slots[step["slot"]], str(path))
                res.files.append(step["file"])
            elif op == "load":
                slots[step["slot"]] = impl.load_snapshot(str(snapshot_file(snapshot_dir, step["file"])))
            else:
                raise ValueError(f"expected a program op of {', '.join(PROGRAM_OPS)}, found {op!r}")
    except NotApplicable as exc:
        res.not_applicable = {"reason": str(exc) or "not applicable", "step": step_index}
    except ProgramError:
        raise  # the case's fault: never recorded as the implementation's error
    except Exception as exc:  # noqa: BLE001 - any failure of the implementation is a result, not a crash
        res.error = {"code": error_code(exc), "message": str(exc) or type(exc).__name__, "step": step_index}
        if parsing:  # the port was never asked: its outputs file says so (FORMAT.md §7, error_raised_by)
            res.error["raised_by"] = RAISED_BY_GDNCHECK
    return res


#: ``error_raised_by`` of an error gdncheck's own config parser raised before the port was called.
RAISED_BY_GDNCHECK = "gdncheck"


def _keep_call(res: RunResult, expected, k: int, trace: Mapping[str, np.ndarray], states: Mapping[str, Any]) -> None:
    for name, arr in trace.items():
        if _keep(expected, k, name):
            res.outputs[call_key(k, name)] = arr
    for name, arr in states.items():
        if (name in STATE_NAMES and _keep(expected, k, name)) or name == "seq_len":
            res.outputs[call_key(k, name)] = np.array(to_numpy(arr), copy=True)


def _method(impl: Implementation, name: str):
    """The implementation's serving method ``name``, or NotApplicable saying it has none."""
    fn = getattr(impl, name, None)
    if fn is None:
        raise NotApplicable(f"{getattr(impl, 'name', 'the implementation')} has no {name}: it does not run the "
                            f"serving patterns (packed calls over state slots, docs/serving.md)")
    return fn


def _serving(impl: Implementation, op: str, step: Mapping[str, Any], x: np.ndarray | None, pool: Any,
             specs: dict[int, Any]) -> dict[str, np.ndarray]:
    """One serving step on the pool; the trace packed by token ({} for ``commit``)."""
    ints = {f: np.asarray(step[f], dtype=np.int64) for f in ("cu_seqlens", "seq_pos", "slots", "snap_seq",
                                                            "snap_offset", "snap_slot", "accepted", "verify")
            if f in step}
    if op == "commit":
        snaps = [ints[f] for f in ("snap_seq", "snap_offset", "snap_slot") if f in ints]
        _method(impl, "commit")(specs.pop(int(step["of_call"])), ints["accepted"], *snaps)
        return {}
    layout = (ints["cu_seqlens"], ints["seq_pos"], ints["slots"])
    if op == "forward_packed":
        out, trace = _method(impl, op)(x, pool, *layout)
    elif op == "prefix_snapshots":
        out, trace = _method(impl, op)(x, pool, *layout, ints["snap_seq"], ints["snap_offset"], ints["snap_slot"])
    elif op == "forward_mixed":
        out, trace, specs[int(step["call"])] = _method(impl, op)(x, pool, *layout, ints["verify"])
    else:
        out, trace, specs[int(step["call"])] = _method(impl, op)(x, pool, *layout)
    return _trace_arrays(out, trace)


class ProgramError(GDNError):
    """A program the executor cannot run as written (a snapshot file name that would leave its folder):
    the case's fault, not the implementation's."""

    code = "program"


def snapshot_file(snapshot_dir: str | os.PathLike, name: str) -> Path:
    """Where a ``save``/``load`` step's file lives: ``name`` inside ``snapshot_dir``, never outside
    (:func:`gdncheck.untrusted.safe_path`; the manifest reader refuses such a name first)."""
    try:
        return safe_path(snapshot_dir, name, "snapshot file")
    except UnsafePathError as exc:
        raise ProgramError(str(exc)) from None


def _trace_arrays(out: Any, trace: Mapping[str, Any]) -> dict[str, np.ndarray]:
    arrays = {name: to_numpy(v) for name, v in trace.items() if name in KNOWN_TENSORS}  # either layer kind
    arrays["out"] = to_numpy(out)
    return {k: np.array(v, copy=True) for k, v in arrays.items()}


def _forward(impl: Implementation, x: np.ndarray, state: Any, pos: np.ndarray) -> dict[str, np.ndarray]:
    out, trace = impl.forward(x, state, pos)
    return _trace_arrays(out, trace)


def _decode(impl: Implementation, x: np.ndarray, state: Any, pos: np.ndarray) -> dict[str, np.ndarray]:
    """``decode``: one one-token call per token of x, outputs stacked along T."""
    steps: list[dict[str, np.ndarray]] = []
    for t in range(x.shape[1]):
        steps.append(_forward(impl, x[:, t: t + 1], state, pos + t))
    names = [n for n in steps[0] if all(n in s for s in steps)]
    return {n: np.concatenate([s[n] for s in steps], axis=1) for n in names}


def _capture_state_in(impl: Implementation, state: Any, pos: np.ndarray, k: int, res: RunResult) -> None:
    """The state a call's conv1d and delta_rule read: the current state, with the rows whose seq_len
    differs from ``seq_pos`` reset to zeros (docs/spec.md §4)."""
    arrays = {n: np.array(to_numpy(a), dtype=np.float64, copy=True) for n, a in impl.state_arrays(state).items()}
    seq_len = arrays["seq_len"].astype(np.int64)
    reset = seq_len != pos
    for name in STATE_NAMES:
        arrays[name][reset] = 0.0
        res.state_in[call_key(k, f"{name}_in")] = arrays[name]


def _capture_pool_in(impl: Implementation, pool: Any, step: Mapping[str, Any], k: int, res: RunResult) -> None:
    """The pool a packed call's conv1d and delta_rule read (FORMAT.md §8, packed calls): every slot as it
    stands, but the slot of a sequence whose seq_len differs from its ``seq_pos`` reset to zeros (the
    padding sequence reads zeros and names no slot)."""
    arrays = {n: np.array(to_numpy(a), dtype=np.float64, copy=True) for n, a in impl.state_arrays(pool).items()}
    seq_len = arrays["seq_len"].astype(np.int64)
    for slot, pos in zip(step["slots"], step["seq_pos"]):  # a slot outside the pool: the call's own check refuses it
        if 0 <= int(slot) < len(seq_len) and seq_len[int(slot)] != int(pos):
            for name in STATE_NAMES:
                arrays[name][int(slot)] = 0.0
    for name in STATE_NAMES:
        res.state_in[call_key(k, f"{name}_in")] = arrays[name]


def golden_inputs(gold: Mapping[str, np.ndarray], call: int, stage: str,
                  mlp_kind: str = "dense") -> dict[str, np.ndarray] | None:
    """A stage's golden inputs for call ``call`` (FORMAT.md §8): the stage tensors it reads from the
    same call, and the call's entering state ``*_in``; None when the fixture does not keep them all.
    ``mlp_kind``: the layer's (``gdncheck.experts.mlp_kind_of``); stage ``mlp`` of a sparse layer reads
    ``experts_out`` and ``shared_out``."""
    out = {}
    for name in stage_inputs(stage, mlp_kind):
        key = call_key(call, f"{name}_in" if name in STATE_NAMES else name)
        if key not in gold:
            return None
        out[name] = np.asarray(gold[key])
    return out
