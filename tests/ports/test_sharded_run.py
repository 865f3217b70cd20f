"""The sharded cases through ``gdncheck run`` and ``verify`` (docs/sharding.md; FORMAT.md §4.2, §7.1):
the reference and the Triton path conform rank by rank, in this process and on spawned gloo ranks
(``--world``); each field sharding bug (TP_FAULTS, CP_FAULTS as ports) fails at its rank and stage; a
missing or stray rank file fails; a port without the sharded methods gets the cases not applicable; a
bad ``--world`` exits 2 in one line before anything is written."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from gdncheck.cli import main
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.build import build_suite
from gdncheck.fixtures.manifest import load_manifest

FAULTS = "tests.ports.sharded_faults"


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "suite"
    build_suite("sharded", out)
    return out


def _verify(suite, out, profile="f32", **kw):
    return verify(suite, out, profile, **kw)


def _case(suite, prefix):
    return next(c["id"] for c in load_manifest(suite)["cases"] if c["id"].startswith(prefix + "_"))


def test_the_sharded_suite_requires_the_feature_and_keeps_it_optional(suite):
    m = load_manifest(suite)
    assert m["format_version"] == "1.3" and m["features"]["sharded"]["since"] == "1.3"
    assert len(m["cases"]) == 10
    for c in m["cases"]:
        assert c["program"][1]["op"] == "shard" and c["requires"]["sharded"] == 1
        assert "sharded" in c["coverage"]["features"] and "sharded" in c["tags"]


def test_reference_conforms_in_process(suite, tmp_path):
    rep = run_impl("reference", suite, tmp_path, "f32")
    assert [c.status for c in rep.cases] == ["ran"] * 10
    s = _verify(suite, tmp_path)
    assert s.exit_code == 0 and [c.status for c in s.cases] == ["pass"] * 10
    assert sum(c.judged for c in s.cases) > 100
    # every rank wrote its own file, and only its share: TP 3's rank 1 holds value heads 2-4 (3 heads)
    tp3 = _case(suite, "tp3-uneven")
    from gdncheck.safetensors_io import SafetensorsFile
    r1 = SafetensorsFile(tmp_path / f"{tp3}.rank1.safetensors")
    assert r1.shape_of("calls.0.core")[-2] == 3 and r1.shape_of("calls.0.recurrent_state")[1] == 3


def test_a_passing_sharded_tensor_carries_its_worst_share_and_the_matrix_reads_it(suite, tmp_path):
    """Each passing record of a sharded case holds its worst rank's errors and bounds (``shard``), so the matrix's
    worst passing ratio of a sharded row is a number, not none."""
    from gdncheck.conformance.engines.matrix import profile_result

    run_impl("reference", suite, tmp_path, "f32", tags=["world-2"])
    doc = _verify(suite, tmp_path, tags=["world-2"]).to_json()
    passes = [r for c in doc["cases"] for r in c["records"] if r["verdict"] == "pass"]
    assert len(passes) > 50 and all(r["shard"] and 0 <= r["shard"]["max_err"] <= r["shard"]["elem_bound"]
                                    for r in passes)
    ratios = [max(r["shard"]["max_err"] / r["shard"]["elem_bound"],
                  r["shard"]["nmse"] / r["shard"]["nmse_bound"] if r["shard"]["nmse_bound"] else 0.0) for r in passes]
    worst = profile_result(doc, "reference", "f32", {})["worst_ratio"]
    assert worst is not None and worst["ratio"] == max(ratios) and 0 < worst["ratio"] < 1


def test_triton_conforms_in_process_tensor_parallel(suite, tmp_path):
    pytest.importorskip("triton")
    for profile in ("f32", "bf16"):
        out = tmp_path / profile
        run_impl("triton", suite, out, profile, tags=["tp"])
        s = _verify(suite, out, profile, tags=["tp"])
        assert [c.status for c in s.cases] == ["pass"] * 4, [c.message for c in s.cases]


@pytest.mark.parametrize("profile", ["f32", "bf16", "f16"])
def test_triton_conforms_in_process_context_parallel(suite, tmp_path, profile):
    """The Triton path's context parallelism (gpu_impl/sharded.py): halos, each segment's summary from its own
    recurrent kernel (the state widened to [dk, dv + dk]), entry states and outputs, against the float64 goldens;
    its ranks run as threads here (one interpreted launch at a time)."""
    pytest.importorskip("triton")
    run_impl("triton", suite, tmp_path, profile, tags=["cp"])
    s = _verify(suite, tmp_path, profile, tags=["cp"])
    assert [c.status for c in s.cases] == ["pass"] * 5, [c.message for c in s.cases]  # 3 entered, 2 from zero
    judged = {(r.tensor, r.verdict) for c in s.cases for r in c.records}
    assert {("conv_state", "pass"), ("recurrent_state", "pass"), ("out", "pass")} <= judged  # halo, summary, out


@pytest.mark.slow
def test_spawned_ranks_meet_with_a_relative_out_folder(suite, tmp_path, monkeypatch):
    """--out relative to the working directory: the ranks' rendezvous file is found (it was read as a URL's host:
    every rank waited out its deadline); the Triton path's context parallelism on spawned gloo ranks, in bf16."""
    pytest.importorskip("triton")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "triton", "--fixtures", str(suite), "--out", "out", "--profile", "bf16", "--tag", "world-2",
                 "--world", "2", "-q"])
    assert code == 0
    s = _verify(suite, tmp_path / "out", "bf16", tags=["world-2"])
    assert [c.status for c in s.cases] == ["pass"] * 5, [c.message for c in s.cases]  # 2 TP, 3 CP


def test_a_context_parallel_rank_that_raises_fails_its_case_at_once(suite, tmp_path):
    """One rank's exception releases the ranks waiting for it in a collective: the case fails with that rank's
    error in seconds, not after the collective's timeout with another rank's."""
    import time

    cid = _case(suite, "cp4-zigzag")
    t0 = time.monotonic()
    run_impl(f"{FAULTS}:raises_on_rank_2", suite, tmp_path, "f32", cases=[cid])
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert time.monotonic() - t0 < 120  # the collective's timeout is 300 s
    assert rep.status == "fail" and "rank 2 gives up" in rep.message, rep.message


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_reference_conforms_on_spawned_gloo_ranks(suite, tmp_path, world):
    code = main(["run", "reference", "--fixtures", str(suite), "--out", str(tmp_path), "--profile", "f32",
                 "--tag", f"world-{world}", "--world", str(world)])
    assert code == 0
    s = _verify(suite, tmp_path, tags=[f"world-{world}"])
    assert [c.status for c in s.cases] == ["pass"] * {2: 5, 4: 4}[world]  # world 4: tp4-past-keys, cp4-*, tp2-cp2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".gdncheck-ranks-")]


@pytest.mark.parametrize("profile", ["f32", "bf16"])
@pytest.mark.parametrize("fault,case,rank,stage,fact", [
    ("partial_not_reduced", "tp2", 0, "attn_out (", "equals its own out_proj partial"),
    ("partial_reduced_twice", "tp2", 0, "attn_out (", "equals 2× the reduced output"),
    ("ranks_swapped", "tp2", 0, "qkv (", "equals rank 1's share"),
    # tp2's 13 tokens: 3.18x (log decay), NMSE 4.94x in bf16; tp4-past-keys 7.3x and 73.5x. Ranks 1, 2 and 3
    # read wrong rows there: rank 1 is named in f32, rank 2 in bf16, where rank 1's error is under the bound
    ("a_sliced_by_key_heads", "tp4-past-keys", (1, 2), "g (", ""),
    ("conv_weight_one_block", "tp2", 0, "qkv_conv (", ""),
    ("no_halo", "cp4-zigzag", 1, "halo (", "no halo was received"),
    ("entry_from_zeros", "cp4-zigzag", 1, "entry_state (", "the predecessors' summaries were not applied"),
    ("summaries_reversed", "cp4-zigzag", 2, "entry_state (", "composed in reverse token order"),
    # cp4-zigzag's two-token first segment: in bf16 its summary is 1.05x (elem) and 5.05x (NMSE) off
    ("decay_on_both", "cp2-ragged", 0, "summary (", ""),
    # a padding slot of rank 0 (2 heads in 3 slots) a copy of head 0: bf16 1.08x (elem), NMSE 34.8x
    ("padding_head_leaks", "tp3-uneven", 0, "attn_out_partial (", "value head 0 counted 2× (a padding slot"),
])
def test_each_sharding_fault_fails_at_its_rank_and_stage(suite, tmp_path, fault, case, rank, stage, fact, profile):
    """Each fault fails run + verify alone, at its rank and stage, >= 10x its bound (the elementwise error or the
    share's NMSE), in f32 and bf16, with what the tensor equals where the judge can say it."""
    cid = _case(suite, case)
    run_impl(f"{FAULTS}:{fault}", suite, tmp_path, profile, cases=[cid])
    (rep,) = _verify(suite, tmp_path, profile, cases=[cid]).cases
    assert rep.status == "fail"
    ranks = rank if isinstance(rank, tuple) else (rank,)
    assert rep.message.startswith(tuple(f"rank {r}, " for r in ranks)), rep.message
    assert stage in rep.message and fact in rep.message, rep.message
    ratios = [float(part.rsplit(", ", 1)[1]) for part in rep.message.split("× the bound")[:-1]]
    ratio = max(ratios) if ratios else np.inf
    assert ratio >= 10, rep.message


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_a_rank_padded_to_the_widest_share_with_inert_slots_conforms(suite, tmp_path, profile):
    """vLLM PR 47759's uneven TP 3: every rank holds max(counts) = 3 head slots, rank 0's third and rank 2's
    second and third padding (zero rows and out_proj columns); each rank writes its real heads only."""
    cases = [_case(suite, "tp3-uneven"), _case(suite, "tp2")]
    run_impl(f"{FAULTS}:padded_inert", suite, tmp_path, profile, cases=cases)
    s = _verify(suite, tmp_path, profile, cases=cases)
    assert [c.status for c in s.cases] == ["pass", "pass"], [c.message for c in s.cases]


def _rewrite(path, edit):
    from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

    f = SafetensorsFile(path)
    tensors = {k: np.asarray(f.read(k), dtype=np.float64) for k in f}
    edit(tensors)
    write_safetensors(path, tensors, f.metadata)


@pytest.mark.parametrize("tensor,axis,stage,holds", [
    ("g", -1, "g (", "holds 3 value heads where its share has 2"),
    ("core_gated", -2, "core_gated (", "holds 3 value heads where its share has 2"),
    ("recurrent_state", 1, "recurrent_state (", "holds 3 value heads where its share has 2"),
    ("qkv", -1, "qkv (", "holds 65 conv channels where its share has 64"),
])
def test_a_rank_file_holding_padding_slots_fails_naming_them(suite, tmp_path, tensor, axis, stage, holds):
    """A rank writes only its real heads (docs/sharding.md): rank 0 of the uneven plan (value heads 0-1) writing
    one more slot of zeros on the heads' (or channels') axis fails at that stage, saying how many it holds."""
    cid = _case(suite, "tp3-uneven")
    run_impl("reference", suite, tmp_path, "f32", cases=[cid])

    def pad(t):
        for name in [n for n in t if n.endswith(f".{tensor}")]:
            widths = [(0, 0)] * t[name].ndim
            widths[axis] = (0, 1)
            t[name] = np.pad(t[name], widths)

    _rewrite(tmp_path / f"{cid}.rank0.safetensors", pad)
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert rep.status == "fail" and rep.message.startswith(f"rank 0, call 0, {stage}"), rep.message
    assert holds in rep.message and "never the padding slots" in rep.message, rep.message
    assert len(rep.message.splitlines()) == 1


@pytest.mark.parametrize("head,times,said", [
    (0, 1, "value head 0 counted 2× (a padding slot computing a copy of a real head)"),
    (1, -1, "value head 1 left out"),
    (3, 1, "value head 3 of rank 1 added 1×"),
])
def test_a_partial_off_by_whole_heads_names_them(suite, tmp_path, head, times, said):
    """Rank 0's out_proj partial (value heads 0-1 of tp3-uneven) with one head's contribution (its core_gated
    times its out_proj columns, computed here from the goldens) added or taken away: the diagnosis names it."""
    from gdncheck.safetensors_io import SafetensorsFile

    cid = _case(suite, "tp3-uneven")
    run_impl("reference", suite, tmp_path, "f32", cases=[cid])
    gold = SafetensorsFile(suite / f"{cid}.safetensors")
    cg = np.asarray(gold.read("calls.0.core_gated"), dtype=np.float64)
    w = np.asarray(gold.read("weights.linear_attn.out_proj.weight"), dtype=np.float64)
    dv = cg.shape[-1]
    contrib = cg[..., head, :] @ w[:, head * dv:(head + 1) * dv].T

    def edit(t):
        t["calls.0.attn_out_partial"] = t["calls.0.attn_out_partial"] + times * contrib

    _rewrite(tmp_path / f"{cid}.rank0.safetensors", edit)
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert rep.status == "fail" and rep.message.startswith("rank 0, call 0, attn_out_partial ("), rep.message
    assert rep.message.endswith("equals its partial with " + said), rep.message


def test_a_missing_or_stray_rank_file_fails(suite, tmp_path):
    cid = _case(suite, "tp2")
    run_impl("reference", suite, tmp_path, "f32", cases=[cid])
    shutil.copy(tmp_path / f"{cid}.rank1.safetensors", tmp_path / f"{cid}.rank2.safetensors")
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert rep.status == "fail" and "rank file of a rank the plan does not have" in rep.diagnosis["text"]
    (tmp_path / f"{cid}.rank2.safetensors").unlink()
    (tmp_path / f"{cid}.rank1.safetensors").unlink()
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert rep.status == "fail" and "rank 1: no rank file" in rep.diagnosis["text"]


def test_a_rank_holding_the_whole_call_fails(suite, tmp_path):
    """Context parallelism that did not split (MaxText issue 4932): rank 1 writes every token as its segment."""
    from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

    cid = _case(suite, "cp2-ragged")
    run_impl("reference", suite, tmp_path, "f32", cases=[cid])
    path = tmp_path / f"{cid}.rank1.safetensors"
    f = SafetensorsFile(path)
    tensors = {k: np.asarray(f.read(k)) for k in f}
    whole = SafetensorsFile(suite / f"{cid}.safetensors").read("calls.1.out")
    tensors["segments.1.out"] = np.asarray(whole, dtype=np.float64)
    write_safetensors(path, tensors, f.metadata)
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert rep.status == "fail" and "the call was not split" in rep.message and rep.message.startswith("rank 1, ")


def test_a_port_without_the_sharded_methods_gets_them_not_applicable(suite, tmp_path):
    rep = run_impl(f"{FAULTS}:unsharded", suite, tmp_path, "f32")
    assert {c.status for c in rep.cases} == {"not_applicable"}
    s = _verify(suite, tmp_path)
    assert {c.status for c in s.cases} == {"not_applicable"}
    assert all("requires sharded (format 1.3)" in c.message for c in s.cases)
    assert not list(tmp_path.glob("*.rank*.safetensors"))


@pytest.mark.parametrize("world", ["0", "-1", "x", "1000000", "3", " 2x"])
def test_a_bad_world_exits_2_in_one_line_and_writes_nothing(suite, tmp_path, capsys, world):
    out = tmp_path / "out"
    code = main(["run", "reference", "--fixtures", str(suite), "--out", str(out), "--profile", "f32",
                 f"--world={world}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--world" in err and not out.exists()


def test_stage_isolated_mode_leaves_the_sharded_cases_out_with_a_note(fixtures_dir, tmp_path):
    """The committed suite holds the sharded cases: stage-isolated mode neither runs nor judges them (they are
    judged end to end, rank by rank), and says so, while it judges the others."""
    cases = ["tp2_T", "decode_T"]
    rep = run_impl("reference", fixtures_dir, tmp_path, "f32", cases=cases, stage_isolated=True)
    assert [c.id.split("_")[0] for c in rep.cases] == ["decode"]
    s = verify(fixtures_dir, tmp_path, "f32", cases=cases, stage_isolated=True)
    assert [c.id.split("_")[0] for c in s.cases] == ["decode"] and s.cases[0].status == "pass"
    assert any("1 sharded case(s) not applicable" in n for n in s.notes) and s.exit_code == 0


def test_a_users_file_at_a_rank_files_name_is_never_replaced(suite, tmp_path, capsys):
    cid = _case(suite, "tp2")
    mine = tmp_path / f"{cid}.rank1.safetensors"
    mine.write_bytes(b"my notes")
    code = main(["run", "reference", "--fixtures", str(suite), "--out", str(tmp_path), "--profile", "f32",
                 "--case", cid])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{cid}.rank1.safetensors" in err
    assert mine.read_bytes() == b"my notes" and not (tmp_path / f"{cid}.safetensors").exists()


@pytest.mark.parametrize("edit, said", [
    (lambda step: step["tp"]["ranks"][0].update(v_heads=[0, 3]), "shard step: expected value-head counts summing to 4"),
    (lambda step: step.update(tp={"kind": "tp", "format": 1, "world": 3}), "shard step:"),
    (lambda step: step.update(cp={"kind": "cp"}), "shard step: expected a shard step with one plan"),
    (lambda step: step.update(tpcp=step.pop("tp"), call=1),
     "shard step: expected the shard step's tpcp a plan of kind"),
])
def test_a_damaged_plan_makes_that_case_unusable_and_the_others_run(suite, tmp_path, edit, said):
    import json as _json

    from gdncheck.fixtures.manifest import CaseProblem

    copy = tmp_path / "suite"
    shutil.copytree(suite, copy)
    doc = _json.loads((copy / "manifest.json").read_text())
    edit(next(s for s in _case_entry(doc, "tp2")["program"] if s["op"] == "shard"))
    (copy / "manifest.json").write_text(_json.dumps(doc))
    problems: list[CaseProblem] = []
    assert len(load_manifest(copy, problems)["cases"]) == 9
    assert len(problems) == 1 and said in problems[0].message, problems
    rep = run_impl("reference", copy, tmp_path / "out", "f32")
    assert sorted(c.status for c in rep.cases) == ["ran"] * 9 + ["skipped"]


def _case_entry(doc, prefix):
    return next(c for c in doc["cases"] if c["id"].startswith(prefix + "_"))


def test_a_failing_sharded_case_keeps_its_summary_schema_and_gets_a_report(suite, tmp_path, capsys):
    """A rank's failure is a record of reason ``sharded`` with its rank, errors and bounds (``shard``): the summary
    holds to its schema, and ``gdncheck report`` renders it with the rank's message."""
    import json

    cid = _case(suite, "tp2")
    out, summary, report = tmp_path / "out", tmp_path / "summary.json", tmp_path / "report"
    run_impl(f"{FAULTS}:partial_not_reduced", suite, out, "bf16", cases=[cid])
    assert main(["verify", "--fixtures", str(suite), "--outputs", str(out), "--profile", "bf16", "--case", cid,
                 "--summary", str(summary), "-q"]) == 1
    rec = next(r for r in json.loads(summary.read_text())["cases"][0]["records"] if r["verdict"] == "fail")
    assert rec["reason"] == "sharded" and rec["shard"]["rank"] == 0 and rec["metrics"] is None
    assert rec["shard"]["nmse"] / rec["shard"]["nmse_bound"] >= 10  # measured 458x
    capsys.readouterr()
    assert main(["report", str(summary), "-o", str(report), "--fixtures", str(suite), "--outputs", str(out)]) == 0
    assert "rank 0, call 0, attn_out" in (report / "cases" / f"{cid}.html").read_text(encoding="utf-8")


# --- tensor × context parallelism (tp2-cp2: TP 2 × CP 2, TP rank fastest; segment 0 tokens 0-4, 1 tokens 5-13)


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_triton_conforms_in_process_tensor_times_context_parallel(suite, tmp_path, profile):
    """The Triton path's TP x CP: each TP share as a layer of its heads, its context_parallel_rank over the CP
    group of its TP rank, the partials reduced over the TP group; every rank's share judged."""
    pytest.importorskip("triton")
    run_impl("triton", suite, tmp_path, profile, tags=["tpcp"])
    s = _verify(suite, tmp_path, profile, tags=["tpcp"])
    assert [c.status for c in s.cases] == ["pass"], [c.message for c in s.cases]
    judged = {(r.tensor, r.verdict) for c in s.cases for r in c.records}
    assert judged == {(t, "pass") for t in ("conv_state", "recurrent_state", "attn_out")}


def _tampered(suite, tmp_path, edit):
    """tp2-cp2 run by the reference, then ``edit(files)`` on its rank files' tensors (rank -> name -> array)."""
    from gdncheck.safetensors_io import SafetensorsFile, write_safetensors

    cid = _case(suite, "tp2-cp2")
    run_impl("reference", suite, tmp_path, "f32", cases=[cid])
    files, metas = {}, {}
    for r in range(4):
        f = SafetensorsFile(tmp_path / f"{cid}.rank{r}.safetensors")
        files[r], metas[r] = {k: np.asarray(f.read(k)) for k in f}, f.metadata
    edit(files)
    for r in range(4):
        write_safetensors(tmp_path / f"{cid}.rank{r}.safetensors", files[r], metas[r])
    (rep,) = _verify(suite, tmp_path, cases=[cid]).cases
    return rep


def test_tpcp_rank_files_hold_each_share_and_conform(suite, tmp_path):
    """Each rank writes its heads on its tokens: rank 3 (TP 1, CP 1) holds value heads 2-3 on tokens 5-13, its
    halo its 64 conv channels (q, k of key head 1, v of value heads 2-3); the TP group's partials sum to the
    reduced output each rank writes."""
    rep = _tampered(suite, tmp_path, lambda files: None)
    assert rep.status == "pass", rep.message
    from gdncheck.safetensors_io import SafetensorsFile

    cid = _case(suite, "tp2-cp2")
    r2, r3 = (SafetensorsFile(tmp_path / f"{cid}.rank{r}.safetensors") for r in (2, 3))
    assert sorted({k.split(".")[1] for k in r3}) == ["1"]
    assert r3.shape_of("segments.1.halo") == (1, 64, 4) and r3.shape_of("segments.1.entry_state") == (1, 2, 16, 16)
    assert r3.shape_of("segments.1.attn_out_partial") == (1, 9, 32)
    summed = r2.read("segments.1.attn_out_partial") + r3.read("segments.1.attn_out_partial")
    gold = SafetensorsFile(suite / f"{cid}.safetensors").read("calls.1.attn_out")[:, 5:14]
    assert np.max(np.abs(summed - gold)) <= 1e-12 * np.max(np.abs(gold))
    assert np.array_equal(r2.read("segments.1.attn_out"), r3.read("segments.1.attn_out"))


def _swap_heads(files):  # rank 3 writes TP rank 0's heads (rank 2's tensors) on its tokens
    files[3] = {k: v.copy() for k, v in files[2].items()}


def _all_tokens(files):  # rank 2's partial holds the call's 14 tokens (context parallelism that did not split)
    p = files[2]["segments.1.attn_out_partial"]
    files[2]["segments.1.attn_out_partial"] = np.concatenate([np.zeros((1, 5, p.shape[-1])), p], axis=1)


def _unreduced(files):  # rank 1 skips the all-reduce over its TP group
    files[1]["segments.0.attn_out"] = files[1]["segments.0.attn_out_partial"].copy()


def _foreign_segment(files):  # rank 0 also writes segment 1, which its CP rank does not own
    files[0]["segments.1.halo"] = files[2]["segments.1.halo"]


def _all_heads(files):  # rank 0's entry state holds every value head
    files[0]["segments.0.entry_state"] = np.concatenate([files[0]["segments.0.entry_state"]] * 2, axis=1)


@pytest.mark.parametrize("edit,start,said", [
    (_swap_heads, "rank 3, segment 1 (tokens 5–13), halo (conv channels of key heads 1, value heads 2–3, tp rank 1 of "
                  "cp rank 1)", "equals TP rank 0's share (value heads 0–1)"),
    (_all_tokens, "rank 2, segment 1 (tokens 5–13), attn_out_partial (the out_proj partial of value heads 0–1",
     "shape [1, 14, 32], but its share's is [1, 9, 32]"),
    (_unreduced, "rank 1, segment 0 (tokens 0–4), attn_out (the output reduced over its TP group",
     "equals its own out_proj partial: the all-reduce did not run"),
    (_foreign_segment, "rank 0 wrote segments [1] its CP rank 0 does not own", ""),
    (_all_heads, "rank 0, segment 0 (tokens 0–4), entry_state (value heads 0–1", "shape [1, 4, 16, 16]"),
])
def test_a_tpcp_rank_with_the_wrong_heads_or_tokens_fails_at_that_rank(suite, tmp_path, edit, start, said):
    rep = _tampered(suite, tmp_path, edit)
    assert rep.status == "fail" and rep.message.startswith(start) and said in rep.message, rep.message


@pytest.mark.parametrize("profile", ["f32", "bf16"])
@pytest.mark.parametrize("fault,rank,stage,fact", [
    ("no_halo", 2, "halo (", "no halo was received"),
    ("entry_from_zeros", 2, "entry_state (", "the predecessors' summaries were not applied"),
    ("decay_on_both", 0, "summary (", ""),
])
def test_each_context_parallel_fault_fails_tpcp_at_its_rank_and_stage(suite, tmp_path, fault, rank, stage, fact,
                                                                     profile):
    """The CP faults apply to TP x CP (each TP share runs the port's context_parallel): each fails tp2-cp2 at its
    rank (TP rank 0 of the CP rank whose segment goes wrong first) and stage by >= 10x its bound."""
    cid = _case(suite, "tp2-cp2")
    run_impl(f"{FAULTS}:{fault}", suite, tmp_path, profile, cases=[cid])
    (rep,) = _verify(suite, tmp_path, profile, cases=[cid]).cases
    assert rep.status == "fail" and rep.message.startswith(f"rank {rank}, "), rep.message
    assert stage in rep.message and fact in rep.message, rep.message
    ratio = max(float(part.rsplit(", ", 1)[1]) for part in rep.message.split("× the bound")[:-1])
    assert ratio >= 10, rep.message


def test_a_tpcp_plan_edited_by_hand_makes_the_case_unusable(suite, tmp_path):
    """Ranks renumbered CP-fastest in the manifest (a port would read another rank's share): refused in one line."""
    import json as _json

    from gdncheck.fixtures.manifest import CaseProblem

    copy = tmp_path / "suite"
    shutil.copytree(suite, copy)
    doc = _json.loads((copy / "manifest.json").read_text())
    step = next(s for s in _case_entry(doc, "tp2-cp2")["program"] if s["op"] == "shard")
    step["tpcp"]["ranks"][1].update(tp_rank=0, cp_rank=1)
    step["tpcp"]["ranks"][2].update(tp_rank=1, cp_rank=0)
    (copy / "manifest.json").write_text(_json.dumps(doc))
    problems: list[CaseProblem] = []
    assert len(load_manifest(copy, problems)["cases"]) == 9
    (p,) = problems
    assert "shard step: expected the tpcp plan its own parameters give" in p.message and "\n" not in p.message


def test_a_tpcp_halo_of_other_channels_fails_verify_by_its_shape(suite, tmp_path):
    """A port's halo with one channel too few on a TP share: the run writes it as it came and verify says its
    shape at the rank (it was an IndexError of the run, reading the share's channels out of it)."""
    cid = _case(suite, "tp2-cp2")
    rep = run_impl(f"{FAULTS}:short_halo", suite, tmp_path, "f32", cases=[cid])
    assert [c.status for c in rep.cases] == ["ran"], [c.message for c in rep.cases]
    (v,) = _verify(suite, tmp_path, cases=[cid]).cases
    assert v.status == "fail" and v.message.startswith("rank 0, segment 0 (tokens 0–4), halo ("), v.message
    assert "shape [1, 63, 4], but its share's is [1, 64, 4]" in v.message, v.message
