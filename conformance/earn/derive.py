"""``gdncheck tolerances derive``: earn the tolerance table from data (docs/tolerances.md).

For every forward case of the suite, rebuilt with seeds 1-4 (never the committed seed 0, so that
the committed cases stay a test of the table and not its source): the float64 reference gives the
goldens; the emulated layer (:mod:`.emulate`) runs the same program in each profile with each
rounding placement of :data:`~.emulate.DERIVATION_PLACEMENTS`, each with each summation order of
:data:`~.emulate.DERIVATION_ORDERS` (:func:`variants`); the scaled elementwise error
(:mod:`.metrics`) and the per-call NMSE are maximised per (profile, case recipe, tensor), end to end
and stage by stage from golden inputs (stage-isolated mode). The bound is the envelope times a
margin, never below one ulp of the profile's dtype; the ``global`` row is the envelope over every
recipe, for cases the table does not know.
"""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from gdncheck._version import __version__
from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.metrics import CaseStats, case_stats, tensor_metrics
from gdncheck.conformance.judge.packed import as_judged
from gdncheck.conformance.judge.tolerances import PROPERTY_ROWS, TABLE_FORMAT, recipe_of
from gdncheck.env import limit_blas_threads
from gdncheck.fixtures.build import golden_tensors
from gdncheck.fixtures.cases import suite
from gdncheck.harness import (
    END_TO_END,
    MODES,
    STAGE_ISOLATED,
    CaseInput,
    call_key,
    call_steps,
    execute,
    golden_inputs,
    is_packed,
)
from gdncheck.profiles import PROFILES, VERIFY_PROFILES
from gdncheck.stages import is_index_tensor, layer_stage_names, stage_outputs

from .emulate import DERIVATION_ORDERS, DERIVATION_PLACEMENTS, emulated

SEEDS = (1, 2, 3, 4)
MARGIN_ELEM = 4.0
MARGIN_NMSE = 16.0  # NMSE is a squared error: the same factor 4 on the error
TABLE_VERSION = 3
#: The sequential order costs about 0.6 ns per multiply-add in NumPy (a Python loop over K, vectorised
#: over the outputs): 24 CPU-seconds per run at Qwen3.5-27B sizes, 1.4 with BLAS. On the real-size recipes
#: (tag ``real-sizes``) it therefore runs in these profiles only; in bf16 and f16 the roundings to
#: the activation dtype dominate it (docs/tolerances.md §3 has the measurement).
SEQUENTIAL_REAL_SIZE_PROFILES = ("f32",)
COMMAND = "gdncheck tolerances derive --suite full --jobs 2"
#: Observations under ``PROPERTIES_ONLY + <weights regime>`` go into the ``properties`` rows only (the
#: property draws: conformance/properties/draws.py): no recipe row, no global row.
PROPERTIES_ONLY = "properties-only: "


class Envelope:
    """Running maxima of the scaled error and the per-call NMSE per (mode, profile, recipe, tensor),
    and the largest error per token position (to show how errors grow along a sequence)."""

    def __init__(self) -> None:
        self.elem: dict[tuple, float] = {}
        self.nmse: dict[tuple, float] = {}

    def add(self, mode: str, profile: str, recipe: str, tensor: str, actual, expected, stats: CaseStats,
            call: int | None = None, nmse: bool = True) -> None:
        """Add one tensor of one call; ``nmse=False``: its elementwise error only (a judge that does not
        bound this tensor's NMSE)."""
        key = (mode, profile, recipe, tensor)
        m = tensor_metrics(actual, expected, tensor, profile, stats, call=call)
        if m.nan or m.inf_mismatch:
            raise RuntimeError(f"{recipe} {profile} {tensor}: non-finite values in an emulated run")
        self.elem[key] = max(self.elem.get(key, 0.0), m.max_err)
        self.nmse[key] = max(self.nmse.get(key, 0.0), m.nmse if nmse else 0.0)

    def merge(self, other: Envelope) -> None:
        for mine, theirs in ((self.elem, other.elem), (self.nmse, other.nmse)):
            for k, v in theirs.items():
                mine[k] = max(mine.get(k, 0.0), v)


def forward_recipes(suite_name: str = "default"):
    return [s for s in suite(suite_name) if s.error is None]


def variants(profile: str, tags=()) -> tuple[str, ...]:
    """The placement specs (``NAME`` or ``NAME:ORDER``) a recipe with ``tags`` runs in ``profile``:
    every derivation placement with every derivation order, less the sequential order on the
    real-size recipes outside :data:`SEQUENTIAL_REAL_SIZE_PROFILES`."""
    out = []
    for order in DERIVATION_ORDERS:
        if order == "sequential" and "real-sizes" in tags and profile not in SEQUENTIAL_REAL_SIZE_PROFILES:
            continue
        out += [p if order == "blas" else f"{p}:{order}" for p in DERIVATION_PLACEMENTS]
    return tuple(out)


def observe(spec_index: int, seed: int, profiles=VERIFY_PROFILES, placements=None,
            suite_name: str = "default") -> Envelope:
    """The envelope of one case (by index into the suite's forward recipes) at one seed, over
    ``placements`` (placement specs; default: :func:`variants` of each profile)."""
    limit_blas_threads()
    spec = forward_recipes(suite_name)[spec_index]
    case = spec.materialize(seed)
    recipe = recipe_of(case.id)
    gold, _, _ = golden_tensors(case)
    inp = CaseInput(case.id, case.config, case.weights, case.batch, case.program.steps, case.program.inputs,
                    case.expected)
    calls = call_steps(case.program.steps)
    stats = case_stats({name: {s["call"]: as_judged(gold[call_key(s["call"], name)], s, name) for s in calls
                               if name in s["expected"]}
                        for name in {n for s in calls for n in s["expected"]}}, spec.cfg.rms_norm_eps)
    env = Envelope()
    for profile in profiles:
        for placement in placements or variants(profile, spec.tags):
            res = execute(emulated, inp, profile=profile, options={"placement": placement})
            if res.error:
                raise RuntimeError(f"{case.id} {profile}/{placement}: {res.error}")
            for step in calls:
                for name in step["expected"]:
                    if is_index_tensor(name):
                        continue  # selected experts: judged exactly, no error to bound
                    key = call_key(step["call"], name)
                    env.add(END_TO_END, profile, recipe, name, as_judged(res.outputs[key], step, name),
                            as_judged(gold[key], step, name), stats[name], step["call"])
            if spec.state_in:
                impl = emulated(GDNConfig.from_hf(case.config), case.weights, profile=profile, placement=placement)
                for step in calls:
                    if not is_packed(step):  # a packed call's stages run on the pool: no [B, T, ...] stage
                        _observe_isolated(env, impl, gold, step, profile, recipe, stats)
    return env


def _observe_isolated(env: Envelope, impl, gold, step: dict, profile: str, recipe: str, stats) -> None:
    k = step["call"]
    kind = impl.layer.mlp_kind  # a sparse layer's pipeline holds the block's stages too
    for stage in layer_stage_names(kind)[1:]:
        inputs = golden_inputs(gold, k, stage, kind)
        if inputs is None:
            continue
        outputs = impl.run_stage(stage, inputs)
        for name in stage_outputs(stage, kind):
            key = call_key(k, name)
            if key in gold and not is_index_tensor(name):
                env.add(STAGE_ISOLATED, profile, recipe, name, outputs[name], gold[key], stats[name], k)


def _observe_job(i: int, s: int, suite_name: str) -> Envelope:
    return observe(i, s, suite_name=suite_name)


def _run_job(job):
    fn, args = job
    return fn(*args)


def derive(seeds=SEEDS, jobs: int = 1, progress: Callable[[str], None] | None = None,
           suite_name: str = "default", extra_jobs=(), extra_note: str | None = None) -> dict:
    """Run every observation over the suite's forward recipes and turn the envelope into the table.

    ``extra_jobs``: ``(fn, args)`` pairs (picklable, top-level ``fn``) whose envelopes join the same
    pool; the property draws of conformance/properties/draws.py, which the ``tolerances`` command
    passes (this floor cannot import the properties), observed under :data:`PROPERTIES_ONLY` recipe names.
    ``extra_note`` says in the table what they were."""
    recipes = forward_recipes(suite_name)
    # the real-size recipes first, the largest (last in the suite) first, so that no long job starts last
    first = sorted(range(len(recipes)), key=lambda i: ("real-sizes" not in recipes[i].tags, -i))
    work = [(_observe_job, (i, s, suite_name)) for i in first for s in seeds] + list(extra_jobs)
    names = [recipes[i].case_id(s) for i in first for s in seeds] + \
        [f"{getattr(fn, '__name__', fn)}{args}" for fn, args in extra_jobs]
    env = Envelope()
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for name, part in zip(names, pool.map(_run_job, work)):
                env.merge(part)
                if progress:
                    progress(name)
    else:
        for name, job in zip(names, work):
            env.merge(_run_job(job))
            if progress:
                progress(name)
    doc = table_document(env, seeds, [r.case_id(0) for r in recipes])
    doc["derivation"]["suite"] = suite_name
    if extra_note:
        doc["derivation"]["properties_also"] = extra_note
    if suite_name != "full":  # the table says what it was derived from (the committed one: COMMAND)
        doc["derivation"]["command"] = f"gdncheck tolerances derive --suite {suite_name} --jobs {jobs}"
    return doc


def table_document(env: Envelope, seeds, cases: list[str]) -> dict:
    """The table of an envelope. Observations under ``PROPERTIES_ONLY + regime`` (the property draws) make
    the ``properties`` rows only: the envelope of every recipe and every draw."""
    modes: dict = {}
    global_max: dict[tuple, tuple[float, float]] = {}
    property_max: dict[tuple, tuple[float, float]] = {}
    for (mode, profile, recipe, tensor), value in sorted(env.elem.items()):
        nmse = env.nmse[(mode, profile, recipe, tensor)]
        modes.setdefault(mode, {}).setdefault(profile, {"global": {}, "cases": {}})
        targets = [property_max] if recipe.startswith(PROPERTIES_ONLY) else [property_max, global_max]
        for target in targets:
            e0, n0 = target.get((mode, profile, tensor), (0.0, 0.0))
            target[(mode, profile, tensor)] = (max(e0, value), max(n0, nmse))
        if not recipe.startswith(PROPERTIES_ONLY):
            modes[mode][profile]["cases"].setdefault(recipe, {})[tensor] = _row(value, nmse, PROFILES[profile].eps)
    for (mode, profile, tensor), (value, nmse) in sorted(global_max.items()):
        modes[mode][profile]["global"][tensor] = _row(value, nmse, PROFILES[profile].eps)
    if any(recipe.startswith(PROPERTIES_ONLY) for (_m, _p, recipe, _t) in env.elem):
        for (mode, profile, tensor), (value, nmse) in sorted(property_max.items()):
            modes[mode][profile].setdefault(PROPERTY_ROWS, {})[tensor] = _row(value, nmse, PROFILES[profile].eps)
    return {
        "format": TABLE_FORMAT,
        "version": TABLE_VERSION,
        "derivation": {
            "command": COMMAND,
            "method": "per (mode, profile, case recipe, tensor): the largest elementwise error of the tensor's rule "
                      "(docs/tolerances.md §1) and the largest "
                      "per-call NMSE of the emulated layer against the float64 reference, over the recipe rebuilt at "
                      "every seed and run with every placement and summation order; bound = margin x envelope, at "
                      "least one ulp of the profile dtype (elem) or its square (nmse). 'global' is the envelope over "
                      "all recipes; 'properties' (where present) the envelope over all recipes and the property draws "
                      "that 'properties_also' names.",
            "margin_elem": MARGIN_ELEM,
            "margin_nmse": MARGIN_NMSE,
            "floor": "elem >= eps(profile), nmse >= eps(profile)^2",
            "placements": list(DERIVATION_PLACEMENTS),
            "orders": list(DERIVATION_ORDERS),
            "orders_note": "every placement runs with every summation order (conformance/earn/lowp.py), except the "
                           "sequential order on the real-size recipes, which runs in "
                           + ", ".join(SEQUENTIAL_REAL_SIZE_PROFILES) + " only (docs/tolerances.md §3)",
            "seeds": list(seeds),
            "cases": cases,
            "gdncheck": __version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "modes": {m: modes[m] for m in MODES if m in modes},
    }


def merge_recipes(table: dict, part: dict) -> dict:
    """``table`` with ``part``'s recipes (a derivation over some recipes only, same method, the table's
    seeds or more: ``derivation.seeds_by_case`` then lists them) put in: their rows replace any of the
    same recipe, and each global row becomes the envelope of both (a global bound only widens). What a full derive over both would write, without rerunning
    the other recipes; the derivation record lists part's cases too."""
    for key in ("method", "margin_elem", "margin_nmse", "placements", "orders"):
        if table["derivation"][key] != part["derivation"][key]:
            raise ValueError(f"cannot merge derivations that differ in {key}: {table['derivation'][key]!r} "
                             f"vs {part['derivation'][key]!r}")
    have, theirs = table["derivation"]["seeds"], part["derivation"]["seeds"]
    if not set(have) <= set(theirs):
        # fewer seeds could only see less: a recipe row earned on them would be narrower than the method's
        raise ValueError(f"cannot merge derivations that differ in seeds: the part's {theirs!r} lack some of "
                         f"the table's {have!r}")
    out = json.loads(json.dumps(table))
    if set(theirs) != set(have):
        # more seeds than the table's (a small recipe's maximum varies from seed to seed): said per case
        more = out["derivation"].setdefault("seeds_by_case", {})
        more.update({c: list(theirs) for c in part["derivation"]["cases"]})
        out["derivation"]["seeds_by_case"] = dict(sorted(more.items()))
    for mode, profiles in part["modes"].items():
        for profile, rows in profiles.items():
            mine = out["modes"].setdefault(mode, {}).setdefault(profile, {"global": {}, "cases": {}})
            mine["cases"].update(rows["cases"])
            _widen_rows(mine.setdefault("global", {}), rows["global"], profile)
            # the property rows envelope every recipe: the part's widen them (by its own property rows
            # where it has them, else by its global rows)
            if PROPERTY_ROWS in mine or PROPERTY_ROWS in rows:
                have = mine.setdefault(PROPERTY_ROWS, dict(mine["global"]))
                _widen_rows(have, rows.get(PROPERTY_ROWS, rows["global"]), profile)
            mine["cases"] = dict(sorted(mine["cases"].items()))
    out["derivation"]["cases"] = list(dict.fromkeys(out["derivation"]["cases"] + part["derivation"]["cases"]))
    return out


def _widen_rows(have: dict, part: dict, profile: str) -> None:
    """``have`` (tensor -> row) made the envelope of itself and ``part``, in place, sorted."""
    for tensor, row in part.items():
        old = have.get(tensor, {"observed_elem": 0.0, "observed_nmse": 0.0})
        if row["observed_elem"] <= old["observed_elem"] and row["observed_nmse"] <= old["observed_nmse"]:
            continue  # the row as written (re-rounding it could move its last digit)
        have[tensor] = _row(max(old["observed_elem"], row["observed_elem"]),
                            max(old["observed_nmse"], row["observed_nmse"]), PROFILES[profile].eps)
    ordered = dict(sorted(have.items()))
    have.clear()
    have.update(ordered)


def _row(elem: float, nmse: float, floor: float) -> dict:
    return {"elem": _round_up(max(MARGIN_ELEM * elem, floor)),
            "nmse": _round_up(max(MARGIN_NMSE * nmse, floor * floor)),
            "observed_elem": float(f"{elem:.6g}"), "observed_nmse": float(f"{nmse:.6g}")}


def _round_up(x: float) -> float:
    """x rounded up to 3 significant digits (a bound never shrinks by being written down)."""
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x)) - 2
    return float(f"{math.ceil(x / 10.0 ** e) * 10.0 ** e:.3g}")


def encode_table(doc: dict) -> bytes:
    return (json.dumps(doc, indent=1) + "\n").encode()
