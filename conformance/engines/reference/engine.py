"""The baseline row of the matrix: gdncheck's own float64 reference (the built-in ``reference``,
conformance/ports/implementations.py), with the profile's roundings emulated."""

from ..schema import Engine

ENGINE = Engine(
    name="reference",
    impl="reference",
    judged="end_to_end",
    profiles=("f32", "bf16"),
    modules=(),
    packages=("gdncheck",),
    install=None,
    about="the baseline: gdncheck's float64 reference with the profile's roundings emulated (placement hf); "
          "every case passes by construction",
    baseline=True,
)

#: every case passes by construction: nothing to explain
FINDINGS = ()
