"""The mutant catalogue as the diagnosis's candidates (``conformance/judge/diagnose.py``): what each
known bug class produces on a failing case, at its first divergence.

The judge stands below the mutants (docs/layout.md), so the diagnosis takes this catalogue as an
injected callable. It runs every mutant (:data:`ALL_MUTANTS`; the sparse block's and the serving
patterns' only on cases with their tags) on the failing case in the same profile and mode, up to the
failing step, and hands over the failing tensor of each; a case's runs are kept for the other records
of the same case. The kill matrix, which has every mutant's outputs already, reads them from its
output folders instead (``outputs=``).

    verify(..., diagnose=Diagnoser(MutantCatalogue(fixtures_dir)))
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gdncheck.config import GDNConfig
from gdncheck.conformance.judge.diagnose import Diagnoser
from gdncheck.conformance.ports.run import load_case_input
from gdncheck.experts import mlp_kind_of
from gdncheck.harness import CaseInput, call_key, execute, golden_inputs, is_packed, to_numpy
from gdncheck.safetensors_io import SafetensorsFile
from gdncheck.stages import stage_of
from gdncheck.weights import LayerWeights

from .heldout_mutants import HELDOUT_BY_NAME
from .moe_mutants import MOE_MUTANTS
from .mutants import CHECKPOINT_DTYPE_MUTANTS, MUTANTS, Mutant
from .serving_mutants import SERVING_MISREADINGS, SERVING_MUTANTS

#: Every known bug class: the dense layer's mutants, the sparse block's and the serving patterns'
#: (those two only on a case carrying their ``case_tags``): the kill matrix's catalogue, and the
#: serving contract's misreadings (run on their tagged cases too); the float32 checkpoint weights rounded
#: at load (on the cases that hold such weights, tag ``checkpoint-dtypes``); and the L2-norm eps dk× too
#: large, once named "a scale per head" (issue 42).
ALL_MUTANTS: tuple[Mutant, ...] = (MUTANTS + MOE_MUTANTS + SERVING_MUTANTS + SERVING_MISREADINGS
                                   + CHECKPOINT_DTYPE_MUTANTS + (HELDOUT_BY_NAME["l2norm_eps_dk_times"],))

#: How many failing cases one verify run diagnoses by default (each runs every mutant once).
DEFAULT_LIMIT = 8


class MutantCatalogue:
    """``(entry, profile, mode, record) -> {mutant name: (bug class, tensor)}`` (module docstring)."""

    def __init__(self, fixtures_dir: str | Path, mutants: tuple[Mutant, ...] = ALL_MUTANTS,
                 outputs: dict[str, Path] | None = None):
        self.fixtures = Path(fixtures_dir)
        self.mutants = mutants
        self.outputs = outputs  # mutant name -> folder of its outputs files (already run)
        self._runs: dict[tuple, dict[str, np.ndarray]] = {}

    def __call__(self, entry: dict, profile: str, mode: str, rec) -> dict[str, tuple[str, np.ndarray]]:
        out = {}
        key = call_key(rec.call, rec.tensor)
        for m in self.mutants:
            if not set(getattr(m, "case_tags", ())) <= set(entry.get("tags", ())):
                continue  # a sparse block's bug class on a case without that block
            arr = self._tensor(m, entry, profile, mode, rec, key)
            if arr is not None:
                out[m.name] = (m.bug_class, np.asarray(arr, dtype=np.float64))
        return out

    def _tensor(self, m: Mutant, entry: dict, profile: str, mode: str, rec, key: str):
        if self.outputs is not None:
            path = Path(self.outputs.get(m.name, "")) / f"{entry['id']}.safetensors"
            if not path.is_file():
                return None
            f = SafetensorsFile(path)
            return f.read(key) if key in f else None
        cache = (m.name, entry["id"], profile, mode, rec.step)
        if cache not in self._runs:
            self._runs[cache] = self._run(m, entry, profile, mode, rec)
        return self._runs[cache].get(key)

    def _run(self, m: Mutant, entry: dict, profile: str, mode: str, rec) -> dict[str, np.ndarray]:
        inp, gold = load_case_input(self.fixtures, entry)
        if mode == "stage_isolated":
            if is_packed(inp.program[rec.step]):
                return {}  # the mutants run stages on [B, T, ...] calls; a packed call's have no stage mutant
            cfg = GDNConfig.from_hf(dict(inp.config))
            impl = m.factory(cfg, LayerWeights(inp.weights, config=cfg), profile=profile)
            stage = stage_of(rec.tensor)
            inputs = golden_inputs(gold, rec.call, stage, mlp_kind_of(inp.weights))
            if inputs is None:
                return {}
            result = impl.run_stage(stage, inputs)
            return {call_key(rec.call, k): np.array(to_numpy(v)) for k, v in result.items()}
        upto = CaseInput(inp.id, inp.config, inp.weights, inp.batch, list(inp.program[: rec.step + 1]), inp.inputs)
        try:
            res = execute(m.factory, upto, profile=profile)
        except Exception:  # noqa: BLE001 - a mutant that cannot run this case is no candidate
            return {}
        return res.outputs


def mutant_diagnoser(fixtures_dir: str | Path, limit: int | None = DEFAULT_LIMIT,
                     outputs: dict[str, Path] | None = None) -> Diagnoser:
    """The diagnosis verify runs from the command line and the gate: transforms and every mutant."""
    return Diagnoser(MutantCatalogue(fixtures_dir, outputs=outputs), limit=limit)
