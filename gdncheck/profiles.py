"""The precision profiles (docs/spec.md §6): one record per profile, read by everything that needs one.

A port runs in a profile: its activations are stored in that dtype (``f32``, ``bf16``, ``f16``), its
recurrent state in float32 or wider. ``f64`` is the reference's own precision: ``gdncheck run
reference --profile f64`` runs it, but nothing is verified at f64. The metrics (ulp distances, the
smallest scale of a group), the verdicts (the output dtypes accepted), the emulated layer, the
tolerance floors, the gate and every ``--profile`` choice read :data:`PROFILES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str  # as written on the command line and in every file: f64, f32, bf16, f16
    storage: str  # the safetensors dtype name of a value stored in the profile
    bits: int  # significand bits, the hidden bit included
    min_exponent: int  # exponent of the smallest normal number
    outputs: tuple[str, ...]  # safetensors dtypes verify accepts for an activation: the profile's or wider
    torch_dtype: str  # the name of the torch dtype (``getattr(torch, ...)``)

    @property
    def eps(self) -> float:
        """Machine epsilon: the spacing of the dtype's numbers at 1.0 (twice the unit roundoff)."""
        return 2.0 ** (1 - self.bits)

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** self.min_exponent

    @property
    def subnormal_exponent(self) -> int:
        """Exponent of the smallest subnormal number (the finest spacing the dtype has)."""
        return self.min_exponent - (self.bits - 1)


PROFILES: dict[str, Profile] = {
    "f64": Profile("f64", "F64", 53, -1022, ("F64",), "float64"),
    "f32": Profile("f32", "F32", 24, -126, ("F32", "F64"), "float32"),
    "bf16": Profile("bf16", "BF16", 8, -126, ("BF16", "F32", "F64"), "bfloat16"),
    "f16": Profile("f16", "F16", 11, -14, ("F16", "F32", "F64"), "float16"),
}

#: What ``gdncheck run`` accepts: the reference runs in f64 too.
RUN_PROFILES: tuple[str, ...] = ("f64", "f32", "bf16", "f16")
#: What ports run in and ``verify`` judges (and the gate's default, in this order).
VERIFY_PROFILES: tuple[str, ...] = ("f32", "bf16", "f16")

#: The recurrent state is kept in float32 or wider whatever the profile.
STATE_OUTPUTS: tuple[str, ...] = ("F32", "F64")


def profile(name: str) -> Profile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown precision profile {name!r}; expected one of {', '.join(RUN_PROFILES)}") from None


def choices(names: tuple[str, ...]) -> str:
    """``f32, bf16 or f16``: a list of profiles for a message."""
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
