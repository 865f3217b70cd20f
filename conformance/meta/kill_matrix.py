"""The kill matrix: every mutant, in every profile, through the same ``run`` + ``verify`` path as a
port; where verify first catches it and by how much.

    python -m gdncheck.conformance.meta [--profiles f32,bf16,f16] [--fixtures DIR] [--write-docs docs/meta.md]

The **margin** of a record is its worst error over its bound, ``max(max_err / elem, nmse / nmse)``
(infinite for NaN, an unmatched infinity or a dtype, shape or missing-tensor failure). A mutant's
cell reports the first stage verify flags, its margin there (the largest over the records of its
own stage: how far past rounding the bug is where it starts), the number of cases that fail, and,
for a bug that is harmless in realistic regimes (``edge_only``), the worst margin over the
realistic cases (which must stay below 1).
"""

from __future__ import annotations

import functools
import logging
import math
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gdncheck.conformance.judge.records import FirstDivergence, Record, Summary
from gdncheck.conformance.judge.verify import verify
from gdncheck.conformance.ports.run import run_impl
from gdncheck.env import limit_blas_threads
from gdncheck.fixtures.cases import REALISTIC
from gdncheck.fixtures.manifest import DEFAULT_DIR, load_manifest
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.stages import stage_rank

from .moe_mutants import MOE_MUTANTS, tagged_cases
from .mutants import MUTANTS, Mutant
from .serving_mutants import SERVING_MUTANTS

#: Every mutant the matrix runs: the dense layer's, then the sparse block's and the serving patterns'
#: (run on their tagged cases).
CATALOGUE: tuple[Mutant, ...] = MUTANTS + MOE_MUTANTS + SERVING_MUTANTS

#: The margin a mutant must beat at its own stage wherever its effect exceeds rounding.
GOAL = 10.0

#: The placements a mutant runs in as the diagnosed "port": never the catalogue's (``hf``), so that the
#: diagnosis has to see through another engine's roundings, as it must for a real port. The first
#: (:data:`PORT_PLACEMENT`) gives the per-mutant table; every one a row of the accuracy table.
PORT_PLACEMENTS = ("fp32_once", "fla", "metrale")
PORT_PLACEMENT = PORT_PLACEMENTS[0]
#: How a diagnosis of a mutant's failing case is counted (:func:`judged_as`).
OUTCOMES = ("right", "ambiguous", "symptom", "silent", "wrong")


def record_margin(rec: Record) -> float:
    """Worst error over bound of one record (module docstring); 0 for a record with nothing judged."""
    if rec.verdict == "fail" and rec.reason == "sharded":  # a rank's share: missing or misshapen is infinite
        s = rec.shard
        if not s:
            return math.inf
        return max(s["max_err"] / s["elem_bound"] if s["elem_bound"] > 0 else math.inf,
                   s["nmse"] / s["nmse_bound"] if s["nmse_bound"] > 0 else 0.0)
    if rec.verdict == "fail" and rec.reason not in ("elem_bound", "nmse_bound"):
        return math.inf
    m, b = rec.metrics, rec.bound
    if not m or not b:
        return 0.0
    ratios = [float(m["max_err"]) / b["elem"] if b["elem"] > 0 else math.inf,
              float(m["nmse"]) / b["nmse"] if b["nmse"] > 0 else math.inf]
    return max(0.0 if math.isnan(r) else r for r in ratios)


@dataclass
class KillResult:
    mutant: str
    profile: str
    killed: bool
    first_stage: str | None
    cases_failed: int
    cases: int
    stage_margin: float = 0.0  # the largest margin over the records of the mutant's own stage
    margin: float = 0.0  # the largest margin over every record
    realistic_margin: float = 0.0  # the largest margin over the records of realistic cases
    first_by_case: dict[str, FirstDivergence] = field(default_factory=dict)
    margin_case: str | None = None  # the case of the stage margin
    first_bad_token: dict[str, int] = field(default_factory=dict)  # case -> first token over a bound (own stage)
    message: str | None = None
    repro: str | None = None
    summary: Summary | None = None
    diagnosed: int = 0  # failing cases of the mutant run as a port that got a diagnosis
    named_right: int = 0  # ... whose likely cause is this mutant's bug class
    named_other: dict[str, int] = field(default_factory=dict)  # what the others were named (None: no match)
    #: per port placement: {"right", "ambiguous", "silent", "wrong": count} over the failing cases
    #: diagnosed (:func:`judged_as`), and what the wrong ones named
    accuracy: dict[str, dict[str, int]] = field(default_factory=dict)
    wrongly_named: dict[str, dict[str, int]] = field(default_factory=dict)

    def diagnosis_cell(self) -> str:
        if not self.diagnosed:
            return "-"
        others = ", ".join(f"{k} {v}" for k, v in sorted(self.named_other.items(), key=lambda kv: -kv[1]))
        return f"{self.named_right}/{self.diagnosed}" + (f" (else: {others})" if others else "")

    def cell(self) -> str:
        if not self.cases:
            return "no case"
        if not self.killed:
            return f"below rounding (×{self.margin:.2g})"
        m = "∞" if math.isinf(self.stage_margin) else f"{self.stage_margin:.2g}"
        return f"{self.first_stage} ×{m} ({self.cases_failed}/{self.cases})"


def kill(mutant: Mutant, profile: str, fixtures_dir=DEFAULT_DIR, out_dir=None, cases=None,
         tolerances=None, stage_isolated: bool = False, diagnose=None) -> KillResult:
    """Run ``mutant`` over the cases in ``profile`` (end to end, or every stage alone from golden
    inputs) and verify its outputs (with ``tolerances``: a table path, default the packaged one;
    ``diagnose``: verify's likely-cause hook). A mutant with ``case_tags`` (the sparse block's) runs
    on the cases carrying them by default; with none in the suite it is not run (``cases`` 0, cell
    "no case")."""
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    cases = cases_of(mutant, fixtures_dir, cases)
    if cases == []:
        return KillResult(mutant.name, profile, False, None, 0, 0,
                          message=f"no case tagged {', '.join(mutant.case_tags)} in {fixtures_dir}")
    iso = " --stage-isolated" if stage_isolated else ""
    with tempfile.TemporaryDirectory(prefix=f"gdncheck-mutant-{mutant.name}-") as tmp:
        out = Path(out_dir) if out_dir else Path(tmp)
        run_impl(mutant.factory, fixtures_dir, out, profile, cases=cases, stage_isolated=stage_isolated,
                 command=f"gdncheck run {module_of(mutant)}:{mutant.name} --fixtures {fixtures_dir} "
                         f"--out {out} --profile {profile}{iso}")
        summary = verify(fixtures_dir, out, profile, cases=cases, tolerances=tolerances, stage_isolated=stage_isolated,
                         diagnose=diagnose)
    return result_of(mutant, profile, summary, fixtures_dir)


def cases_of(mutant: Mutant, fixtures_dir, cases=None) -> list[str] | None:
    """The cases ``mutant`` runs on: ``cases`` if given, else those carrying its ``case_tags`` (the
    sparse block's mutants; ``[]`` when the suite has none), else every case (None)."""
    tags = getattr(mutant, "case_tags", ())
    if cases is None and tags:
        return tagged_cases(fixtures_dir, tags)
    return cases


def module_of(mutant: Mutant) -> str:
    """Where ``mutant``'s plug-in factory lives (``gdncheck run MODULE:NAME``)."""
    return getattr(mutant, "module", "gdncheck.conformance.meta.mutants")


def result_of(mutant: Mutant, profile: str, summary: Summary, fixtures_dir=DEFAULT_DIR) -> KillResult:
    """The kill-matrix cell of a verify summary of ``mutant``'s outputs."""
    regimes = {c["id"]: c.get("regime", REALISTIC) for c in load_manifest(fixtures_dir)["cases"]}
    failing = [c for c in summary.cases if c.status == "fail"]
    first_by_case = {c.id: c.first_divergence for c in failing}
    stages = [fd.stage for fd in first_by_case.values() if fd and fd.stage]
    first = min(stages, key=stage_rank) if stages else None
    earliest = next((c for c in failing if c.first_divergence and c.first_divergence.stage == first), None)
    r = KillResult(mutant.name, profile, bool(failing), first, len(failing), len(summary.cases),
                   first_by_case=first_by_case,
                   message=earliest.message if earliest else None, repro=earliest.repro if earliest else None,
                   summary=summary)
    for c in summary.cases:
        for rec in c.records:
            m = record_margin(rec)
            r.margin = max(r.margin, m)
            if regimes.get(c.id, REALISTIC) == REALISTIC:
                r.realistic_margin = max(r.realistic_margin, m)
            if rec.stage == mutant.stage and m > r.stage_margin:
                r.stage_margin, r.margin_case = m, c.id
            if rec.stage == mutant.stage and rec.first_bad_token is not None and rec.verdict == "fail":
                t = r.first_bad_token.get(c.id)
                r.first_bad_token[c.id] = rec.first_bad_token if t is None else min(t, rec.first_bad_token)
    return r


def matrix(profiles=VERIFY_PROFILES, fixtures_dir=DEFAULT_DIR, mutants=CATALOGUE, tolerances=None, cases=None,
           diagnose: bool = True, progress=None, jobs: int = 1, diagnose_cases=None,
           placements=PORT_PLACEMENTS) -> list[KillResult]:
    """Every mutant in every profile; with ``diagnose``, also the likely cause verify names for each
    failing case of each mutant run as a port in each of ``placements`` (:func:`diagnose_all`; on
    ``diagnose_cases`` if given, else on the same cases). ``jobs`` processes run the mutants of a
    profile side by side."""
    results = []
    mutants = list(mutants)
    for p in profiles:
        with tempfile.TemporaryDirectory(prefix="gdncheck-kill-matrix-") as tmp, \
                ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
            dirs = {m.name: Path(tmp) / m.name for m in mutants}
            kills = [pool.submit(_kill_job, m.name, p, str(fixtures_dir), str(dirs[m.name]), cases, tolerances)
                     for m in mutants]
            row = []
            for f in kills:
                row.append(f.result())
                if progress and not diagnose:
                    progress(row[-1])
            if diagnose:
                todo = [pool.submit(_diagnose_job, r, m.name, p, str(fixtures_dir), dirs,
                                    str(Path(tmp) / f"port-{m.name}"), diagnose_cases or cases, tolerances,
                                    tuple(placements))
                        for r, m in zip(row, mutants) if r.cases]  # a mutant not run has nothing to diagnose
                done = {r.mutant: r for r in (f.result() for f in todo)}
                row = [done.get(r.mutant, r) for r in row]
                if progress:
                    for r in row:
                        progress(r)
            results += row
    return results


def _by_name(name: str) -> Mutant:
    return next(m for m in CATALOGUE if m.name == name)


def _kill_job(name, profile, fixtures_dir, out_dir, cases, tolerances) -> KillResult:
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    limit_blas_threads()
    r = kill(_by_name(name), profile, fixtures_dir, out_dir=out_dir, cases=cases, tolerances=tolerances)
    r.summary = None  # records of every case: not needed past the cell, and heavy to send back
    return r


def _diagnose_job(r: KillResult, name, profile, fixtures_dir, dirs, out, cases, tolerances,
                  placements=None) -> KillResult:
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    limit_blas_threads()
    for i, placement in enumerate(placements or PORT_PLACEMENTS):
        diagnose_all(r, _by_name(name), profile, fixtures_dir, dirs, Path(f"{out}-{placement}"), cases, tolerances,
                     placement=placement, primary=i == 0)
    return r


#: The transforms of the diagnosis (an error's shape read off the expected tensor alone) that describe
#: a mutant's bug exactly: matching one names that bug.
TRANSFORM_OF = {"heads_tiled": {"head_grouping_tiled", "state_heads_tiled", "converter_ab_heads_tiled"},
                "state_transposed": {"state_transposed"}, "uniform_scale": {"scale_doubled", "qk_norm_rms_form"}}


def judged_as(diagnosis: dict, mutant: Mutant) -> str:
    """``right``: it matches the mutant's bug class (the mutant, another of its class, or a transform
    that is that bug, :data:`TRANSFORM_OF`); ``ambiguous``: named among equals, the mutant's class one of
    them; ``symptom``: a transform of the expected tensor that describes the error's shape (a scale, a
    shift, a sign) but is not this bug; ``silent``: "no known bug class matches"; ``wrong``: it names
    another class alone, or an ambiguity the mutant's class is not part of."""
    verdict = diagnosis.get("verdict")
    if verdict == "none":
        return "silent"
    itself = (diagnosis.get("candidate") == mutant.name or diagnosis.get("bug_class") == mutant.bug_class
              or mutant.name in TRANSFORM_OF.get(diagnosis.get("candidate"), ()))
    if verdict == "matches" and itself:
        return "right"
    if verdict == "matches" and diagnosis.get("source") == "transform":
        return "symptom"
    if verdict == "ambiguous" and (itself or mutant.bug_class in diagnosis.get("alternatives", ())):
        return "ambiguous"
    return "wrong"


def diagnose_all(r: KillResult, mutant: Mutant, profile: str, fixtures_dir, dirs: dict[str, Path], out: Path,
                 cases=None, tolerances=None, placement: str = PORT_PLACEMENT, primary: bool = True) -> None:
    """Run ``mutant`` as a port in ``placement`` and count how its failing cases' likely causes judge it
    (:func:`judged_as`), given the catalogue's outputs in ``dirs`` (every mutant, placement hf);
    ``primary``: also the per-mutant counts (``diagnosed``, ``named_right``, ``named_other``)."""
    from .catalogue import mutant_diagnoser  # the catalogue runs verify's diagnosis: imported when used

    cases = cases_of(mutant, fixtures_dir, cases)
    factory = functools.partial(mutant.factory, placement=placement)
    run_impl(factory, fixtures_dir, out, profile, cases=cases,
             command=f"gdncheck run {module_of(mutant)}:{mutant.name} --option placement="
                     f"{placement} --fixtures {fixtures_dir} --out {out} --profile {profile}")
    summary = verify(fixtures_dir, out, profile, cases=cases, tolerances=tolerances,
                     diagnose=mutant_diagnoser(fixtures_dir, limit=None, outputs=dirs))
    tally = r.accuracy.setdefault(placement, dict.fromkeys(OUTCOMES, 0))
    wrong = r.wrongly_named.setdefault(placement, {})
    for c in summary.cases:
        d = c.diagnosis
        if c.status != "fail" or not d or d.get("verdict") not in ("matches", "ambiguous", "none"):
            continue
        outcome = judged_as(d, mutant)
        tally[outcome] += 1
        if outcome == "wrong":
            wrong[str(d.get("candidate"))] = wrong.get(str(d.get("candidate")), 0) + 1
        if not primary:
            continue
        r.diagnosed += 1
        if outcome == "right":
            r.named_right += 1
        else:
            named = {"silent": "None", "ambiguous": "ambiguous"}.get(outcome, str(d.get("candidate")))
            r.named_other[named] = r.named_other.get(named, 0) + 1


def format_matrix(results: list[KillResult], profiles=VERIFY_PROFILES, mutants=CATALOGUE) -> str:
    """A markdown table: mutant (bug class), expected first stage, the edge case built for it, then per
    profile the first stage caught, the margin there and the failing cases (and, for an edge-only bug,
    the worst margin over the realistic cases, which must stay below 1)."""
    by = {(r.mutant, r.profile): r for r in results}
    lines = ["| mutant (bug class) | expected first stage | edge case | " + " | ".join(profiles) + " |",
             "|---|---|---|" + "---|" * len(profiles)]
    for m in mutants:
        if not any((m.name, p) in by for p in profiles):
            continue
        cells = []
        for p in profiles:
            r = by.get((m.name, p))
            if r is None:
                cells.append("-")
                continue
            cell = r.cell()
            if m.edge_only:
                cell += f"; realistic ×{r.realistic_margin:.2g}"
            cells.append(cell)
        where = f" (first at call {m.call[1]} of {m.call[0]})" if m.call else ""
        edge = f"`{m.edge}`" + (" (edge only)" if m.edge_only else "") if m.edge else "-"
        lines.append(f"| `{m.name}` ({m.bug_class}) | {m.stage}{where} | {edge} | " + " | ".join(cells) + " |")
    if any(r.diagnosed for r in results):
        lines += ["", "The likely cause verify names for each failing case of the mutant run as a port in placement "
                  f"`{PORT_PLACEMENT}` (cases naming this mutant / cases diagnosed; what the others named):", "",
                  "| mutant | " + " | ".join(profiles) + " |", "|---|" + "---|" * len(profiles)]
        for m in mutants:
            if any((m.name, p) in by for p in profiles):
                lines.append(f"| `{m.name}` | " + " | ".join(by[(m.name, p)].diagnosis_cell() if (m.name, p) in by
                                                              else "-" for p in profiles) + " |")
        lines += ["", accuracy_table(results, profiles)]
    return "\n".join(lines)


def accuracy_table(results: list[KillResult], profiles=VERIFY_PROFILES) -> str:
    """How the likely cause judges the catalogue run as ports, per port placement and profile: of the
    failing cases diagnosed, how many it names right, ambiguous (the mutant's class among equals),
    silent ("no known bug class matches"), wrong (another class; which mutants, named as what)."""
    placements = list(dict.fromkeys(pl for r in results for pl in r.accuracy))
    lines = ["The likely cause over the whole catalogue run as ports in each placement (failing cases "
             "diagnosed; right: the mutant's bug class; ambiguous: named among equals, the mutant's class "
             "one of them; symptom: the error's shape (a scale, a shift, a sign), not the bug; silent: no "
             "known bug class matches; wrong: another class):", "",
             "| placement | profile | diagnosed | right | ambiguous | symptom | silent | wrong "
             "| wrong: mutant (named) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for pl in placements:
        for p in profiles:
            row = [r for r in results if r.profile == p and pl in r.accuracy]
            if not row:
                continue
            n = {k: sum(r.accuracy[pl][k] for r in row) for k in OUTCOMES}
            total = sum(n.values())
            which = "; ".join(f"{r.mutant} ({', '.join(f'{k} {v}' for k, v in sorted(r.wrongly_named[pl].items()))})"
                              for r in row if r.wrongly_named.get(pl)) or "-"
            cells = " | ".join(f"{n[k]} ({100 * n[k] / total:.0f}%)" if total else "0" for k in OUTCOMES)
            lines.append(f"| `{pl}` | {p} | {total} | {cells} | {which} |")
    return "\n".join(lines)


BEGIN, END = "<!-- kill-matrix: begin (python -m gdncheck.conformance.meta --write-docs docs/meta.md) -->", \
    "<!-- kill-matrix: end -->"


def write_docs(path: str | Path, table: str) -> None:
    """Replace the generated block of ``path`` (between :data:`BEGIN` and :data:`END`) by ``table``."""
    p = Path(path)
    text = p.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{p} has no generated kill-matrix block ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    p.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def documented_block(path: str | Path) -> str:
    """The generated block of ``path`` (what :func:`write_docs` wrote)."""
    text = Path(path).read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


# --- leave one class out (issue 42 item 2) ----------------------------------------------------------

#: How a held-out failing case's symptoms are counted (:func:`judge_symptoms`).
LOO_OUTCOMES = ("true", "silent", "wrong")


@dataclass
class LooResult:
    """One mutant's failing cases diagnosed with its own bug class removed from the catalogue."""

    mutant: str
    profile: str
    cases: int = 0  # failing cases diagnosed
    before: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOO_OUTCOMES, 0))
    after: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOO_OUTCOMES, 0))
    named_other: int = 0  # a class named alone (matches) with the mutant's own class removed
    wrong_facts: list[str] = field(default_factory=list)  # "case: code (text)"
    unverified: int = 0  # facts of kinds the mutant does not declare
    said: dict[str, int] = field(default_factory=dict)  # code -> how many cases stated it


def judge_symptoms(name: str, stage_right: bool, codes: list[str]) -> tuple[str, list[str]]:
    """``true``: the right stage and at least one true specific fact (truth.py); ``wrong``: any stated
    fact of a declared kind that is not true of the bug; else ``silent``. Also the wrong codes."""
    from .truth import judge_fact, specific

    verdicts = [(c, judge_fact(name, c)) for c in codes]
    wrong = [c for c, v in verdicts if v == "wrong"]
    if wrong:
        return "wrong", wrong
    if stage_right and any(v == "true" and specific(c) for c, v in verdicts):
        return "true", []
    return "silent", []


def _before_codes(d: dict) -> list[str]:
    """What today's diagnosis (before issue 42) stated as a fact: a transform it matched, read as the
    relation it is (a scale, a sign, a shift, a permutation, a transpose)."""
    to_code = {"uniform_scale": "relation:uniform_scale", "per_head_scale": "relation:per_head_scale",
               "sign_flip": "relation:sign", "state_transposed": "relation:transpose",
               "heads_tiled": "relation:head_perm", "heads_interleaved": "relation:head_perm",
               "token_late": "relation:shift_late", "token_early": "relation:shift_early"}
    closest = d.get("closest") or {}
    name = d.get("candidate") if d.get("source") == "transform" else closest.get("candidate") \
        if d.get("verdict") == "none" and closest.get("residual") is not None and closest["residual"] <= 0.2 else None
    return [to_code[name]] if name in to_code else []


def leave_one_out(profiles=("f32", "bf16"), fixtures_dir=DEFAULT_DIR, mutants=None, cases=None,
                  placement: str = PORT_PLACEMENT, progress=None, hold_out: bool = True) -> list[LooResult]:
    """For each mutant (default: the matrix's catalogue and the held-out ones), run it as a port in
    ``placement`` and diagnose its failing cases with a catalogue from which its own bug class is
    removed; count the symptoms (:func:`judge_symptoms`) and, as today's diagnosis would have read,
    the transform it named (``before``). ``hold_out`` False: the whole catalogue, and ``named_other``
    counts the confident wrong classes (a class named alone that is not the mutant's)."""
    from gdncheck.conformance.judge.diagnose import Diagnoser

    from .catalogue import ALL_MUTANTS, MutantCatalogue  # the catalogue runs verify's diagnosis
    from .heldout_mutants import HELDOUT_MUTANTS

    pool = tuple(dict.fromkeys((*ALL_MUTANTS, *HELDOUT_MUTANTS)))
    todo = list(mutants or (*CATALOGUE, *HELDOUT_MUTANTS))
    out = []
    for p in profiles:
        with tempfile.TemporaryDirectory(prefix="gdncheck-loo-") as tmp:
            dirs = {}
            for m in pool:
                cs = cases_of(m, fixtures_dir, cases)
                if cs == []:
                    continue
                dirs[m.name] = Path(tmp) / m.name
                run_impl(m.factory, fixtures_dir, dirs[m.name], p, cases=cs, command=f"catalogue {m.name}")
            for m in todo:
                cs = cases_of(m, fixtures_dir, cases)
                r = LooResult(m.name, p)
                if cs == []:
                    out.append(r)
                    continue
                port = Path(tmp) / f"port-{m.name}"
                run_impl(functools.partial(m.factory, placement=placement), fixtures_dir, port, p, cases=cs,
                         command=f"port {m.name}")
                held = tuple(x for x in pool if not hold_out or (x.bug_class != m.bug_class and x.name != m.name))
                summary = verify(fixtures_dir, port, p, cases=cs,
                                 diagnose=Diagnoser(MutantCatalogue(fixtures_dir, mutants=held, outputs=dirs)))
                for c in summary.cases:
                    d = c.diagnosis
                    if c.status != "fail" or not d or d.get("verdict") not in ("matches", "ambiguous", "none"):
                        continue
                    r.cases += 1
                    stage_right = bool(c.first_divergence and c.first_divergence.stage == m.stage)
                    facts = d.get("symptoms") or []
                    outcome, wrong = judge_symptoms(m.name, stage_right, [f["code"] for f in facts])
                    r.after[outcome] += 1
                    r.wrong_facts += [f"{c.id}: {f['code']} ({f['text']})" for f in facts if f["code"] in wrong]
                    from .truth import judge_fact
                    r.unverified += sum(judge_fact(m.name, f["code"]) == "unverified" for f in facts)
                    for f in facts:
                        r.said[f["code"]] = r.said.get(f["code"], 0) + 1
                    r.before[judge_symptoms(m.name, stage_right, _before_codes(d))[0]] += 1
                    r.named_other += d.get("verdict") == "matches" and (
                        d.get("source") == "mutant" if hold_out else judged_as(d, m) == "wrong")
                out.append(r)
                if progress:
                    progress(r)
    return out


def format_loo(results: list[LooResult], profiles=("f32", "bf16")) -> str:
    """The leave-one-class-out table: per profile, the held-out failing cases whose symptoms state a
    true specific fact, say nothing specific, or say something wrong, before -> after."""
    lines = ["| profile | mutants | failing cases | true specific fact (before -> after) | silent | wrong facts "
             "| a class named with its own removed |", "|---|---|---|---|---|---|---|"]
    for p in profiles:
        row = [r for r in results if r.profile == p and r.cases]
        n = sum(r.cases for r in row)
        if not n:
            continue
        b = {k: sum(r.before[k] for r in row) for k in LOO_OUTCOMES}
        a = {k: sum(r.after[k] for r in row) for k in LOO_OUTCOMES}
        def pct(x, n=n):
            return f"{x} ({100 * x / n:.0f}%)"

        lines.append(f"| {p} | {len(row)} | {n} | {pct(b['true'])} -> {pct(a['true'])} | {pct(b['silent'])} -> "
                     f"{pct(a['silent'])} | {b['wrong']} -> {a['wrong']} | {sum(r.named_other for r in row)} |")
    return "\n".join(lines)


# --- coverage depth (issue 44 item 2) ---------------------------------------------------------------
#: The fewest cases that must catch each bug class in every profile where it is visible, differing in
#: what they exercise (head layout, call lengths, regime, serving pattern).
DEPTH_GOAL = 3
#: Above this many catching cases a class's row gives counts, not names.
DEPTH_NAMES_UP_TO = 9


@dataclass(frozen=True)
class CaseTraits:
    """What a case exercises, from its manifest entry: its recipe's name, its head layout, its call
    lengths and its regime (realistic, edge, serving, sparse)."""

    name: str
    layout: str  # "Hk 2, Hv 6 (gva-3)", "Hk 3, Hv 3 (mha)"
    calls: str  # "61 | 1 | 1", packed calls as "[63+1+65+64] | ...", op names where not a forward
    regime: str

    @property
    def signature(self) -> tuple[str, str, str]:
        return (self.layout, self.calls, self.regime)


def case_traits(entry: dict) -> CaseTraits:
    """:class:`CaseTraits` of a manifest case entry."""
    import ast

    cfg = entry.get("config") or {}
    hk, hv = cfg.get("linear_num_key_heads", 0), cfg.get("linear_num_value_heads", 0)
    ratio = "mha" if hk == hv else f"gva-{hv // hk}" if hk else "?"
    program = entry.get("program") or []
    if isinstance(program, str):  # the manifest keeps a program's repr
        try:
            program = ast.literal_eval(program)
        except (ValueError, SyntaxError):
            program = []
    calls = []
    for step in program:
        op = step.get("op")
        if op in ("forward_packed", "forward_mixed", "verify_spec", "prefix_snapshots"):
            cu = step.get("cu_seqlens") or [0]
            lengths = [b - a for a, b in zip(cu, cu[1:])]
            mark = {"forward_packed": "", "forward_mixed": "mixed", "verify_spec": "verify",
                    "prefix_snapshots": "snap"}[op]
            calls.append(f"{mark}[{'+'.join(map(str, lengths))}]")
        elif op == "forward":
            calls.append(str(step.get("T")))
        elif op == "decode":
            calls.append(f"decode×{step.get('T')}")
        elif op in ("commit", "free", "snapshot", "restore", "save", "load", "reset"):
            calls.append(op)
    regime = str(entry.get("regime") or REALISTIC).split(":")[0]
    return CaseTraits(entry["id"].split("_T")[0], f"Hk {hk}, Hv {hv} ({ratio})", " | ".join(calls), regime)


@dataclass
class Depth:
    """One mutant's depth: per profile the cases that catch it (verify fails them), or None where it
    was not run; ``margin`` per profile, the worst ratio anywhere (what a class below rounding shows)."""

    mutant: str
    caught: dict[str, tuple[str, ...]] = field(default_factory=dict)
    margin: dict[str, float] = field(default_factory=dict)

    def visible(self) -> list[str]:
        """The profiles where at least one case catches it."""
        return [p for p, ids in self.caught.items() if ids]

    def count(self, profile: str) -> int | None:
        ids = self.caught.get(profile)
        return None if ids is None else len(ids)

    def depth(self) -> int:
        """The fewest catching cases over the profiles where the class is visible (0: visible nowhere)."""
        return min((len(self.caught[p]) for p in self.visible()), default=0)

    def distinct(self, traits: dict[str, CaseTraits]) -> int:
        """The fewest distinct (head layout, call lengths, regime) among the catching cases, over the
        profiles where it is visible: cases that exercise the same thing count once."""
        return min((len({traits[c].signature if c in traits else c for c in self.caught[p]}) for p in self.visible()),
                   default=0)


def depths(results: list[KillResult], mutants=CATALOGUE) -> dict[str, Depth]:
    """Per mutant (in ``mutants``' order), its :class:`Depth` from the kill matrix's results."""
    out = {m.name: Depth(m.name) for m in mutants}
    for r in results:
        d = out.get(r.mutant)
        if d is None:
            continue
        d.caught[r.profile] = tuple(sorted(r.first_by_case)) if r.cases else ()
        d.margin[r.profile] = r.margin
    return {k: v for k, v in out.items() if v.caught}


def _grouped(ids, traits: dict[str, CaseTraits]) -> str:
    """Case names grouped by head layout: ``Hk 2, Hv 4 (gva-2): decode, chunked; Hk 1, ...``."""
    groups: dict[str, list[str]] = {}
    for c in ids:
        t = traits.get(c)
        groups.setdefault(t.layout if t else "?", []).append(t.name if t else c)
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(groups.items()))


#: Where a class stays below :data:`DEPTH_GOAL` in a profile where it is visible, the measured reason
#: no more cases can catch it there (docs/meta.md, "Depth").
DEPTH_REASONS: dict[str, str] = {
    "decay_clamped": "f16: none can — after a full forget the clamp keeps 1e-6 of the state where the exact rule "
                     "keeps 7e-10 of it, both below float16's smallest normal (6.1e-5), under which the judge "
                     "scales no error: ×0.46 of the bounds on sigmoid-edges, ×0.36 on its two variants (measured; "
                     "'Reading it' above); caught in f32 and bf16",
}

#: The depth on the 74-case suite before issue 44's depth cases: the catching cases per profile of every
#: class below :data:`DEPTH_GOAL` in some profile there (the kill matrix of 2026-12-05 in docs/meta.md;
#: the ``prefill_as_verify_K`` mutants, new with the cases, run on that suite in f32, 2026-12-07).
DEPTH_BEFORE: dict[str, dict[str, int]] = {
    "bf16_recurrent_state": {"f32": 49, "bf16": 2, "f16": 42},
    "snapshot_aliases_state": {"f32": 1, "bf16": 1, "f16": 1},
    "per_head_norm_read_as_shared": {"f32": 1, "bf16": 1, "f16": 1},
    "beta_clamped_15": {"f32": 2, "bf16": 2, "f16": 2},
    "l2norm_eps_max": {"f32": 2, "bf16": 2, "f16": 2},
    "l2norm_eps_outside_sqrt": {"f32": 2, "bf16": 2, "f16": 2},
    "rmsnorm_eps_outside_sqrt": {"f32": 37, "bf16": 1, "f16": 1},
    "softplus_naive": {"f32": 30, "bf16": 2, "f16": 2},
    "gate_f16": {"f32": 49, "bf16": 2, "f16": 2},
    "decay_clamped": {"f32": 16, "bf16": 2, "f16": 0},
    "f16_recurrent_state": {"f32": 49, "bf16": 4, "f16": 1},
    "state_norm_clamp_1000": {"f32": 2, "bf16": 2, "f16": 2},
    "l2norm_eps_clamp_sum": {"f32": 2, "bf16": 2, "f16": 2},
    "state_bf16_write_back": {"f32": 49, "bf16": 1, "f16": 9},
    "softmax_after_topk": {"f32": 1, "bf16": 1, "f16": 1},
    "padding_slot_written": {"f32": 2, "bf16": 2, "f16": 2},
    "snapshot_chunk_late": {"f32": 2, "bf16": 2, "f16": 2},
    "commit_capped_4": {"f32": 1, "bf16": 1, "f16": 1},
    "mixed_plain_rows_from_zero": {"f32": 1, "bf16": 1, "f16": 1},
    "free_keeps_conv_state": {"f32": 2, "bf16": 2, "f16": 2},
    "prefill_as_verify_1": {"f32": 2},
    "prefill_as_verify_3": {"f32": 2},
    "prefill_as_verify_4": {"f32": 2},
}


def format_depth(results: list[KillResult], profiles=VERIFY_PROFILES, mutants=CATALOGUE, fixtures_dir=DEFAULT_DIR,
                 before=None, reasons=None, added=None) -> str:
    """Two markdown tables: per mutant and profile the cases that catch it and the depth (the fewest
    over the profiles where it is visible; in brackets, the fewest distinct in what they exercise),
    the catching cases named and grouped by head layout where there are few; then every class below
    :data:`DEPTH_GOAL` in some profile, now or in ``before`` ({mutant: {profile: count}}, default
    :data:`DEPTH_BEFORE`): before -> now, the cases of ``added`` (recipe names, default
    fixtures/depth_cases.py's) that catch it, and ``reasons`` (default :data:`DEPTH_REASONS`) where it
    stays below."""
    before = DEPTH_BEFORE if before is None else before
    reasons = DEPTH_REASONS if reasons is None else reasons
    if added is None:
        from gdncheck.fixtures.depth_cases import DEPTH_CASES

        added = {s.name for s in DEPTH_CASES}
    traits = {c["id"]: case_traits(c) for c in load_manifest(fixtures_dir)["cases"]}
    ds = depths(results, mutants)
    lines = ["| mutant | " + " | ".join(profiles) + " | depth (distinct) | catching cases |",
             "|---|" + "---|" * len(profiles) + "---|---|"]
    for name, d in ds.items():
        cells = []
        for p in profiles:
            n = d.count(p)
            cells.append("-" if n is None else str(n) if n else f"0 (below rounding, ×{d.margin.get(p, 0.0):.2g})")
        union = sorted({c for p in d.visible() for c in d.caught[p]})
        if len(union) <= DEPTH_NAMES_UP_TO:
            which = _grouped(union, traits) or "-"
        else:
            layouts = {traits[c].layout for c in union if c in traits}
            kinds = sorted({traits[c].regime for c in union if c in traits})
            which = f"{len(union)} cases, {len(layouts)} head layouts ({', '.join(kinds)})"
        low = " **(below 3)**" if d.visible() and d.depth() < DEPTH_GOAL else ""
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {d.depth()} ({d.distinct(traits)}){low} | {which} |")
    low = [n for n, d in ds.items()
           if any(0 < (d.count(p) or 0) < DEPTH_GOAL for p in profiles)
           or any(v < DEPTH_GOAL for v in before.get(n, {}).values())]
    lines += ["", f"Every class caught by fewer than {DEPTH_GOAL} cases in some profile (when the default suite "
              "had 74 cases, or now): the count per profile before -> now, the cases added that catch it, and where it stays "
              "below, why:", "",
              "| mutant | " + " | ".join(profiles) + " | cases added that catch it | why not more |",
              "|---|" + "---|" * len(profiles) + "---|---|"]
    for n in low:
        d = ds[n]
        cells = []
        for p in profiles:
            now = d.count(p)
            was = before.get(n, {}).get(p)
            now_s = "-" if now is None else str(now) if now else f"0 (×{d.margin.get(p, 0.0):.2g})"
            cells.append(f"{was} -> {now_s}" if was is not None else now_s)
        new = sorted({traits[c].name for p in d.visible() for c in d.caught[p] if c in traits and traits[c].name in added})
        still = [p for p in d.visible() if len(d.caught[p]) < DEPTH_GOAL]
        why = reasons.get(n, "**no reason stated**" if still else "-")
        lines.append(f"| `{n}` | " + " | ".join(cells) + f" | {', '.join(new) or '-'} | {why} |")
    return "\n".join(lines)


DEPTH_BEGIN, DEPTH_END = ("<!-- depth: begin (python -m gdncheck.conformance.meta --write-docs docs/meta.md, "
                          "or --depth-only) -->", "<!-- depth: end -->")


def write_block(path: str | Path, text: str, begin: str, end: str, what: str) -> None:
    """Replace the block of ``path`` between ``begin`` and ``end`` by ``text``."""
    p = Path(path)
    doc = p.read_text()
    if begin not in doc or end not in doc:
        raise ValueError(f"{p} has no generated {what} block ({begin} ... {end})")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    p.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def has_block(path: str | Path, begin: str, end: str) -> bool:
    doc = Path(path).read_text()
    return begin in doc and end in doc
