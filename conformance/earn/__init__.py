"""gdncheck.conformance.earn: how the tolerances are earned.

:mod:`.lowp` is float32 arithmetic with the roundings and summation orders engines use;
:mod:`.emulate` is the layer computed that way in a precision profile (with a rounding placement),
also an implementation of the port contract (``gdncheck run reference --profile bf16``);
:mod:`.derive` runs it over the fixture recipes at other seeds and writes the tolerance table the
judge reads (docs/tolerances.md).
"""
