"""Hypothesis profiles ``dev``, ``ci`` and ``nightly``, chosen by ``GDN_HYPOTHESIS_PROFILE``.

``ci`` is derandomized (the same examples on every run), prints the reproduction blob of a failure
and has no deadline (interpreted Triton kernels and float64 references are slow but not flaky).
Without the variable, ``ci`` is chosen when a ``CI`` variable is set, else ``dev``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from gdncheck.errors import EnvironmentVariableError

PROFILES = ("dev", "ci", "nightly")


def register_profiles() -> str:
    """Register the three profiles and load the chosen one; return its name."""
    slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True,
                              suppress_health_check=slow_ok)
    settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                              database=None, suppress_health_check=slow_ok)
    settings.register_profile("nightly", max_examples=500, deadline=None, print_blob=True,
                              suppress_health_check=slow_ok)
    name = os.environ.get("GDN_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if name not in PROFILES:
        # a GDNError (and a ValueError, as before): one line and exit 2 from any command
        raise EnvironmentVariableError(f"GDN_HYPOTHESIS_PROFILE: expected one of {', '.join(PROFILES)}, "
                                       f"found {name!r}")
    settings.load_profile(name)
    return name
