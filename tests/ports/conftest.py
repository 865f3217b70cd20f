"""Shared fixtures of the port tests: the committed suite, quiet seq-len resets."""

from __future__ import annotations

import logging

import pytest
from gdncheck.fixtures.manifest import DEFAULT_DIR, load_manifest


@pytest.fixture(scope="session")
def fixtures_dir():
    return DEFAULT_DIR


@pytest.fixture(scope="session")
def manifest():
    return load_manifest(DEFAULT_DIR)


@pytest.fixture(autouse=True)
def _quiet_resets():
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    yield
