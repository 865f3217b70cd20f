"""vLLM's own Triton GDN kernels (its GPU path), judged stage by stage under Triton's interpreter
(``conformance/engines/vllm_triton/adapter.py``).

Run in vLLM's environment
(``/work/main/.venv-vllm/bin/python -m pytest tests/engines/vllm_triton/test_vllm_triton.py``);
where vLLM is not importable (the CI's ``.venv``) the module skips.

On a small case of three rows carrying their states between calls, every call driven through vLLM's serving
convention (packed rows, a padding sequence at the null block, pool slots, one slot per token and
``num_accepted_tokens`` for the recurrent kernel), vLLM's packed-decode kernel and its recurrent kernel conform
against the golden fixture (``run`` then ``verify``) but for vLLM's softplus in f32 (g); and each piece of glue the
adapter does, done wrong, fails verify: the state not transposed to vLLM's [V, K], the state indices one slot
off, a and b swapped, the conv state's oldest columns kept, ``num_accepted_tokens`` miscounted.

Every run happens in one child process (the kernels need the interpreter chosen, and vLLM's triton_utils
patched, before triton and the kernel modules are imported)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not importable here (its own environment: scripts/engine-env vllm, then "
                ".venv-vllm/bin/python -m pytest tests/engines/vllm_triton/test_vllm_triton.py)",
                allow_module_level=True)

from gdncheck.conformance.engines.vllm_triton import adapter as vt  # noqa: E402
from gdncheck.conformance.judge.verify import verify  # noqa: E402
from gdncheck.conformance.ports.plugin import check_options  # noqa: E402
from gdncheck.errors import GDNError  # noqa: E402
from gdncheck.harness import NotApplicable  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
VT = "gdncheck.conformance.engines.vllm_triton.adapter:vllm_triton"
#: 3 rows at different positions, three forward calls carrying their states then a decode step
#: (2 key heads, 4 value heads, dk = dv = 16)
CASE = "batch-positions_T20"


# --- the glue, each piece broken alone --------------------------------------------------------------------
class StateNotTransposed(vt.VllmTritonStages):
    """Hands vLLM's [slots, Hv, dv, dk] pool gdncheck's [Hv, dk, dv] rows as they are."""

    def recurrent_in(self, s):
        return s

    def recurrent_out(self, s):
        return s


class WrongSlot(vt.VllmTritonStages):
    """Gives the kernels each sequence's state index one slot off from where its state was put."""

    def indices(self, B):
        idx = super().indices(B)
        return idx.where(idx <= 0, idx - 1)


class GatesSwapped(vt.VllmTritonStages):
    """Hands vLLM's gating a and b the other way round."""

    def gate_inputs(self, a, b):
        return b, a


class ConvOldest(vt.VllmTritonStages):
    """Keeps the oldest K-1 columns of gdncheck's conv_state for vLLM's pool, where it needs the newest."""

    def conv_in(self, c):
        return np.swapaxes(c[..., :-1], -1, -2)


class AcceptedMiscounted(vt.VllmTritonStages):
    """Tells the recurrent kernel every row accepted one token, where the odd rows' state sits in column 1."""

    def accepted(self, B, T):
        return [1] * (B + 1)


def _with(impl_class):
    def factory(cfg, weights, *, profile, strict=False, kernel="packed_decode"):
        return vt.vllm_triton(cfg, weights, profile=profile, strict=strict, kernel=kernel, impl_class=impl_class)

    return factory


state_not_transposed, wrong_slot, gates_swapped, conv_oldest, accepted_miscounted = (
    _with(c) for c in (StateNotTransposed, WrongSlot, GatesSwapped, ConvOldest, AcceptedMiscounted))
HERE = "tests.engines.vllm_triton.test_vllm_triton"

#: (label, factory, kernel, profile, cases)
JOBS = [
    ("packed_decode-f32", VT, "packed_decode", "f32", [CASE]),
    ("packed_decode-bf16", VT, "packed_decode", "bf16", [CASE]),
    ("recurrent-f32", VT, "recurrent", "f32", [CASE]),
    ("state-not-transposed", f"{HERE}:state_not_transposed", "packed_decode", "f32", [CASE]),
    ("wrong-slot", f"{HERE}:wrong_slot", "packed_decode", "f32", [CASE]),
    ("gates-swapped", f"{HERE}:gates_swapped", "packed_decode", "f32", [CASE]),
    ("conv-oldest", f"{HERE}:conv_oldest", "packed_decode", "f32", [CASE]),
    ("accepted-miscounted", f"{HERE}:accepted_miscounted", "recurrent", "f32", [CASE]),
]
CONFORMING = ["packed_decode-f32", "packed_decode-bf16", "recurrent-f32"]
CHILD = """
import json, sys
from gdncheck.conformance.ports.run import run_impl
fixtures, root, jobs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for label, spec, kernel, profile, cases in jobs:
    rep = run_impl(spec, fixtures, f"{root}/{label}", profile, cases=cases, options={"kernel": kernel},
                   stage_isolated=True)
    print(json.dumps([label, [[c.id, c.status, c.detail] for c in rep.cases]]))
"""


@pytest.fixture(scope="module")
def runs(fixtures_dir, tmp_path_factory):
    """Outputs of every JOBS run, by label, from one child process with TRITON_INTERPRET=1."""
    root = tmp_path_factory.mktemp("vllm_triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(fixtures_dir), str(root),
                           json.dumps(JOBS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = {}
    for line in proc.stdout.splitlines():
        label, cases = json.loads(line)
        statuses[label] = [status for _, status, _ in cases]
        # a glue mutant may also be refused mid-case (a kernel wrote a slot no row owns): verify fails it
        assert all(status == "ran" or (label not in CONFORMING and status == "raised")
                   for status in statuses[label]), (label, cases)
    assert set(statuses) == {j[0] for j in JOBS}
    return root


def _summary(fixtures_dir, runs, label):
    _, _, kernel, profile, cases = next(j for j in JOBS if j[0] == label)
    return verify(fixtures_dir, runs / label, profile, cases=cases, stage_isolated=True, fused=kernel in vt.FUSED)


JUDGED = {("conv1d", "qkv_conv"), ("conv1d", "conv_state"), ("qk_norm", "q"), ("qk_norm", "k"), ("qk_norm", "v"),
          ("gates", "g"), ("gates", "beta"), ("delta_rule", "core"), ("delta_rule", "recurrent_state")}
#: what vLLM's own kernels get wrong on this case in f32: g, whose softplus is log(1 + exp(x)) in float32 for
#: x <= 0 (within the bf16 bounds); every other tensor conforms
KNOWN = {("gates", "g")}


def _failing(case) -> set[tuple[str, str]]:
    return {(r.stage, r.tensor) for r in case.records if r.verdict == "fail"}


@pytest.mark.parametrize("label", CONFORMING)
def test_each_kernel_of_vllm_conforms_but_its_softplus(fixtures_dir, runs, label):
    (case,) = _summary(fixtures_dir, runs, label).cases
    assert {(r.stage, r.tensor) for r in case.records if r.verdict != "missing"} == JUDGED
    assert _failing(case) <= (KNOWN if label.endswith("f32") else set()), case.message


@pytest.mark.parametrize("label,failing", [
    ("state-not-transposed", {"core", "recurrent_state"}),
    ("wrong-slot", {"qkv_conv", "conv_state", "core", "recurrent_state"}),
    ("gates-swapped", {"beta", "core", "recurrent_state"}),
    ("conv-oldest", {"qkv_conv", "conv_state"}),
    ("accepted-miscounted", {"core", "recurrent_state"}),
])
def test_each_glue_mistake_fails_verify(fixtures_dir, runs, label, failing):
    """Beyond vLLM's own softplus deviation, the broken piece of glue fails its stage's tensors (or the call is
    refused: a kernel wrote a slot no row owns)."""
    (case,) = _summary(fixtures_dir, runs, label).cases
    assert case.status == "fail", case.message
    if "raised" not in (case.message or ""):
        assert {t for _, t in _failing(case) - KNOWN} >= failing, case.message


# --- the contract around the stages -------------------------------------------------------------------------
# --- a serving program: the real-size speculative case's packed calls (FORMAT.md §8, packed calls) ----------
SPEC_CASE = "d128-spec-decode"
SERVING_JOBS = [("serving-packed_decode-f32", VT, "packed_decode", "f32", [SPEC_CASE]),
                ("serving-recurrent-f32", VT, "recurrent", "f32", [SPEC_CASE])]


@pytest.fixture(scope="module")
def serving_runs(tmp_path_factory):
    """d128-spec-decode built from its recipe (it keeps its packed calls' stage inputs), and SERVING_JOBS' outputs
    on it, from one child process with TRITON_INTERPRET=1 (about 30 s)."""
    from gdncheck.cli import main

    root = tmp_path_factory.mktemp("vllm_triton-serving")
    assert main(["fixtures", "build", "--out", str(root / "suite"), "--case", SPEC_CASE, "-q"]) == 0
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(root / "suite"), str(root),
                           json.dumps(SERVING_JOBS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, {label: cases for label, cases in map(json.loads, proc.stdout.splitlines())}


def test_vllm_s_decode_kernels_conform_on_a_speculative_serving_program(serving_runs):
    """vLLM's causal_conv1d_update and packed-decode rule, one token of every running sequence a launch, on the
    program's pool (program slot s at vLLM's s + 1, the null block at 0), the q/k norm and gates of
    fused_post_conv_prep: every call's tensors and the pool after the last within the end-to-end bounds."""
    root, statuses = serving_runs
    (case,) = verify(root / "suite", root / "serving-packed_decode-f32", "f32", cases=[SPEC_CASE],
                     stage_isolated=True, fused=True).cases
    judged = {(r.op, r.tensor) for r in case.records if r.verdict != "missing"}
    assert {("verify_spec", "core"), ("verify_spec", "q"), ("forward_packed", "recurrent_state"),
            ("forward_packed", "conv_state")} <= judged
    assert case.status == "pass", case.message
    [[_, status, detail]] = statuses["serving-recurrent-f32"]  # packed calls run with packed_decode only
    assert status == "not_applicable" and "kernel=packed_decode" in detail


def test_what_vllm_triton_does_not_run_here_says_so():
    cfg = tiny_config()
    w = {"linear_attn.norm.weight": np.ones(cfg.num_v_heads * cfg.head_v_dim)}
    with pytest.raises(NotApplicable, match="shared by every head"):
        vt.vllm_triton(cfg, w, profile="f32")
    with pytest.raises(NotApplicable, match="bf16"):
        vt.vllm_triton(cfg, w, profile="f16")
    with pytest.raises(GDNError, match="kernel=recurrent"):
        vt.vllm_triton(cfg, w, profile="f32", kernel="chunk")
    with pytest.raises(NotApplicable, match="stage-isolated"):
        vt.vllm_triton.check_case({}, [])
    check_options(vt.vllm_triton, {"kernel": "recurrent"})
