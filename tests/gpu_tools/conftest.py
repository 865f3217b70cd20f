"""The tooling's tests run as the Triton path's do (tests/gpu_impl/conftest.py): outputs NaN-filled, the
interpreter emulating a GPU, so the benchmark's dry run computes as its GPU run does."""

from __future__ import annotations

import pytest

from gdncheck.gpu_impl import fill_allocations
from gdncheck.gpu_impl.interpreter import emulate_gpu


@pytest.fixture(autouse=True)
def _nan_filled_outputs_on_an_emulated_gpu(request):
    with fill_allocations(float("nan")), emulate_gpu(tf32=True, order="shuffle", seed=request.node.nodeid):
        yield
