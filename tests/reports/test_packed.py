"""A serving case in the report (docs/serving.md, docs/report.md): a packed call shown per sequence,
its pool per slot, speculative verify / commit and prefix snapshots in their own terms.

What the page must say is derived here from the fixture's own program (its cu_seqlens, slots,
accepted counts, snapshot offsets) and from what each bug does, never from the report's code: the
leaking conv window spoils the first K − 1 tokens of every sequence after the first, a commit off by
one spoils every slot that accepts a token, a late snapshot every snapshot slot.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from gdncheck.calls import PAD_SLOT_ID
from gdncheck.conformance.judge.verify import verify
from gdncheck.fixtures.manifest import DEFAULT_DIR, load_manifest
from gdncheck.reports import write_report
from gdncheck.safetensors_io import read_safetensors, write_safetensors

from .conftest import PACKED_CASE, SERVING_CASES, serving_run
from .pages import parse


def program(case_id: str) -> list[dict]:
    return next(c for c in load_manifest(DEFAULT_DIR)["cases"] if c["id"] == case_id)["program"]


def page(report, case_id: str):
    return parse(report.parent / "cases" / f"{case_id}.html")


def first_divergence(doc) -> str:
    return doc.find(id="first").text


def tensor_section(doc, call: int, tensor: str):
    for s in doc.find_all("section", cls="tensor"):
        h = s.find("h3").text
        if f"call {call} ·" in h and f"· {tensor} —" in h:
            return s
    raise AssertionError(f"no section for call {call} {tensor}")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    return serving_run(tmp_path_factory, "reference", SERVING_CASES)


@pytest.fixture(scope="module")
def reference_report(reference_run, tmp_path_factory):
    return write_report(reference_run.doc, tmp_path_factory.mktemp("ref-report") / "site")


# --- the leaking conv window -----------------------------------------------------------------------
def test_the_first_divergence_names_sequence_token_and_slot(leak, leak_report):
    call0 = program(PACKED_CASE)[1]
    cu, slots = call0["cu_seqlens"], call0["slots"]
    # the leak reaches the second sequence's first token: stream token cu[1], sequence 1's token 0
    text = first_divergence(page(leak_report, PACKED_CASE))
    assert f"sequence 1, token 0 (slot {slots[1]})" in text, text
    assert f"token {cu[1]}" not in text  # never the stream index


def test_per_sequence_token_axes_restart_at_zero(leak, leak_report):
    call0 = program(PACKED_CASE)[1]
    cu, slots = call0["cu_seqlens"], call0["slots"]
    lengths = np.diff(cu).tolist()
    sec = tensor_section(page(leak_report, PACKED_CASE), 0, "qkv_conv")
    fig = sec.find("figure", cls="seq-plot")
    seqs = [int(i) for i in fig.attrs["data-sequences"].split(",")]
    # every sequence of more than one token has a panel, its axis from 0 to its own length - 1
    assert seqs == [i for i, n in enumerate(lengths) if n > 1]
    assert fig.attrs["data-tokens"].split(",") == [f"0-{lengths[i] - 1}" for i in seqs]
    for i in seqs:
        assert f"sequence {i}: 0 … {lengths[i] - 1}" in fig.find("figcaption").text
    assert fig.find("svg", cls="seq-drift") is not None  # the panels, inline
    # the step's sequence table: one row per sequence, its slot, length, positions
    rows = sequence_rows(page(leak_report, PACKED_CASE), 1)
    assert [r["sequence"] for r in rows] == [str(i) for i in range(len(lengths))]
    assert [r["tokens"] for r in rows] == [str(n) for n in lengths]
    assert [r["slot"] for r in rows] == ["padding (−1)" if s == PAD_SLOT_ID else f"slot {s}" for s in slots]
    assert [r["positions"] for r in rows] == [f"{p} … {p + n - 1}" for p, n in zip(call0["seq_pos"], lengths)]
    assert [r["kind"] for r in rows] == ["decode" if n == 1 else "prefill" for n in lengths]


def slot_rows(sec) -> dict[int, list[str]]:
    """A pool-state section's slot table: slot -> its cells."""
    rows = sec.find("table", cls="slots").find("tbody").find_all("tr")
    return {int(tr.find("td").text): [td.text for td in tr.find_all("td")] for tr in rows}


def sequence_rows(doc, step: int) -> list[dict]:
    """The rows of a serving step's sequence table, by column header."""
    table = doc.find("table", id=f"layout-{step}")
    heads = [th.text for th in table.find("thead").find_all("th")]
    return [dict(zip(heads, (td.text for td in tr.find_all("td")))) for tr in table.find("tbody").find_all("tr")]


def test_the_leak_spoils_the_first_conv_window_of_each_later_sequence(leak, leak_report):
    """The bug's footprint, per sequence: the first sequence is clean; every later one is over the
    bound from its token 0, on at most its first K − 1 tokens (K the conv kernel, from the state's shape)."""
    call0 = program(PACKED_CASE)[1]
    lengths = np.diff(call0["cu_seqlens"]).tolist()
    rec = next(r for r in leak.doc["cases"][0]["records"] if r["step"] == 1 and r["tensor"] == "conv_state")
    k = rec["expected_shape"][-1]
    col = "qkv_conv: err/bound, first over"
    cells = [r[col] for r in sequence_rows(page(leak_report, PACKED_CASE), 1)]
    assert "," not in cells[0]  # within the bound: its ratio alone
    ratios = [float(c.split(",")[0].lstrip("×")) for c in cells]
    assert ratios[0] <= 1
    for i in range(1, len(lengths)):
        m = re.fullmatch(r"×[0-9.e+-]+, token 0 \((\d+) over\)", cells[i])
        assert m, cells[i]
        assert 1 <= int(m.group(1)) <= min(k - 1, lengths[i]), (i, cells[i])
    # the worst sequence's error is verify's own largest error of the stream
    qkv = next(r for r in leak.doc["cases"][0]["records"] if r["step"] == 1 and r["tensor"] == "qkv_conv")
    worst = max(ratios) * qkv["bound"]["elem"]
    assert worst == pytest.approx(qkv["metrics"]["max_err"], rel=5e-3)  # the page prints 3 digits


def test_pool_and_layout_tables(leak, leak_report):
    steps = program(PACKED_CASE)
    call0 = steps[1]
    writes = sorted(s for s in call0["slots"] if s != PAD_SLOT_ID)
    doc = page(leak_report, PACKED_CASE)
    layout = doc.find("table", id="layout-1")
    assert f"may write slots {', '.join(map(str, writes))}" in layout.find("caption").text
    assert any("padding (−1)" in tr.text for tr in layout.find_all("tr"))
    slots = tensor_section(doc, 0, "conv_state").find("table", cls="slots")
    rows = slots.find("tbody").find_all("tr")
    pool = range(len(call0["seq_len_after"]))
    # a row for each slot the step names; the others (within the bound) in the caption
    assert [int(tr.find("td").text) for tr in rows] == writes
    quiet = [s for s in pool if s not in call0["slots"]]
    assert f"slots {', '.join(map(str, quiet))}: not named, within the bound" in slots.find("caption").text
    for tr in rows:
        s = int(tr.find("td").text)
        assert (tr.find_all("td")[2].text == "yes") == (s in writes)
        assert "touched" not in tr.classes()  # the leak writes only the slots it names


def test_the_summary_keeps_each_serving_step_layout(leak, tiled):
    steps = program(PACKED_CASE)
    served = leak.doc["cases"][0]["serving"]
    assert [s["step"] for s in served] == [i for i, s in enumerate(steps) if s["op"] == "forward_packed"]
    for lay in served:
        st = steps[lay["step"]]
        assert (lay["cu_seqlens"], lay["slots"], lay["seq_pos"]) == (st["cu_seqlens"], st["slots"], st["seq_pos"])
    assert all(c["serving"] == [] for c in tiled.doc["cases"])  # a dense case has none


def case_cost(report, case: dict) -> float:
    """Bytes per failing tensor of one case: its page and its plots (the site's index and colour bar
    are shared by every case of a suite)."""
    cases = report.parent / "cases"
    files = [cases / f"{case['id']}.html", *(cases / case["id"]).glob("*")]
    return sum(f.stat().st_size for f in files if f.is_file()) / sum(r["verdict"] == "fail" for r in case["records"])


def test_a_serving_case_costs_what_a_dense_one_does(leak, leak_report, tiled, tiled_report):
    """A page plots its first divergence and two worst tensors, whatever else fails (docs/report.md);
    a serving page adds, for each failing stream or pool tensor of a serving step, its split by
    sequence and by slot (read from the files, not drawn): the step's sequence table column, a slot
    table. Per failing tensor, the mixed serving case under conv_window_leaks (12 failing tensors)
    costs no more than the failing dense cases of the tiled run but for those tables: measured 3.5 kB
    a tensor against 1.8 and 3.5 kB (a small case pays its page's fixed part and its three plotted
    tensors over fewer failing tensors): at most 15 % more than the costlier dense case."""
    dense = [case_cost(tiled_report, c) for c in tiled.doc["cases"] if c["status"] == "fail"]
    serving = case_cost(leak_report, leak.doc["cases"][0])
    print(f"\nbytes per failing tensor: serving {serving:.0f}, dense {[round(d) for d in dense]}")
    assert serving <= 1.15 * max(dense), (serving, dense)


# --- a slot written that must not be ------------------------------------------------------------------
def test_a_slot_the_step_must_not_write_is_flagged(reference_run, tmp_path):
    """The reference's outputs, with one slot the first call does not name changed (a port that wrote
    a state into it): that slot's row is flagged, the first divergence names it."""
    call0 = program(PACKED_CASE)[1]
    untouched = min(set(range(len(call0["seq_len_after"]))) - set(call0["slots"]))
    src = reference_run.outputs / f"{PACKED_CASE}.safetensors"
    tensors, meta = read_safetensors(src)
    conv = np.array(tensors["calls.0.conv_state"])
    conv[untouched] += 0.5
    tensors["calls.0.conv_state"] = conv
    out = tmp_path / "out"
    out.mkdir()
    for f in reference_run.outputs.iterdir():
        if f.name != src.name and f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    write_safetensors(out / src.name, tensors, meta)
    doc = verify(DEFAULT_DIR, out, "bf16", cases=[PACKED_CASE]).to_json()
    report = write_report(doc, tmp_path / "site")
    pg = page(report, PACKED_CASE)
    assert f"pool slot {untouched} (not named: must stay" in first_divergence(pg)
    rows = tensor_section(pg, 0, "conv_state").find("table", cls="slots").find("tbody").find_all("tr")
    flagged = [int(tr.find("td").text) for tr in rows if "touched" in tr.classes()]
    assert flagged == [untouched]
    assert "must not write it" in next(tr for tr in rows if "touched" in tr.classes()).text


# --- speculative verify, commit, prefix snapshots ------------------------------------------------
def test_a_correct_run_shows_each_step_in_its_own_terms(reference_run, reference_report):
    assert all(c["status"] == "pass" for c in reference_run.doc["cases"])
    spec_id, prefix_id = SERVING_CASES[1], SERVING_CASES[2]
    spec = page(reference_report, spec_id)
    steps = program(spec_id)
    for i, st in enumerate(steps):
        if st["op"] == "verify_spec":
            table = spec.find("table", id=f"layout-{i}")
            for n in np.diff(st["cu_seqlens"]).tolist():
                assert f"verify {n} draft tokens (draft token 0 … {n - 1})" in table.text
            assert "the step may write no slot" in table.find("caption").text  # a verify writes none
            assert {r["kind"] for r in sequence_rows(spec, i)} == {"verify"}
        if st["op"] == "commit":
            assert f"commit of call {st['of_call']}: accepted {st['accepted']}" in spec.text
            table = spec.find("table", id=f"layout-{i}")
            for n, slot in zip(st["accepted"], st["slots"]):
                if slot != PAD_SLOT_ID:
                    assert f"commit {n}" in table.text
    prefix = page(reference_report, prefix_id)
    st = next(s for s in program(prefix_id) if s["op"] == "prefix_snapshots")
    for o, d in zip(st["snap_offset"], st["snap_slot"]):
        assert f"snapshot at offset {o}" in prefix.text and f"stored in slot {d}" in prefix.text
    assert not prefix.find_all("section", cls="tensor")  # nothing fails, nothing plotted


def test_a_triton_run_shows_its_sequences(tmp_path_factory):
    """The Triton path (under the interpreter here) on the mixed packed case: it passes, and each
    packed call's sequence table lists its sequences as the program packs them."""
    run = serving_run(tmp_path_factory, "triton", [PACKED_CASE])
    assert run.doc["cases"][0]["status"] == "pass"
    report = write_report(run.doc, tmp_path_factory.mktemp("triton-report") / "site")
    doc = page(report, PACKED_CASE)
    for i, st in enumerate(program(PACKED_CASE)):
        if st["op"] != "forward_packed":
            continue
        rows = sequence_rows(doc, i)
        assert [(r["slot"], r["tokens"]) for r in rows] == [
            ("padding (−1)" if s == PAD_SLOT_ID else f"slot {s}", str(n))
            for s, n in zip(st["slots"], np.diff(st["cu_seqlens"]).tolist())]
    assert not doc.find_all("section", cls="tensor")


@pytest.mark.parametrize("mutant", ["commit_off_by_one", "snapshot_chunk_late"])
def test_commit_and_snapshot_failures_are_named_by_their_meaning(mutant, tmp_path_factory):
    case_id = SERVING_CASES[1] if mutant == "commit_off_by_one" else SERVING_CASES[2]
    run = serving_run(tmp_path_factory, mutant, [case_id])
    report = write_report(run.doc, tmp_path_factory.mktemp(f"{mutant}-report") / "site")
    text = first_divergence(page(report, case_id))
    steps = program(case_id)
    if mutant == "commit_off_by_one":
        st = next(s for s in steps if s["op"] == "commit")
        # every slot accepting at least one token is wrong; the lowest is reported first
        slot, seq, n = min((s, i, n) for i, (s, n) in enumerate(zip(st["slots"], st["accepted"]))
                           if s != PAD_SLOT_ID and n > 0)
        assert f"pool slot {slot} (sequence {seq}'s: commit {n})" in text, text
        # the next verify reads the slots that commit spoiled: its sequences on those slots are over
        # the bound from their draft token 0, the others within it
        i, nxt = next((i, s) for i, s in enumerate(steps) if s["op"] == "verify_spec" and i > steps.index(st))
        spoiled = {s for s, n in zip(st["slots"], st["accepted"]) if s != PAD_SLOT_ID and n > 0}
        for row, slot in zip(sequence_rows(page(report, case_id), i), nxt["slots"]):
            cell = row["qkv_conv: err/bound, first over"]
            assert (", draft token 0 (" in cell) == (slot in spoiled), (slot, cell)
        doc = page(report, case_id)
        # at the commit, a slot committing 1 token keeps the state after none: the port left it as it was
        rows = slot_rows(tensor_section(doc, st["call"], "conv_state"))
        for slot, n in zip(st["slots"], st["accepted"]):
            if slot != PAD_SLOT_ID and n == 1:
                assert rows[slot][-1] == "over: left unchanged, but this step should write it", rows[slot]
        # at the verify, which writes no slot, the spoiled slots are wrong but carried, never flagged
        rows = slot_rows(tensor_section(doc, nxt["call"], "conv_state"))
        assert {s for s, r in rows.items() if r[-1].startswith("over:")} == spoiled
        assert all(r[-1] == "over: carried from an earlier step, this one left it unchanged"
                   for s, r in rows.items() if s in spoiled)
    else:
        st = next(s for s in steps if s["op"] == "prefix_snapshots")
        d, s, o = min(zip(st["snap_slot"], st["snap_seq"], st["snap_offset"]))
        assert f"pool slot {d} (snapshot of sequence {s} at offset {o})" in text, text
