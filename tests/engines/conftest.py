"""Shared fixtures of the engine tests: quiet seq-len resets (the committed suite: tests/conftest.py)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet_resets():
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    yield
