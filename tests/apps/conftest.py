"""Shared fixtures of the tests of the command line (gdncheck/cli.py, gdncheck/commands/, gdncheck/bench/) and
what holds across its commands: quiet seq-len resets (the committed suite and its copies:
tests/conftest.py)."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet_resets():
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    yield
