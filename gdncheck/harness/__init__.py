"""gdncheck.harness: the neutral harness every caller of an implementation shares.

The port contract (:mod:`.contract`: :class:`NotApplicable`, the :class:`Implementation` protocol,
:class:`LayerAdapter`), the program executor (:mod:`.program`: runs a case's program of
fixtures/FORMAT.md §4 on an implementation, for the goldens and for ``gdncheck run`` alike), the
stage runners of stage-isolated mode (:mod:`.stage_runners`) and the outputs-file constants
(:mod:`.outputs`). It imports only the core (``gdncheck.*`` modules with no math), never
``gdncheck.reference``, ``gdncheck.gpu_impl`` or the judge, so the fixture builder and the judge
can both stand on it.
"""

from .contract import Implementation, LayerAdapter, NotApplicable, StageOnly, error_code, to_numpy
from .outputs import END_TO_END, MODES, OUTPUTS_FORMAT, OUTPUTS_FORMAT_VERSION, STAGE_ISOLATED, mode_name
from .program import (
    CALL_OPS,
    PROGRAM_OPS,
    SERVING_CALL_OPS,
    CaseInput,
    RunResult,
    call_key,
    call_steps,
    execute,
    golden_inputs,
    has_input,
    is_packed,
    is_strict,
    serving_ops,
)
from .stage_runners import method_stage_runner, module_stage_runner

__all__ = [
    "CALL_OPS", "END_TO_END", "MODES", "OUTPUTS_FORMAT", "OUTPUTS_FORMAT_VERSION", "PROGRAM_OPS", "SERVING_CALL_OPS",
    "STAGE_ISOLATED", "CaseInput", "Implementation", "LayerAdapter", "NotApplicable", "RunResult", "StageOnly",
    "call_key", "call_steps", "error_code", "execute", "golden_inputs", "has_input", "is_packed", "is_strict",
    "method_stage_runner", "mode_name", "module_stage_runner", "serving_ops", "to_numpy",
]
