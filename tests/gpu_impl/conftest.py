"""Fixtures of the Triton-path tests: NaN-filled outputs, and the interpreter emulating a GPU.

Every test runs inside :func:`gdncheck.gpu_impl.fill_allocations`, so each output the package
allocates starts as NaN and a lane that a kernel never writes fails the comparison. Under CPU CI
the kernels run in Triton's interpreter, made to do what compiled code does
(:func:`gdncheck.gpu_impl.interpreter.emulate_gpu`): tf32 operands truncated in ``tl.dot`` and
the programs of every launch run in a shuffled order (seeded by the test's id, so a failure
reproduces). The bounds of compare.py therefore hold for compiled code too; on a GPU runner the
same tests run compiled.
"""

from __future__ import annotations

import pytest

from gdncheck.gpu_impl import fill_allocations
from gdncheck.gpu_impl.interpreter import emulate_gpu
from tests.gpu_impl.compare import RECORD, TABLES


@pytest.fixture(autouse=True)
def _nan_filled_outputs_on_an_emulated_gpu(request):
    with fill_allocations(float("nan")), emulate_gpu(tf32=True, order="shuffle", seed=request.node.nodeid):
        yield


def pytest_terminal_summary(terminalreporter):
    """Without xdist: the worst observed error per tolerance, as a fraction of the bound."""
    if not RECORD:
        return
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for kind, profile, what, rel in RECORD:
        if rel >= worst.get((kind, profile), (-1.0, ""))[0]:
            worst[(kind, profile)] = (rel, what)
    terminalreporter.section("gpu_impl tolerance margins (worst observed / bound)")
    for (kind, profile), (rel, what) in sorted(worst.items()):
        bound = TABLES[kind][profile]
        terminalreporter.write_line(f"{kind:<6} {profile:<5} {rel:.2e} / {bound:.0e} = {rel / bound:.2f}  ({what})")
