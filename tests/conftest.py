"""Test configuration: BLAS threads, Hypothesis profiles, the GDN_* header, GPU skips, the committed suite
(its folder, manifest and light cases, and a private copy to damage)."""

from __future__ import annotations

import shutil

import pytest

from gdncheck.conformance.properties.hypothesis_profiles import register_profiles
from gdncheck.env import KNOWN, gdn_vars, limit_blas_threads
from gdncheck.fixtures.manifest import DEFAULT_DIR, load_manifest
from tests.helpers import HEAVY_TAGS

limit_blas_threads()
HYPOTHESIS_PROFILE = register_profiles()


def pytest_report_header(config):
    lines = [f"gdncheck: hypothesis profile {HYPOTHESIS_PROFILE}"]
    set_vars = gdn_vars()
    lines.append("GDN_* set: " + (", ".join(f"{k}={v}" for k, v in set_vars.items()) if set_vars else "none"))
    unknown = [k for k in set_vars if k not in KNOWN]
    if unknown:
        lines.append(f"GDN_* not known to gdncheck (a typo?): {', '.join(unknown)}; known: {', '.join(KNOWN)}")
    return lines


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none here (runs on the GPU runner)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fixtures_dir():
    return DEFAULT_DIR


@pytest.fixture(scope="session")
def manifest():
    return load_manifest(DEFAULT_DIR)


@pytest.fixture(scope="session")
def light_cases(manifest):
    return [c["id"] for c in manifest["cases"] if not set(HEAVY_TAGS) & set(c["tags"])]


@pytest.fixture()
def fixture_copy(tmp_path):
    """A private copy of the committed suite, to damage."""
    dst = tmp_path / "fixtures"
    shutil.copytree(DEFAULT_DIR, dst)
    return dst
