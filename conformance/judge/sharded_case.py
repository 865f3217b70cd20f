"""``verify`` on a sharded case (fixtures/FORMAT.md §4.2, §7.1; docs/sharding.md): every rank's file
``{case}.rank{r}.safetensors`` against its share of the goldens (:mod:`.sharded`), each stage bounded by
the scale of the whole tensor at the profile's bound for that tensor (the tolerance table's ``elem``), and
each share's NMSE (its mean squared error over the whole tensor's mean square) by the table's ``nmse``.

A rank file that is missing fails the case (never a pass); so does a rank file of a rank the plan does
not have, a rank holding tokens or heads outside its share (a shape other than its share's), and every
tensor over its bound, each failure naming the rank, the call or segment and its tokens, the heads or
channels and the stage.

In stage-isolated mode (a stage-isolated context-parallel port, fed the goldens' stage inputs: fla's
``fla.ops.cp``) a context-parallel case's segments are judged on the call's stage tensors the ranks wrote
(:data:`ISOLATED_CP_STAGES`; each on every segment, at the stage-isolated bounds), not on halos and summaries
they do not expose; ranks that wrote none of them fail the case.
"""

from __future__ import annotations

import re

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.errors import GDNError
from gdncheck.fixtures.manifest import safe_file
from gdncheck.harness import END_TO_END, call_steps
from gdncheck.harness.sharded import plan_of, shard_step
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import stage_index, stage_of
from gdncheck.untrusted import safe_text

from .records import FirstDivergence, Record
from .sharded import CP_STAGES, TP_STAGES, TPCP_STAGES, judge_cp, judge_tp, judge_tpcp

#: the tensor of the tolerance table (and of a record) each sharded stage is judged as
TENSOR_OF = {"attn_out_partial": "attn_out", "halo": "conv_state", "summary": "recurrent_state",
             "entry_state": "recurrent_state", **{s: s for s in TP_STAGES if s != "attn_out_partial"}, "out": "out"}
#: the call's stage tensors a stage-isolated context-parallel rank may write per segment, in the order they run
ISOLATED_CP_STAGES = ("qkv", "qkv_conv", "g", "beta", "core", "core_gated", "out")
#: a rank's file may hold at most this many tensors (an untrusted file: bounded work)
_MAX_TENSORS = 100_000


def rank_file_name(case: str, rank: int) -> str:
    return f"{case}.rank{rank}.safetensors"


#: a context-parallel stage ordered as the stage that reads it (the halo the conv, the entry state and the
#: summary the delta rule), so that the first failure said is the earliest exchange that went wrong
_READ_BY = {"halo": "qkv_conv", "summary": "core", "entry_state": "core"}


def _record(cj, step: int, op: str, call: int | None, stage: str, verdict: str, message: str | None,
            failure=None, figures: dict | None = None) -> Record:
    tensor = TENSOR_OF[stage]
    st = stage_of(tensor)
    order = stage_index(stage_of(_READ_BY[stage])) if stage in _READ_BY else stage_index(st)
    return Record(case=cj.case, step=step, op=op, call=call, tensor=tensor, stage=st, stage_index=order,
                  verdict=verdict, reason=None if verdict == "pass" else "sharded", message=message,
                  shard=getattr(failure, "shard", None) if figures is None else figures)


def _worst(figures: list[dict]) -> dict | None:
    """A passing stage's record figures: its worst rank's (largest error over either bound), with ``of_ranks``,
    how many ranks were compared there."""
    if not figures:
        return None

    def ratio(f):
        return max(f["max_err"] / f["elem_bound"] if f["elem_bound"] > 0 else 0.0,
                   f["nmse"] / f["nmse_bound"] if f["nmse_bound"] > 0 else 0.0)

    return {**max(figures, key=ratio), "of_ranks": len(figures)}


def judge_sharded(cj) -> None:
    """Judge a sharded case's rank files into ``cj.report.records`` (a :class:`~.case.CaseJudge`)."""
    entry, program = cj.entry, cj.entry["program"]
    cfg = GDNConfig.from_hf(dict(entry["config"]))
    kind, plan, cp_call = plan_of(shard_step(program), cfg)
    at = {s["call"]: (i, s["op"]) for i, s in enumerate(program) if s.get("op") in (
        "forward", "decode", "forward_packed", "prefix_snapshots", "verify_spec", "forward_mixed", "commit")}
    shard_at = program.index(shard_step(program))
    ranks, problems = [], []
    for r in range(plan.world):
        tensors, problem = _read_rank(cj, r)
        ranks.append(tensors)
        if problem:
            problems.append(problem)
    for name in _stray_ranks(cj, plan.world):
        problems.append(f"{name}: a rank file of a rank the plan does not have (world {plan.world})")
    for p in problems:
        stage = "out" if kind == "cp" else "attn_out"
        cj.report.records.append(_record(cj, shard_at, "shard", None, stage, "fail", safe_text(p)))
    isolated = cj.stage_isolated and kind == "cp"
    mode = cj.bound_mode if isolated else END_TO_END
    bounds = {s: cj.table.bound(TENSOR_OF[s], cj.profile, mode, cj.case)
              for s in (*TP_STAGES, *CP_STAGES, *TPCP_STAGES, "out")}
    bound, nmse_bound = {s: b.elem for s, b in bounds.items()}, {s: b.nmse for s, b in bounds.items()}
    measured: dict = {}  # (call or segment, stage) -> each compared rank's figures
    if kind == "tp":
        goldens = []
        for step in call_steps(program):
            k = step["call"]
            goldens.append({n: np.asarray(cj.gold.read(f"calls.{k}.{n}"), dtype=np.float64)
                            for n in (*TP_STAGES, "out") if f"calls.{k}.{n}" in cj.gold})
        weights = {n[len("weights."):]: cj.gold.read(n) for n in cj.gold if n.startswith("weights.")}
        failures, judged = judge_tp(cfg, plan, ranks, goldens, bound=bound, weights=weights,
                                    nmse_bound=nmse_bound, profile=cj.profile, measured=measured)
        stages, where = TP_STAGES, {k: at[k] for k in at}
        judged_keys = [(step["call"], s) for step in call_steps(program) for s in TP_STAGES
                       if s in goldens[step["call"]] or s == "attn_out_partial"]
    elif isolated:
        written = {n.split(".", 2)[2] for r in ranks for n in r if n.startswith("segments.") and n.count(".") >= 2}
        stages = tuple(s for s in ISOLATED_CP_STAGES if s in written and f"calls.{cp_call}.{s}" in cj.gold)
        if not stages:  # a run that judged nothing never passes
            problems.append(f"no rank wrote a stage tensor of the call ({', '.join(ISOLATED_CP_STAGES)}) for any "
                            "segment: nothing to judge (stage-isolated context parallelism)")
            cj.report.records.append(_record(cj, shard_at, "shard", None, "out", "fail", problems[-1]))
        trace = {s: np.asarray(cj.gold.read(f"calls.{cp_call}.{s}"), dtype=np.float64) for s in stages}
        failures, judged = judge_cp(cfg, plan, ranks, trace, None, bound=bound, stages=stages,
                                    nmse_bound=nmse_bound, measured=measured) if stages else ([], 0)
        where = {i: at[cp_call] for i in range(len(plan.segments))}
        judged_keys = [(i, s) for i in range(len(plan.segments)) for s in stages]
    else:
        cp = plan if kind == "cp" else plan.cp
        T = cp.T
        states: list = [None] * (T + 1)
        for t in range(T + 1):
            if f"shard.{t}.conv_state" in cj.gold:
                states[t] = (np.asarray(cj.gold.read(f"shard.{t}.conv_state"), dtype=np.float64),
                             np.asarray(cj.gold.read(f"shard.{t}.recurrent_state"), dtype=np.float64))
        if kind == "cp":
            trace = {"out": np.asarray(cj.gold.read(f"calls.{cp_call}.out"), dtype=np.float64)}
            failures, judged = judge_cp(cfg, plan, ranks, trace, states, bound=bound, nmse_bound=nmse_bound,
                                        measured=measured)
            stages = CP_STAGES
        else:  # each rank's share (its heads on its tokens), FORMAT.md §4.2
            trace = {n: np.asarray(cj.gold.read(f"calls.{cp_call}.{n}"), dtype=np.float64)
                     for n in ("core_gated", "attn_out")}
            weights = {n[len("weights."):]: cj.gold.read(n) for n in cj.gold if n.startswith("weights.")}
            failures, judged = judge_tpcp(cfg, plan, ranks, trace, states, bound=bound, weights=weights,
                                          nmse_bound=nmse_bound, measured=measured)
            stages = TPCP_STAGES
        where = {i: at[cp_call] for i in range(len(cp.segments))}
        judged_keys = [(i, s) for i in range(len(cp.segments)) for s in stages]
    failed = {(f.where, f.stage) for f in failures}
    for f in failures:
        step, op = where.get(f.where, (shard_at, "shard"))
        cj.report.records.append(_record(cj, step, op, f.where if kind == "tp" else cp_call, f.stage, "fail",
                                         safe_text(f.message), f))
    for w, s in judged_keys:
        if (w, s) not in failed:
            step, op = where.get(w, (shard_at, "shard"))
            cj.report.records.append(_record(cj, step, op, w if kind == "tp" else cp_call, s, "pass", None,
                                             figures=_worst(measured.get((w, s), []))))
    if failures or problems:
        first = problems[0] if problems else failures[0].message
        cj.report.diagnosis = {"verdict": "none", "text": safe_text(first), "tensor": None, "call": None}
    del stages, judged


def _read_rank(cj, r: int) -> tuple[dict, str | None]:
    name = rank_file_name(cj.case, r)
    try:
        path = safe_file(cj.outputs, name, "outputs file")
        if not path.is_file():
            return {}, f"rank {r}: no rank file {name} in {cj.outputs} (every rank of the plan writes one)"
        f = SafetensorsFile(path)
        if f.metadata.get("case") not in (None, cj.case):
            return {}, f"rank {r}: {name} holds case {str(f.metadata.get('case'))[:80]!r}"
        keys = list(f)[:_MAX_TENSORS]
        return {k: np.asarray(f.read(k), dtype=np.float64) for k in keys}, None
    except (GDNError, OSError, ValueError) as exc:
        return {}, f"rank {r}: {name} unusable: {exc}"


def _stray_ranks(cj, world: int) -> list[str]:
    pattern = re.compile(re.escape(cj.case) + r"\.rank([0-9]{1,6})\.safetensors")
    out = []
    try:
        for p in sorted(cj.outputs.iterdir()):
            m = pattern.fullmatch(p.name)
            if m and int(m.group(1)) >= world:
                out.append(p.name)
    except OSError:
        return []
    return out


__all__ = ["FirstDivergence", "judge_sharded", "rank_file_name"]
