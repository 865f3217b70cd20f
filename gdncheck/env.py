"""Environment variables (all prefixed `GDN_`) and the BLAS thread setting.

The variables this module knows (`GDN_BLAS_THREADS`, `GDN_HYPOTHESIS_PROFILE`, `GDN_DEVICE`,
`GDN_IMPL`, `GDN_PROFILE`, `GDN_REQUIRE_BROWSER`, `GDN_REQUIRE_ACTIONLINT`, the bootstrap's
`GDN_TORCH_*` and the Node.js example's `GDN_NODE_*`), their meanings and defaults: README.md,
"Environment". The float64 reference runs with one BLAS thread unless `GDN_BLAS_THREADS` says
otherwise: two OpenBLAS threads on a 2-core VM can stall small batched matmuls 10-100x
(docs/math.md §6).
"""

from __future__ import annotations

import os

from .errors import EnvironmentVariableError

KNOWN = {
    "GDN_BLAS_THREADS": "BLAS threads for the float64 reference (default 1)",
    "GDN_DEBUG": "1: an unexpected exception in a command raises with its traceback instead of one line and exit 2",
    "GDN_HYPOTHESIS_PROFILE": "Hypothesis profile: dev, ci, nightly",
    "GDN_DEVICE": "device for the Triton path: auto, cpu, cuda",
    "GDN_IMPL": "implementation the property suite tests: reference, triton, MODULE:CALLABLE",
    "GDN_PROFILE": "profile the property suite tests: f32, bf16, f16",
    "GDN_REQUIRE_BROWSER": "1: the report's browser tests fail instead of skipping without chromium",
    "GDN_REQUIRE_ACTIONLINT": "1: the workflow tests fail instead of skipping without actionlint",
    "GDN_TORCH_VERSION": "torch version scripts/bootstrap installs (default 2.13.0)",
    "GDN_TORCH_VARIANT": "torch build scripts/bootstrap installs: auto (default), cpu, cuda",
    "GDN_TORCH_INDEX": "index scripts/bootstrap takes torch from (default: PyTorch's CPU index for cpu; none)",
    "GDN_NODE_LANES": "partial sums per dot product in the Node.js example port (default 64)",
    "GDN_NODE_VERBOSE": "set: the Node.js example port logs its seq-len resets",
}


def gdn_vars() -> dict[str, str]:
    """Every ``GDN_*`` variable that is set (printed in test headers to catch typos)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("GDN_")}


#: The most BLAS threads ``GDN_BLAS_THREADS`` may ask for (more is a typo, and past a C int it would
#: overflow threadpoolctl's call).
MAX_BLAS_THREADS = 4096


def blas_threads() -> int:
    """GDN_BLAS_THREADS (unset or empty: 1); anything but an integer in ``1..MAX_BLAS_THREADS`` is
    refused (:class:`EnvironmentVariableError`, one line: what was expected, what was found)."""
    text = os.environ.get("GDN_BLAS_THREADS", "").strip()
    if not text:
        return 1
    try:
        n = int(text) if len(text) <= 32 else 0
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_BLAS_THREADS:
        shown = text if len(text) <= 64 else f"{text[:32]}... ({len(text)} characters)"
        raise EnvironmentVariableError(f"GDN_BLAS_THREADS: expected a positive integer of at most "
                                       f"{MAX_BLAS_THREADS} (BLAS threads for the float64 reference), found {shown!r}")
    return n


def limit_blas_threads(n: int | None = None):
    """Limit BLAS threads process-wide; returns the threadpoolctl controller (or None)."""
    n = n or blas_threads()
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        return None
    return threadpool_limits(limits=n, user_api="blas")
