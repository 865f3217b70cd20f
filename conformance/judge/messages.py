"""Failure messages in one grammar: *what was observed, but what should be expected [where]*,
each standing alone, then a one-line repro command.

    core (delta_rule) of call 1: max scaled error 3.1e-01 at [0, 17, 3, 5]: 0.412345, but should be
    0.399812 ± 0.00621 (elem bound 0.23, case prefill-decode_T65_Hk2_Hv6_dk16_dv8, bf16); 14 / 4096
    elements (0.34%) over the bound, first at token 3 (position 64, row 0); NMSE 2.1e-05 (46.8 dB),
    bound 1.0e-05 [case prefill-decode_T65_Hk2_Hv6_dk16_dv8_s0, step 2: forward seq_pos [61, 61]]

Every builder takes keyword arguments only: a message has many parts of the same type (numbers,
strings), and a swapped pair would read as a plausible, wrong message.
"""

from __future__ import annotations

import shlex


def fmt(x: float) -> str:
    return f"{x:.6g}"


def where(case: str, step: int, op: str, seq_pos=None) -> str:
    pos = f" seq_pos {list(seq_pos)}" if seq_pos is not None else ""
    return f"[case {case}, step {step}: {op}{pos}]"


def subject(tensor: str, stage: str, call: int | None, snapshot: str | None = None) -> str:
    if snapshot:
        return f"{tensor} of the saved snapshot {snapshot}"
    return f"{tensor} ({stage}) of call {call}"


def bound_failure(*, subject: str, metrics: dict, bound: dict, actual: float, expected: float, allowed: float,
                  over: int, first: tuple[int, int, int] | None, elem_failed: bool, loc: str) -> str:
    """A tensor over its bound: the worst element (``actual`` where ``expected`` ± ``allowed``), how many
    elements are ``over``, the ``first`` (token, position, row) over it, and the NMSE."""
    m = metrics
    numel = m["numel"]
    pct = 100.0 * over / numel if numel else 0.0
    src = f"{bound['source']}, {bound['profile']}"
    parts = []
    if elem_failed:
        at = f", first at token {first[0]} (position {first[1]}, row {first[2]})" if first else ""
        parts.append(f"{subject}: max scaled error {m['max_err']:.2e} at {m['max_err_index']}: {fmt(actual)}, "
                     f"but should be {fmt(expected)} ± {allowed:.3g} (elem bound {bound['elem']:.3g}, {src}); {over} / "
                     f"{numel} elements ({pct:.3g}%) over the bound{at}")
        parts.append(f"NMSE {m['nmse']:.2e} ({m['sqnr_db']:.1f} dB), bound {bound['nmse']:.2e}")
    else:
        parts.append(f"{subject}: NMSE {m['nmse']:.2e} ({m['sqnr_db']:.1f} dB), but should be at most "
                     f"{bound['nmse']:.2e} (nmse bound, {src}); max scaled error {m['max_err']:.2e} at "
                     f"{m['max_err_index']} (elem bound {bound['elem']:.3g})")
    return "; ".join(parts) + " " + loc


def with_regime(message: str | None, regime: str | None) -> str | None:
    """A failure message of a case that probes an edge names the edge, so that a port sees whether it
    differs in the realistic regime or only there: ``...; [case ..., step ...] (edge: q/k squared
    norm ≈ eps)``."""
    if message is None or not regime or regime == "realistic":
        return message
    return f"{message} ({regime})"


def shape_failure(*, subject: str, shape, expected, loc: str) -> str:
    return f"{subject}: shape {list(shape)}, but should be {list(expected)} {loc}"


def dtype_failure(*, subject: str, dtype: str, allowed: tuple[str, ...], why: str, loc: str) -> str:
    return f"{subject}: dtype {dtype}, but should be {' or '.join(allowed)} ({why}) {loc}"


def nan_failure(*, subject: str, count: int, index, loc: str) -> str:
    return f"{subject}: {count} NaN value(s), first at {index}, but should be finite (NaN fails everywhere) {loc}"


def inf_failure(*, subject: str, count: int, index, actual: float, expected: float, loc: str) -> str:
    return (f"{subject}: {count} unmatched infinity(ies), first at {index}: {actual}, but should be {fmt(expected)} "
            f"(an infinity passes only where the expected value is the same infinity) {loc}")


def missing_required(*, subject: str, key: str, loc: str) -> str:
    return (f"{subject}: no tensor {key} in the outputs, but should be there (every call writes out, conv_state and "
            f"recurrent_state) {loc}")


def snapshot_missing(*, subject: str, problem: str, loc: str) -> str:
    return f"{subject}: {problem}, but should be there (the program saves it) {loc}"


def seq_len_failure(*, subject: str, actual, expected, loc: str) -> str:
    """``actual``: the counts found, or (a tensor of the wrong dtype or shape) a description of it."""
    found = actual if isinstance(actual, str) else list(actual)
    return (f"{subject}: seq_len {found}, but should be {list(expected)} (integers, seq_pos + T; docs/spec.md §4) "
            f"{loc}")


def raised(*, case: str, err: dict, op: str) -> str:
    return (f"the implementation raised {err.get('code')} at step {err.get('step')} ({op}): {err.get('message')}, "
            f"but should have run the whole program [case {case}]")


def error_expected(*, case: str, expected: dict, op: str) -> str:
    alts = [c for c in expected["accept"] if c != expected["code"]]
    alt = f" (or the more general {', '.join(alts)})" if alts else ""
    return (f"the implementation raised nothing, but should raise {expected['code']}{alt} at step {expected['step']} "
            f"({op}) [case {case}]")


def wrong_error(*, case: str, err: dict, expected: dict, op: str) -> str:
    return (f"the implementation raised {err.get('code')} at step {err.get('step')}: {err.get('message')}, but should "
            f"raise {expected['code']} at step {expected['step']} ({op}) [case {case}]")


def not_applicable_required(*, case: str, na: dict) -> str:
    """A port declared not applicable a case that needs no optional feature (the coverage rule)."""
    return (f"the implementation declared the case not applicable from step {na['step']} ({na['op']}): {na['reason']}, "
            f"but should run it: it needs no optional feature, and every conforming port is judged on it "
            f"(FORMAT.md §2, coverage) [case {case}]")


def nothing_judged(*, case: str, missing: int, mode: str) -> str:
    """A case in which no tensor was judged: nothing it wrote is a tensor the goldens expect."""
    return (f"no tensor of the case was judged ({missing} expected tensor(s) not provided, in mode {mode}), but "
            f"should be: a case that judged nothing is no pass (write the expected tensors under their names, or "
            f"verify with --names TABLE) [case {case}]")


def not_applicable(*, na: dict, passed: int) -> str:
    """A case the implementation cannot express from step ``na['step']``; ``passed`` records before it pass."""
    return (f"not applicable from step {na['step']} ({na['op']}): {na['reason']}"
            + (f"; the {passed} tensor(s) of the steps before it pass" if passed else ""))


def repro(fixtures: str, outputs: str, profile: str, case: str, *, stage_isolated: bool = False,
          run_command: str | None = None) -> str:
    """One line that reruns the check of one case (and the run that made its outputs, if known)."""
    iso = " --stage-isolated" if stage_isolated else ""
    verify = (f"gdncheck verify --fixtures {shlex.quote(fixtures)} --outputs {shlex.quote(outputs)} "
              f"--profile {profile}{iso} --case {case}")
    return f"{run_command} --case {case} && {verify}" if run_command else verify
