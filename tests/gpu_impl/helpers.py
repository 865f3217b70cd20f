"""Inputs for the Triton-path tests: the device, profile tensors, stable seeds."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import triton

from gdncheck.gpu_impl import DTYPES, resolve_device

#: CUDA on a GPU runner, the interpreter on the CPU (``GDN_DEVICE`` overrides).
DEVICE = resolve_device()
PROFILE_NAMES = tuple(DTYPES)


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by ``key`` (stable across processes, unlike ``hash``)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def tensor(x, profile: str = "f32", device=None) -> torch.Tensor:
    """x (float64) rounded to the profile dtype, on the test device."""
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=DTYPES[profile], device=device or DEVICE)


def fp32(x) -> torch.Tensor:
    return tensor(x, "f32")


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


#: Triton < 3.7 with NumPy >= 2.4 cannot interpret ``range(runtime_value)`` (triton#9171;
#: docs/math.md §6). The device image has triton 3.6 and numpy 2.5: there the
#: compiled path is tested and the interpreter's own tests are skipped.
INTERPRETER_WORKS = not (_version(triton.__version__) < (3, 7) and _version(np.__version__) >= (2, 4))
needs_interpreter = pytest.mark.skipif(
    not INTERPRETER_WORKS, reason=f"triton {triton.__version__} + numpy {np.__version__}: interpreter loops broken"
)
