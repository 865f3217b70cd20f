"""The property suite's draws as observations of the tolerance table's ``properties`` rows.

A generated configuration is no fixture recipe: the properties judge it with the table's
``properties`` row (:mod:`.check`). So those rows are earned over what the properties draw as well as
over the recipes: ``gdncheck tolerances derive`` adds, per derivation seed, :data:`PER_STRATUM` programs of the
differential property (:func:`.differential.draw_program`) for every pair of a weights regime and an
input kind the strategies draw (:data:`STRATA`; a plain Hypothesis run visits them unevenly: 400 draws
of one seed held no ``state_norms`` weights, another's no ``weak_writes``). Hypothesis draws the rest
(configuration, seeds, batch, call lengths) from a fixed seed per stratum, generation phase only. Each
program is run by the emulated correct layer in every profile with every derivation placement and
summation order and measured exactly as :func:`.check.compare_calls` judges it: the scales of the
case-wide groups from all calls of the program together, the gated norm's smallest eps, ``a`` and
``b`` not judged, the NMSE of a call's tensor only from :data:`.check.MIN_NMSE_ELEMENTS` elements.
These observations make the ``properties`` rows only: no recipe row and no ``global`` row (which
judges checkpoint-built fixtures) comes from them (docs/tolerances.md §3).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import __version__ as hypothesis_version
from hypothesis import strategies as st

from gdncheck.conformance.earn.derive import PROPERTIES_ONLY, Envelope, variants
from gdncheck.conformance.earn.emulate import emulated
from gdncheck.conformance.judge.metrics import case_stats
from gdncheck.env import limit_blas_threads
from gdncheck.harness import END_TO_END
from gdncheck.profiles import VERIFY_PROFILES
from gdncheck.stages import STATE_NAMES, is_index_tensor, layer_stage_names, stage_outputs

from .check import GATED_NORM_EPS, MIN_NMSE_ELEMENTS, NOT_JUDGED
from .differential import Program, draw_program
from .registry import Subject, run_calls
from .strategies import GATE_REGIMES, INPUT_KINDS, REALISTIC

REGIMES = (REALISTIC, *GATE_REGIMES)
KINDS = (REALISTIC, *INPUT_KINDS)
#: Every (weights regime, input kind) pair the differential property can draw.
STRATA = tuple((r, k) for r in REGIMES for k in KINDS)
#: Programs per stratum and derivation seed (91 strata x 3 x 4 seeds: 1092 programs).
PER_STRATUM = 3


def programs(at: int, regime: str, kind: str, count: int = PER_STRATUM) -> list[Program]:
    """``count`` differential programs of one stratum, drawn by Hypothesis from a seed made of ``at``
    and the stratum (the same list on every run with the same Hypothesis version)."""
    out: list[Program] = []

    @seed(at * 1000 + STRATA.index((regime, kind)))
    @settings(database=None, max_examples=count, phases=[Phase.generate], deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data):
        out.append(draw_program(data, regime, kind))

    collect()
    return out[:count]


def sample(at: int, regime: str | None = None, count: int = PER_STRATUM) -> list[Program]:
    """The programs of seed ``at``: every stratum (of ``regime`` only, when given)."""
    return [p for r, k in STRATA if regime in (None, r) for p in programs(at, r, k, count)]


def observe_draws(at: int, regime: str, count: int = PER_STRATUM, profiles=VERIFY_PROFILES) -> Envelope:
    """The envelope of the programs of seed ``at`` with weights of ``regime`` (under the recipe name
    ``PROPERTIES_ONLY + regime``: they make the property rows only)."""
    limit_blas_threads()
    env = Envelope()
    for program in sample(at, regime, count):
        observe_program(env, program, profiles)
    return env


def observe_program(env: Envelope, program: Program, profiles=VERIFY_PROFILES, placements=None) -> None:
    """Add one program's errors in ``profiles`` (every derivation variant, or ``placements``)."""
    weights, calls = program.build()
    _, want = run_calls(Subject.reference(program.cfg, weights), calls)
    judged = {n for stage in layer_stage_names("dense")[1:] for n in stage_outputs(stage, "dense")} | set(STATE_NAMES)
    names = [n for n in want[0] if n in judged and n not in NOT_JUDGED and not is_index_tensor(n)]
    stats = case_stats({n: dict(enumerate(w[n] for w in want)) for n in names if n not in STATE_NAMES},
                       GATED_NORM_EPS)
    for profile in profiles:
        for placement in placements or variants(profile):
            _, got = run_calls(emulated(program.cfg, weights, profile=profile, placement=placement), calls)
            for k, (a, e) in enumerate(zip(got, want)):
                for name in names:
                    if name in a:
                        env.add(END_TO_END, profile, PROPERTIES_ONLY + program.weights.regime, name, a[name], e[name],
                                None if name in STATE_NAMES else stats[name], k,
                                nmse=e[name].size >= MIN_NMSE_ELEMENTS)


def jobs(seeds, count: int = PER_STRATUM) -> list:
    """The derivation's extra jobs: ``(observe_draws, (seed, regime, count))`` per seed and regime."""
    return [(observe_draws, (s, r, count)) for s in seeds for r in REGIMES]


def note(seeds, count: int = PER_STRATUM) -> str:
    return (f"properties rows: the global envelope and {count} programs of the differential "
            f"property per (weights regime, input kind) pair ({len(STRATA)} pairs) and seed ({len(seeds)} seeds), "
            f"drawn by Hypothesis {hypothesis_version} (conformance/properties/draws.py), every placement and order")
