"""State promises (docs/spec.md §4): snapshots restore bit-identically and survive a file, a call at
another position resets the state (the reference's answer from a zero state), strict mode raises
and changes nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from gdncheck.harness import error_code, to_numpy
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import STATE_NAMES

from .check import assert_close, assert_identical
from .differential import consecutive_calls
from .metamorphic import _setup
from .registry import Subject, prop, run_calls
from .strategies import build_inputs


def _state(impl, state) -> dict:
    return {k: np.array(to_numpy(v), dtype=np.float64) for k, v in impl.state_arrays(state).items()}


@prop("state")
def snapshot_round_trip(subject: Subject, data) -> None:
    """Restoring a snapshot and replaying the same tokens is bit-identical, twice (the snapshot is
    an independent copy: the calls after it do not change it)."""
    cfg, wd, weights, xd = _setup(data)
    B = data.draw(st.integers(1, 2), label="batch")
    lengths = [data.draw(st.integers(1, 20), label="tokens before the snapshot"),
               data.draw(st.integers(1, 20), label="tokens replayed")]
    (a, pa), (b, pb) = consecutive_calls(build_inputs(cfg, B, sum(lengths), xd), lengths)
    impl = subject.make(cfg, weights)
    state, _ = run_calls(impl, [(a, pa)])
    snap = impl.snapshot(state)
    _, first = run_calls(impl, [(b, pb)], state)
    what = f"snapshot after {lengths[0]} tokens, replay of {lengths[1]}, {cfg.summary()}, {wd!r}, {xd!r}"
    for attempt in ("first", "second"):
        impl.restore(state, snap)
        _, again = run_calls(impl, [(b, pb)], state)
        assert_identical(again[0], first[0], f"{attempt} replay after restore: {what}")


@prop("state")
def snapshot_file_round_trip(subject: Subject, data) -> None:
    """A snapshot saved to safetensors holds the state's exact values (tensors conv_state,
    recurrent_state, seq_len) and, loaded and restored, replays bit-identically."""
    cfg, wd, weights, xd = _setup(data)
    lengths = [data.draw(st.integers(1, 20), label="tokens before the snapshot"),
               data.draw(st.integers(1, 20), label="tokens replayed")]
    (a, pa), (b, pb) = consecutive_calls(build_inputs(cfg, 1, sum(lengths), xd), lengths)
    impl = subject.make(cfg, weights)
    state, _ = run_calls(impl, [(a, pa)])
    before = _state(impl, state)
    snap = impl.snapshot(state)
    _, first = run_calls(impl, [(b, pb)], state)
    what = f"snapshot file after {lengths[0]} tokens, {cfg.summary()}"
    with tempfile.TemporaryDirectory(prefix="gdncheck-prop-") as tmp:
        path = str(Path(tmp) / "snap.safetensors")
        impl.save_snapshot(snap, path)
        f = SafetensorsFile(path)
        stored = {k: np.asarray(f.read(k), dtype=np.float64) for k in STATE_NAMES if k in f}
        if set(stored) != {"conv_state", "recurrent_state"}:
            raise AssertionError(f"snapshot file holds {sorted(f)}, but should hold conv_state and recurrent_state "
                                 f"(fixtures/FORMAT.md §7) [{what}]")
        assert_identical(stored, {k: before[k] for k in stored}, f"{what}: saved values")
        loaded = impl.load_snapshot(path)
    impl.restore(state, loaded)
    _, again = run_calls(impl, [(b, pb)], state)
    assert_identical(again[0], first[0], f"{what}: replay after load + restore")


@prop("state")
def seq_pos_mismatch_resets(subject: Subject, data) -> None:
    """A call at a position other than the state's seq_len starts from a zero state: it gives the
    reference's answer for that call alone."""
    cfg, wd, weights, xd = _setup(data)
    T1, T2 = data.draw(st.integers(1, 16), label="first call tokens"), data.draw(st.integers(1, 16),
                                                                                  label="second call tokens")
    pos = data.draw(st.integers(0, T1 + 8).filter(lambda p: p != T1), label="second call position")
    x = build_inputs(cfg, 1, T1 + T2, xd)
    impl = subject.make(cfg, weights)
    _, got = run_calls(impl, [(x[:, :T1], 0), (x[:, T1:], pos)])
    _, want = run_calls(Subject.reference(cfg, weights), [(x[:, T1:], pos)])
    if "seq_len" in got[1] and int(got[1]["seq_len"][0]) != pos + T2:
        raise AssertionError(f"seq_len {int(got[1]['seq_len'][0])} after the call, but should be seq_pos + T = "
                             f"{pos + T2} [seq-len reset at position {pos}]")
    assert_close(got[1:], want, subject.profile, f"call at position {pos} after {T1} tokens (a reset), "
                                                 f"{cfg.summary()}, {wd!r}, {xd!r}")


@prop("state", once=True)
def strict_mode_raises(subject: Subject, data) -> None:
    """In strict mode a call at a mismatched position raises seq_pos_mismatch and changes nothing;
    the call at the right position then runs."""
    cfg, wd, weights, xd = _setup(data)
    T1 = data.draw(st.integers(1, 12), label="first call tokens")
    pos = data.draw(st.integers(0, T1 + 8).filter(lambda p: p != T1), label="mismatched position")
    x = build_inputs(cfg, 1, T1 + 2, xd)
    impl = subject.make(cfg, weights, strict=True)
    state, _ = run_calls(impl, [(x[:, :T1], 0)])
    before = _state(impl, state)
    try:
        impl.forward(x[:, T1:], state, np.array([pos], dtype=np.int64))
    except Exception as exc:  # noqa: BLE001 - the code decides
        if error_code(exc) != "seq_pos_mismatch":
            raise AssertionError(f"raised {error_code(exc)}: {exc}, but should raise seq_pos_mismatch "
                                 f"[strict mode, state at {T1}, call at {pos}]") from None
    else:
        raise AssertionError(f"the call ran, but should raise seq_pos_mismatch [strict mode, state at {T1}, call at "
                             f"{pos}]")
    assert_identical(_state(impl, state), before, f"state after the refused call at {pos} (strict mode)")
    run_calls(impl, [(x[:, T1:], T1)], state)
