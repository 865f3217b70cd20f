"""The outputs file a port writes per case (fixtures/FORMAT.md §7): its metadata constants.

Written by ``gdncheck run`` (and by ports in any language), read by ``verify``; both sides take
the names from here.
"""

from __future__ import annotations

OUTPUTS_FORMAT = "gdncheck-outputs"
OUTPUTS_FORMAT_VERSION = "1"

END_TO_END = "end_to_end"
STAGE_ISOLATED = "stage_isolated"
#: The two ways a port runs a case: the whole program, or each stage alone from golden inputs (FORMAT.md §8).
MODES: tuple[str, ...] = (END_TO_END, STAGE_ISOLATED)


def mode_name(stage_isolated: bool) -> str:
    return STAGE_ISOLATED if stage_isolated else END_TO_END
