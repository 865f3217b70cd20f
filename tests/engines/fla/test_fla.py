"""flash-linear-attention's gated delta rule, judged stage-isolated (``conformance/engines/fla/adapter.py``).

Each of fla's forms (its two torch references, its two Triton kernels, in the interpreter on a CPU)
conforms on small cases, and each piece of glue the adapter does, done wrong, is caught by verify in
the delta_rule stage: a state read as fla's value-first layout, the key heads tiled instead of
interleaved, g passed as the decay exp(g) instead of its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fla", reason="the fla extra (fla-core, einops) is not installed")
pytest.importorskip("einops")

from gdncheck.cli import main  # noqa: E402
from gdncheck.conformance.engines.fla import adapter as fla_port  # noqa: E402
from gdncheck.conformance.judge.verify import verify  # noqa: E402
from gdncheck.conformance.ports.plugin import check_options  # noqa: E402
from gdncheck.conformance.ports.run import run_impl  # noqa: E402
from gdncheck.errors import GDNError  # noqa: E402
from gdncheck.harness import NotApplicable  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FLA = "gdncheck.conformance.engines.fla.adapter:fla"
#: prefill of 100 (one chunk and a tail) then 37 continuing from a kept state; 2 key heads, 4 value heads
CHUNKED = "chunked_T137"
#: 12 one-token decode steps from a kept state
DECODE = "decode_T12"
#: one key head read by 4 value heads, a 66-token prefill then two decode steps
ONE_KEY_HEAD = "one-key-head"


def _judge(factory, fixtures_dir, out, profile, cases, **options):
    rep = run_impl(factory, fixtures_dir, out, profile, cases=cases, options=options, stage_isolated=True)
    assert all(c.status == "ran" for c in rep.cases), [(c.id, c.status, c.detail) for c in rep.cases]
    return verify(fixtures_dir, out, profile, cases=cases, stage_isolated=True)


# --- the glue, each piece broken alone --------------------------------------------------------------------
class StateValueFirst(fla_port.FlaDeltaRule):
    """Reads and writes the state as [Hv, dv, dk] (what docs/math.md says fla's layer keeps): untransposed
    where fla-core's [N, HV, K, V] needs no transpose at all."""

    def state_in(self, s):
        return s.transpose(-1, -2).contiguous()

    def state_out(self, s):
        return s.transpose(-1, -2).contiguous()


class TiledHeads(fla_port.FlaDeltaRule):
    """Value head j reads key head j % Hk (``repeat``, ggml's broadcast) instead of j // (Hv/Hk)."""

    def key_heads(self, x, native_gva):
        ratio = self.cfg.num_v_heads // self.cfg.num_k_heads
        return x.repeat(1, 1, ratio, 1)


class DecayNotLog(fla_port.FlaDeltaRule):
    """Hands fla the decay exp(g) where it takes the log decay g."""

    def log_decay(self, g):
        return g.exp()


def _with(impl_class):
    def factory(cfg, weights, *, profile, strict=False, kernel="naive"):
        return fla_port.fla(cfg, weights, profile=profile, strict=strict, kernel=kernel, impl_class=impl_class)

    return factory


tiled_heads = _with(TiledHeads)  # by name, for the child process below


# --- the Triton forms: one run of every case they are judged on ---------------------------------------------
#: (label, factory, kernel, profile, cases)
TRITON_JOBS = [
    ("fused_recurrent-bf16", FLA, "fused_recurrent", "bf16", [DECODE]),
    ("fused_recurrent-f32", FLA, "fused_recurrent", "f32", [ONE_KEY_HEAD]),
    ("chunk-f32", FLA, "chunk", "f32", [CHUNKED]),
    ("chunk-bf16", FLA, "chunk", "bf16", [ONE_KEY_HEAD]),
    ("tiled-fused_recurrent", "tests.engines.fla.test_fla:tiled_heads", "fused_recurrent", "f32", [DECODE]),
]
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
def triton_runs(fixtures_dir, tmp_path_factory):
    """Outputs of every TRITON_JOBS run, by label. fla's Triton kernels need a GPU or Triton's interpreter,
    chosen before triton is imported (fla.py); where this process imported triton without it (other test
    modules did, and CI does not set TRITON_INTERPRET), they run in one child process that sets it."""
    root = tmp_path_factory.mktemp("fla_triton")
    try:
        fla_port._import_fla(True)
        in_process = True
    except GDNError:
        in_process = False
    if in_process:
        for label, spec, kernel, profile, cases in TRITON_JOBS:
            rep = run_impl(spec, fixtures_dir, root / label, profile, cases=cases, options={"kernel": kernel},
                           stage_isolated=True)
            assert all(c.status == "ran" for c in rep.cases), [(c.id, c.status, c.detail) for c in rep.cases]
        return root
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, str(fixtures_dir), str(root),
                           json.dumps(TRITON_JOBS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in proc.stdout.splitlines():
        label, cases = json.loads(line)
        assert all(status == "ran" for _, status, _ in cases), (label, cases)
    return root


def _conforms(s, kernel: str, profile: str) -> None:
    assert s.exit_code == 0, [c.message for c in s.cases if c.status != "pass"]
    judged = {(r.stage, r.tensor) for c in s.cases for r in c.records if r.verdict != "missing"}
    assert judged == {("delta_rule", "core"), ("delta_rule", "recurrent_state")}
    assert all(r.verdict == "pass" for c in s.cases for r in c.records if r.verdict != "missing")
    assert s.implementation["name"].startswith(f"fla {kernel} ({profile}")


@pytest.mark.parametrize("kernel,profile,cases", [
    ("naive", "f32", [CHUNKED, DECODE, ONE_KEY_HEAD]),
    ("naive", "bf16", [CHUNKED]),
    ("naive_chunk", "f32", [CHUNKED]),
    ("naive_chunk", "bf16", [CHUNKED, ONE_KEY_HEAD]),
])
def test_the_torch_references_of_fla_conform_stage_isolated(fixtures_dir, tmp_path, kernel, profile, cases):
    _conforms(_judge(fla_port.fla, fixtures_dir, tmp_path, profile, cases, kernel=kernel), kernel, profile)


@pytest.mark.parametrize("label", [j[0] for j in TRITON_JOBS if j[1] == FLA])
def test_the_triton_kernels_of_fla_conform_stage_isolated(fixtures_dir, triton_runs, label):
    _, _, kernel, profile, cases = next(j for j in TRITON_JOBS if j[0] == label)
    _conforms(verify(fixtures_dir, triton_runs / label, profile, cases=cases, stage_isolated=True), kernel, profile)


def _caught(s, failing) -> None:
    (case,) = s.cases
    assert s.exit_code == 1 and case.status == "fail"
    assert case.first_divergence.stage == "delta_rule"
    assert {r.tensor for r in case.records if r.verdict == "fail"} == failing


@pytest.mark.parametrize("impl_class", [StateValueFirst, TiledHeads, DecayNotLog])
def test_each_glue_mistake_fails_verify_in_the_delta_rule(fixtures_dir, tmp_path, impl_class):
    _caught(_judge(_with(impl_class), fixtures_dir, tmp_path, "f32", [CHUNKED]), {"core", "recurrent_state"})


def test_tiled_heads_fail_on_fla_s_own_grouped_heads_too(fixtures_dir, triton_runs):
    """fused_recurrent groups value heads itself (j // (Hv/Hk)); handed tiled key heads, it is caught."""
    _caught(verify(fixtures_dir, triton_runs / "tiled-fused_recurrent", "f32", cases=[DECODE], stage_isolated=True),
            {"core", "recurrent_state"})


def test_the_state_mistake_shows_once_a_state_is_carried(fixtures_dir, tmp_path):
    """From zeros (call 0) a transposed state is still zeros; the continuation (call 1) reads the kept one."""
    s = _judge(_with(StateValueFirst), fixtures_dir, tmp_path, "f32", [CHUNKED])
    failed = {(r.call, r.tensor) for c in s.cases for r in c.records if r.verdict == "fail"}
    assert (0, "core") not in failed and (1, "core") in failed


# --- the contract around the one stage ----------------------------------------------------------------------
def test_everything_but_the_delta_rule_is_not_fla():
    cfg = tiny_config()
    impl = fla_port.fla(cfg, {}, profile="f32")
    assert impl.run_stage("gated_norm", {}) == {} and impl.run_stage("conv1d", {}) == {}
    for call in (lambda: impl.forward(None, None, None), lambda: impl.new_state(1)):
        with pytest.raises(NotApplicable, match="not the Qwen3.5 layer"):
            call()
    with pytest.raises(NotApplicable, match="float32"):
        fla_port.fla(cfg, {}, profile="f64")
    with pytest.raises(GDNError, match="kernel=naive"):
        fla_port.fla(cfg, {}, profile="f32", kernel="flash")
    with pytest.raises(GDNError, match="chunk_size"):
        fla_port.fla(cfg, {}, profile="f32", kernel="chunk", chunk_size=128)
    check_options(fla_port.fla, {"kernel": "chunk", "chunk_size": 32})
    with pytest.raises(GDNError, match="takes no option 'impl_class'"):
        check_options(fla_port.fla, {"impl_class": "x"})
    with pytest.raises(NotApplicable):
        fla_port.fla.check_case({}, [])


def test_the_interpreter_workarounds_are_undone():
    fla_port._import_fla(False)
    import fla.ops.common.chunk_delta_h as chunk_delta_h
    from triton.runtime.autotuner import Autotuner

    before = Autotuner.prune_configs
    with fla_port._interpreter_workarounds():
        assert Autotuner.prune_configs is not before and chunk_delta_h.range is fla_port._counting_range
        assert [i.to("int64") for i in chunk_delta_h.range(3)] == [0, 1, 2]
    assert Autotuner.prune_configs is before and "range" not in vars(chunk_delta_h)


def test_from_the_command_line(fixtures_dir, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["run", FLA, "--out", out, "--profile", "bf16", "--case", DECODE, "--stage-isolated",
                 "--option", "kernel=naive_chunk", "--option", "chunk_size=16", "-q"]) == 0
    assert main(["verify", "--outputs", out, "--profile", "bf16", "--case", DECODE, "--stage-isolated"]) == 0
    assert "fla naive_chunk (bf16" in capsys.readouterr().out
