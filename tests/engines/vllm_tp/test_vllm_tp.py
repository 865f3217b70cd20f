"""vLLM's whole engine at tensor parallel, judged rank by rank (``conformance/engines/vllm_tp/``).

Without vLLM (CI's gate job): the judge and its glue on captures made here in vLLM's rank-local layouts by the
float64 layer itself, one rank at a time (what a correct engine would write): they conform to ~1e-16; the glue
mutants fail at their rank and stage: the ranks swapped (vLLM's rank 1 read as the plan's rank 0: "equals rank
1's share"), the plan's q/k/v split read as one block (the packed projection split evenly as one block, Megatron
PR 1989's class), ``b`` and ``a`` read in the other order; a rank whose slot another request wrote between two
forwards fails its slot history; a missing or unusable capture is a case in error, never a pass. The row is in
the registry and, where ``.venv-vllm`` is missing, a row saying so.

With ``.venv-vllm`` (``scripts/engine-env vllm``): one engine start at TP 2 (~1.5 min here): every request
conforms, the glue mutants fail on the engine's own captures, and the run left no ``/dev/shm/vllm_dist_*``
segment behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gdncheck.conformance.engines import registry
from gdncheck.conformance.engines.vllm_tp import capture, judge
from gdncheck.conformance.judge.records import validate_summary
from gdncheck.safetensors_io import write_safetensors
from gdncheck.sharding import RankShare, TPPlan, rank_weights, tp_plan

ROOT = Path(__file__).resolve().parents[3]
VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
needs_venv = pytest.mark.skipif(not VENV_PYTHON.exists(),
                                reason="vLLM's environment .venv-vllm is not here (scripts/engine-env vllm)")


# --- glue mutants -----------------------------------------------------------------------------------------


class Swapped(judge.Glue):
    """vLLM's ranks read in the other order."""

    def rank_order(self, world):
        return list(reversed(range(world)))


class BlockShare(RankShare):
    """A share whose conv channels are the packed ``[Q|K|V]`` split evenly as one block."""

    world: int = 1

    def conv_channels(self, cfg):
        c = cfg.conv_dim // self.world
        return np.arange(self.rank * c, (self.rank + 1) * c)


class OneBlock(judge.Glue):
    """The plan's q/k/v split read as one block."""

    def plan(self, cfg, world):
        good = tp_plan(cfg, world)
        shares = []
        for s in good.shares:
            b = BlockShare(s.rank, s.v_start, s.v_stop, s.k_start, s.k_stop)
            object.__setattr__(b, "world", world)
            shares.append(b)
        return TPPlan(world, tuple(shares))


class BaSwapped(judge.Glue):
    """``in_proj_ba`` read as ``[a | b]``."""

    def split_ba(self, ba):
        a, b = np.split(ba, 2, axis=-1)
        return a, b


# --- captures made by the float64 layer, in vLLM's layouts ------------------------------------------------


RUN = ("real-heads", capture.CASE, (2,))  # the run the tests judge: real-heads' weights at TP 2


def _fake_run(folder: Path, tp: int, *, scribble: bool = False, name: str = "real-heads",
              case: str = capture.CASE) -> None:
    """What vLLM's hooks write for two requests, computed per rank by the float64 layer on the rank's weights:
    request A prefills 5 tokens alone, then decodes beside request B's 3-token prefill (decode row first);
    slots 1 and 3 (``scribble``: rank 0's slot 1 changed between the two forwards)."""
    cfg, w = capture.case_weights(ROOT / "fixtures" / "default", case)
    plan = tp_plan(cfg, tp)
    rng = np.random.default_rng(5)
    D, K = cfg.hidden_size, cfg.conv_kernel
    xs = [rng.standard_normal((5, D)), rng.standard_normal((4, D))]  # forward 0: A's 5; forward 1: A's 1, B's 3
    batches = [{"req_ids": ["0-a"], "num_tokens": 5, "num_decodes": 0, "query_start_loc": [0, 5], "slots": [1],
                "has_initial_state": [False]},
               {"req_ids": ["0-a", "1-b"], "num_tokens": 4, "num_decodes": 1, "query_start_loc": [0, 1, 4],
                "slots": [1, 3], "has_initial_state": [True, False]}]
    files = []
    for share in plan.shares:
        cfg_r = cfg.replace(num_k_heads=share.k_stop - share.k_start, num_v_heads=share.v_stop - share.v_start)
        w_r = rank_weights(cfg, w, share)
        C_r = 2 * cfg_r.key_dim + cfg_r.value_dim
        pool = {1: (np.zeros((C_r, K - 1)), np.zeros((cfg_r.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))),
                3: (rng.standard_normal((C_r, K - 1)), rng.standard_normal((cfg_r.num_v_heads, 128, 128)))}
        tensors = {}
        for i, (x, b) in enumerate(zip(xs, batches)):
            if i == 1 and scribble and share.rank == 0:
                pool[1] = (pool[1][0] + 1.0, pool[1][1])
            before = {s: (c.copy(), r.copy()) for s, (c, r) in pool.items()}
            rows = {n: [] for n in ("qkvz", "ba", "core", "z", "core_gated", "partial")}
            for j, slot in enumerate(b["slots"]):
                s, e = b["query_start_loc"][j], b["query_start_loc"][j + 1]
                has = j < b["num_decodes"] or b["has_initial_state"][j]
                conv_in, rec_in = pool[slot] if has else (np.zeros((C_r, K - 1)), np.zeros_like(pool[slot][1]))
                g = judge.golden_call(cfg_r, w_r, x[s:e], conv_in, rec_in)
                T, nv = e - s, cfg_r.num_v_heads
                rows["qkvz"].append(np.concatenate([g["qkv"][0], g["z"][0].reshape(T, -1)], axis=1))
                rows["ba"].append(np.concatenate([g["b"][0], g["a"][0]], axis=1))
                rows["core"].append(g["core"][0])
                rows["z"].append(g["z"][0])
                rows["core_gated"].append(g["core_gated"][0])
                rows["partial"].append(g["attn_out"][0])
                pool[slot] = (g["conv_state"][0], g["recurrent_state"][0])
                del nv
            cat = {n: np.concatenate(v) for n, v in rows.items()}
            cat["x"] = x
            for what, arr in cat.items():
                tensors[f"forward.{i}.{what}"] = arr
            tensors[f"forward.{i}.conv_before"] = np.stack([np.swapaxes(before[s][0], 0, 1) for s in b["slots"]])
            tensors[f"forward.{i}.ssm_before"] = np.stack([before[s][1] for s in b["slots"]])
            tensors[f"forward.{i}.conv_after"] = np.stack([np.swapaxes(pool[s][0], 0, 1) for s in b["slots"]])
            tensors[f"forward.{i}.ssm_after"] = np.stack([pool[s][1] for s in b["slots"]])
        files.append(tensors)
    for i in range(len(xs)):  # the all-reduced output every rank returns
        total = sum(t[f"forward.{i}.partial"] for t in files)
        for t in files:
            t[f"forward.{i}.out"] = total
    for r, tensors in enumerate(files):
        meta = {"rank": r, "world": tp, "batches": batches}
        write_safetensors(folder / f"{name}.tp{tp}.rank{r}.safetensors", tensors,
                          {"format": "pt", "gdncheck_vllm_tp": json.dumps(meta)})
    doc = {"tp": tp, "vllm": "float64 stand-in", "requests": [{"request_id": "0", "tokens": [1]},
                                                              {"request_id": "1", "tokens": [2]}]}
    (folder / f"{name}.tp{tp}.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-tp-fake")
    _fake_run(folder, 2)
    return folder


def _summary(folder, glue=None, runs=(RUN,)):
    s = judge.summary(ROOT / "fixtures" / "default", folder, "bf16", glue=glue, runs=runs)
    doc = s.to_json()
    validate_summary(doc)
    return s, doc


def _worst(summary):
    return max(r.shard["max_err"] / r.shard["elem_bound"] for c in summary.cases for r in c.records if r.shard)


def test_a_correct_capture_conforms_per_request_and_rank(fake):
    s, doc = _summary(fake)
    assert doc["verdict"] == "conforms" and doc["exit_code"] == 0
    assert [c.id for c in s.cases] == ["vllm-real-heads-tp2-req0", "vllm-real-heads-tp2-req1"]
    # request 0: two calls (prefill 5, decode 1), request 1: one; 10 tensors x 2 ranks + the partials summed
    assert [len(c.records) for c in s.cases] == [2 * 21, 21]
    assert _worst(s) < 1e-9  # the float64 layer against itself, rank by rank


@pytest.mark.parametrize("glue, stage, words", [
    (Swapped(), "qkv", "equals rank 1's share"),
    (OneBlock(), "qkv", "conv channels"),
    (BaSwapped(), "a", "rank 0, call 0, a"),
])
def test_glue_mutants_fail_at_their_stage(fake, glue, stage, words):
    s, doc = _summary(fake, glue)
    assert doc["exit_code"] == 1 and all(c.status == "fail" for c in s.cases)
    first = [r for r in s.cases[0].records if r.verdict == "fail"][0]
    assert first.call == 0 and first.shard["max_err"] > 10 * first.shard["elem_bound"]
    assert (first.tensor == stage or stage in first.message) and words in s.cases[0].message


def test_a_slot_written_between_forwards_fails_the_slot_history(tmp_path):
    _fake_run(tmp_path, 2, scribble=True)
    s, _ = _summary(tmp_path)
    assert s.cases[0].status == "fail" and "does not hold the state the request left" in s.cases[0].message
    assert s.cases[1].status == "pass"


def test_a_missing_or_unusable_capture_is_an_error_never_a_pass(tmp_path, fake):
    s, doc = _summary(tmp_path, runs=(("real-heads", capture.CASE, (1, 2)),))
    assert doc["exit_code"] == 2 and {c.status for c in s.cases} == {"error"}
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in fake.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    (broken / "real-heads.tp2.rank1.safetensors").write_bytes(b"not a safetensors file")
    s, doc = _summary(broken)
    assert doc["exit_code"] == 2 and "real-heads.tp2.rank1.safetensors" in s.cases[0].problem
    # a rank file whose batch metadata is not what capture.py writes: an error naming the run, no traceback
    path = broken / "real-heads.tp2.rank1.safetensors"
    path.write_bytes((fake / "real-heads.tp2.rank1.safetensors").read_bytes())
    for r in (0, 1):
        from gdncheck.safetensors_io import read_safetensors

        tensors, meta = read_safetensors(broken / f"real-heads.tp2.rank{r}.safetensors")
        doc_meta = json.loads(meta["gdncheck_vllm_tp"])
        doc_meta["batches"][1]["query_start_loc"] = None
        write_safetensors(broken / f"real-heads.tp2.rank{r}.safetensors", tensors,
                          {**meta, "gdncheck_vllm_tp": json.dumps(doc_meta)})
    s, doc = _summary(broken)
    assert doc["exit_code"] == 2 and "not as its program writes it: TypeError" in s.cases[0].problem


def test_the_row_is_registered_and_says_not_installed_without_its_environment(tmp_path, monkeypatch):
    from gdncheck.cli import main

    eng = registry.engine("vllm-tp")
    assert eng.judge == "gdncheck.conformance.engines.vllm_tp.judge:summary" and eng.profiles == ("bf16",)
    monkeypatch.setenv("GDN_VLLM_TP_DIR", str(tmp_path / "no-venv"))
    rc = main(["engines", "--engine", "vllm-tp", "--out", str(tmp_path / "out")])
    [row] = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"]
    assert rc == 1 and row["status"] == "not_installed" and "scripts/engine-env vllm" in row["problem"]


def _fake_main(argv):
    """A stand-in for the row's program (``gdncheck engines`` runs it as ``{folder}/bin/python -m ...``): the
    float64 captures of every run of capture.RUNS, or, with GDN_FAKE_VLLM_TP=crash, the first and then exit 1,
    or =partial, the first and exit 0."""
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("GDN_FAKE_VLLM_TP", "")
    runs = [(name, case, tp) for name, case, tps in capture.RUNS for tp in tps]
    if mode == "eps":  # the layer with vLLM's CPU L2-norm eps, 1e-5
        from gdncheck.reference.functions import l2_normalize

        def qk_norm(qkv_conv, nk, dk, nv, dv):
            q, k = (qkv_conv[..., i * nk * dk:(i + 1) * nk * dk].reshape(*qkv_conv.shape[:-1], nk, dk) for i in (0, 1))
            v = qkv_conv[..., 2 * nk * dk:].reshape(*qkv_conv.shape[:-1], nv, dv)
            return l2_normalize(q, 1e-5), l2_normalize(k, 1e-5), v

        judge.qk_norm = qk_norm
    for i, (name, case, tp) in enumerate(runs):
        if i == 1 and mode == "crash":
            sys.exit(1)
        if i == 1 and mode == "partial":
            return
        _fake_run(out, tp, name=name, case=case)


def _fake_venv(tmp_path) -> Path:
    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f"#!/bin/sh\ncd {ROOT} && exec {sys.executable} -c 'import sys; "
                  f"from tests.engines.vllm_tp.test_vllm_tp import _fake_main; _fake_main(sys.argv[1:])' \"$@\"\n")
    py.chmod(0o755)
    return venv


@pytest.mark.parametrize("mode, status, verdict", [
    ("", "ran", "conforms"),
    ("partial", "ran", "inputs unusable"),  # TP 2's capture missing: cases in error
    ("crash", "could_not_run", None),
])
def test_the_matrix_runs_the_program_then_the_rows_own_judge(tmp_path, monkeypatch, mode, status, verdict):
    from gdncheck.cli import main

    monkeypatch.setenv("GDN_VLLM_TP_DIR", str(_fake_venv(tmp_path)))
    monkeypatch.setenv("GDN_FAKE_VLLM_TP", mode)
    rc = main(["engines", "--engine", "vllm-tp", "--out", str(tmp_path / "out")])
    [row] = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"]
    cell = row["results"]["bf16"]
    assert cell["status"] == status, cell
    if verdict == "conforms":
        assert rc == 0 and cell["verdict"] == "conforms" and cell["counts"]["pass"] == 6
        assert cell["worst_ratio"]["ratio"] < 1e-9
    elif mode == "partial":  # judged, not a pass: each missing run is an unexplained unusable case
        assert cell["verdict"] == "inputs unusable" and cell["counts"]["error"] == 2 and cell["unexplained"] == 2
    else:  # a program that died: a run that could not be made, exit 1
        assert rc == 1 and "exited 1" in cell["problem"]


def test_the_eps_finding_explains_an_engine_with_eps_1e5(tmp_path, monkeypatch):
    """Captures made by the float64 layer with an L2-norm eps of 1e-5 (what vLLM's CPU path uses): the qk-eps
    run's requests fail at rank 1's core (key head 1, whose q and k have squared norms near 1e-6) and the row's
    finding explains every one; rank 0's share and real-heads' weights (norms O(1)) pass."""
    from gdncheck.cli import main

    monkeypatch.setenv("GDN_VLLM_TP_DIR", str(_fake_venv(tmp_path)))
    monkeypatch.setenv("GDN_FAKE_VLLM_TP", "eps")
    assert main(["engines", "--engine", "vllm-tp", "--out", str(tmp_path / "out")]) == 0
    cell = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"][0]["results"]["bf16"]
    assert cell["counts"]["pass"] == 4 and cell["counts"]["fail"] == 2 and cell["unexplained"] == 0, cell
    for f in cell["findings"]:
        assert f["case"].startswith("vllm-d128-qk-eps-tp2-") and f["finding"][1] == "vllm-d128-qk-eps-tp2"
        assert f["adjudication"]["stage"] == "delta_rule" and f["adjudication"]["tensor"] == "core"
    summary = json.loads(Path(cell["summary"]).read_text())
    fails = {(r["shard"]["rank"], r["message"].split(",")[2].split()[0]) for c in summary["cases"]
             for r in c["records"] if r["verdict"] == "fail"}
    # rank 0's own share passes: only the all-reduced output it holds (the sum with rank 1's partial) fails
    assert {s for r, s in fails if r == 0} == {"attn_out"} and (1, "core") in fails


@pytest.mark.parametrize("glue", [Swapped, OneBlock])
def test_a_glue_mutant_makes_the_row_fail(tmp_path, monkeypatch, glue):
    """The row's judge with its glue broken (ranks swapped; the q/k/v split read as one block): every request of
    both runs fails, each an unexplained deviation of the matrix."""
    from gdncheck.cli import main

    monkeypatch.setenv("GDN_VLLM_TP_DIR", str(_fake_venv(tmp_path)))
    monkeypatch.setattr(judge, "Glue", glue)
    main(["engines", "--engine", "vllm-tp", "--out", str(tmp_path / "out")])
    cell = json.loads((tmp_path / "out" / "matrix.json").read_text())["engines"][0]["results"]["bf16"]
    # TP 1 has one rank: swapping or splitting nothing changes it; every request at TP 2 fails
    assert cell["verdict"] == "does not conform" and cell["counts"] == {
        "pass": 2, "fail": 4, "not_applicable": 0, "error": 0, "cases": 6}, cell["counts"]
    assert {f["case"] for f in cell["findings"] if f["unexplained"]} == {
        f"vllm-{n}-tp2-req{i}" for n in ("real-heads", "d128-qk-eps") for i in (0, 1)}


def test_engine_weights_round_as_torch_does():
    a = np.array([1.0, 1.00390625, 1.0 + 2 ** -8 + 2 ** -9, -3.14159, 65504.0], dtype=np.float32)
    got = capture._bf16(a)
    # bf16 keeps 8 bits of mantissa: 1 + 2^-8 is a tie (to even: 1), 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7
    assert got.tolist() == [1.0, 1.0, 1.0078125, -3.140625, 65536.0]


# --- the engine itself ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_tp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-tp-engine")
    shm = {p.name for p in Path("/dev/shm").glob("vllm_dist_*")}
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([str(VENV_PYTHON), "-m", "gdncheck.conformance.engines.vllm_tp.capture", "--fixtures",
                           str(ROOT / "fixtures" / "default"), "--out", str(out), "--case", "real-heads", "--tp",
                           "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, shm


@needs_venv
def test_vllm_at_tp2_conforms_and_its_glue_mutants_fail(engine_tp2):
    out, shm = engine_tp2
    s, doc = _summary(out)
    assert doc["exit_code"] == 0, [c.message for c in s.cases]
    assert len(s.cases) == len(capture.PROMPTS) and all(c.judged > 0 for c in s.cases)
    assert _worst(s) < 0.5
    for glue in (Swapped(), OneBlock()):
        s, doc = _summary(out, glue)
        assert doc["exit_code"] == 1 and all(c.status == "fail" for c in s.cases)
    leaked = {p.name for p in Path("/dev/shm").glob("vllm_dist_*")} - shm
    assert not leaked, f"the run left {sorted(leaked)} in /dev/shm"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
