"""Shared fixtures of the conformance tests: the committed suite and helpers to run + verify."""

from __future__ import annotations

import logging
import shutil

import pytest

from gdncheck.fixtures.manifest import DEFAULT_DIR

#: Cases cheap enough to run many times (the real-head-size cases and the 2048-token decode are not).
HEAVY_TAGS = ("real-heads", "long")


@pytest.fixture(scope="session")
def light_cases(manifest):
    return [c["id"] for c in manifest["cases"] if not set(HEAVY_TAGS) & set(c["tags"])]


@pytest.fixture()
def fixture_copy(tmp_path):
    """A private copy of the committed suite, to damage."""
    dst = tmp_path / "fixtures"
    shutil.copytree(DEFAULT_DIR, dst)
    return dst


@pytest.fixture(autouse=True)
def _quiet_resets():
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    yield
