"""Failing runs to report on: meta mutants (conformance/meta/mutants.py) driven through the same
run + verify path as an outside port, on a few small cases (built once per test process)."""

from __future__ import annotations

import logging

import pytest

from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.fixtures.manifest import DEFAULT_DIR

MUTANTS = "gdncheck.conformance.meta.mutants"
#: tiled heads fail the first two (Hk=2, r>1) from delta_rule on, and cannot show in the Hk=1 case;
#: the expected-error case passes: a report with failing, passing and error-kind rows
TILED_CASES = ["dk-gt-dv_T63_Hk2_Hv6", "decode_T12_Hk2_Hv4", "prefill_T1_Hk1_Hv1", "error-head-ratio"]


class Run:
    def __init__(self, fixtures, outputs, summary):
        self.fixtures, self.outputs, self.summary = fixtures, outputs, summary
        self.doc = summary.to_json()


def mutant_run(tmp_path_factory, mutant: str, cases: list[str], profile: str = "bf16") -> Run:
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    out = tmp_path_factory.mktemp(mutant)
    run_impl(f"{MUTANTS}:{mutant}", DEFAULT_DIR, out, profile, cases=cases,
             command=f"gdncheck run {MUTANTS}:{mutant} --out {out} --profile {profile}")
    return Run(DEFAULT_DIR, out, verify(DEFAULT_DIR, out, profile, cases=cases))


@pytest.fixture(scope="session")
def tiled(tmp_path_factory) -> Run:
    """head_grouping_tiled on four cases: two fail from delta_rule on, two pass."""
    return mutant_run(tmp_path_factory, "head_grouping_tiled", TILED_CASES)


@pytest.fixture(scope="session")
def tiled_report(tiled, tmp_path_factory):
    from gdncheck.reports import write_report

    return write_report(tiled.doc, tmp_path_factory.mktemp("report") / "site")


def tensor_counts(prefixes, from_stage: str) -> tuple[int, int]:
    """(tensors of the cases named by ``prefixes`` at or after ``from_stage`` in pipeline order, every
    tensor verify judges for them: each call's expected list plus its seq_len), from the manifest:
    a mutant wrong from a stage on fails exactly the former (counted here, not by the report)."""
    import json

    from gdncheck.stages import stage_index, stage_of

    cases = json.loads((DEFAULT_DIR / "manifest.json").read_text())["cases"]
    failing = total = 0
    for c in cases:
        if not c["id"].startswith(tuple(prefixes)):
            continue
        for step in c["program"]:
            if step["op"] in ("forward", "decode"):
                total += len(step["expected"]) + 1
                failing += sum(stage_index(stage_of(t)) >= stage_index(from_stage) for t in step["expected"])
    return failing, total


def calls_expecting(prefixes, name: str) -> int:
    """How many calls of the cases named by ``prefixes`` expect tensor ``name`` (manifest)."""
    import json

    cases = json.loads((DEFAULT_DIR / "manifest.json").read_text())["cases"]
    return sum(name in step.get("expected", ()) for c in cases if c["id"].startswith(tuple(prefixes))
               for step in c["program"] if step["op"] in ("forward", "decode"))


#: the cases head_grouping_tiled fails (Hk = 2, r > 1), from delta_rule on
TILED_FAILING = TILED_CASES[:2]


SERVING_MUTANTS = "gdncheck.conformance.meta.serving_mutants"
#: the committed serving cases (docs/serving.md): mixed prefill/decode with a padding sequence,
#: speculative verify + commit, prefix snapshots at and between chunk boundaries
PACKED_CASE = "packed-mixed_T67_Hk2_Hv4_dk16_dv16_s0"
SERVING_CASES = [PACKED_CASE, "spec-decode_T38_Hk2_Hv4_dk16_dv16_s0", "prefix-cache_T150_Hk2_Hv4_dk16_dv16_s0"]


def serving_run(tmp_path_factory, impl: str, cases: list[str], profile: str = "bf16") -> Run:
    """``impl`` (a built-in, or a serving mutant by name) run and verified on serving cases."""
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    spec = impl if impl in ("reference", "triton") else f"{SERVING_MUTANTS}:{impl}"
    out = tmp_path_factory.mktemp(impl)
    run_impl(spec, DEFAULT_DIR, out, profile, cases=cases, command=f"gdncheck run {spec} --out {out}")
    return Run(DEFAULT_DIR, out, verify(DEFAULT_DIR, out, profile, cases=cases))


@pytest.fixture(scope="session")
def leak(tmp_path_factory) -> Run:
    """conv_window_leaks on the mixed packed case: each sequence's conv window starts from the tail of
    the sequence before it in the stream."""
    return serving_run(tmp_path_factory, "conv_window_leaks", [PACKED_CASE])


@pytest.fixture(scope="session")
def leak_report(leak, tmp_path_factory):
    from gdncheck.reports import write_report

    return write_report(leak.doc, tmp_path_factory.mktemp("leak-report") / "site")


SHARDING_MUTANTS = "gdncheck.conformance.meta.sharding_mutants"
#: the uneven TP 3 case (the padding mutant fails it at rank 0's out_proj partial) and the even TP 2 (it passes)
SHARDED_CASES = ["tp3-uneven_T10_Hk2_Hv6_dk16_dv16_s0", "tp2_T15_Hk2_Hv4_dk16_dv16_s0"]


@pytest.fixture(scope="session")
def sharded(tmp_path_factory) -> Run:
    """padding_head_leaks (docs/sharding.md, "Padded ranks") on two tensor-parallel cases, judged rank by rank:
    tp3-uneven fails at rank 0's out_proj partial, tp2 (no padding) passes."""
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    spec = f"{SHARDING_MUTANTS}:padding_head_leaks"
    out = tmp_path_factory.mktemp("padding")
    run_impl(spec, DEFAULT_DIR, out, "bf16", cases=SHARDED_CASES, command=f"gdncheck run {spec} --out {out}")
    return Run(DEFAULT_DIR, out, verify(DEFAULT_DIR, out, "bf16", cases=SHARDED_CASES))


@pytest.fixture(scope="session")
def sharded_report(sharded, tmp_path_factory):
    from gdncheck.reports import write_report

    return write_report(sharded.doc, tmp_path_factory.mktemp("sharded-report") / "site")
