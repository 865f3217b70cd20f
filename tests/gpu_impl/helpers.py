"""Inputs for the Triton-path tests: the device, profile tensors, stable seeds."""

from __future__ import annotations

import zlib

import numpy as np
import torch
from gdncheck.gpu_impl import PROFILES, resolve_device

#: CUDA on a GPU runner, the interpreter on the CPU (``GDN_DEVICE`` overrides).
DEVICE = resolve_device()
PROFILE_NAMES = tuple(PROFILES)


def rng_for(*key) -> np.random.Generator:
    """A generator seeded by ``key`` (stable across processes, unlike ``hash``)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def tensor(x, profile: str = "f32", device=None) -> torch.Tensor:
    """x (float64) rounded to the profile dtype, on the test device."""
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=PROFILES[profile], device=device or DEVICE)


def fp32(x) -> torch.Tensor:
    return tensor(x, "f32")
