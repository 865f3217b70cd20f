"""The fuzz suite's shared base (built once per session; every draw works on a copy)."""

from __future__ import annotations

import logging

import pytest

from .sandbox import build_base


@pytest.fixture(scope="session")
def base(tmp_path_factory):
    logging.getLogger("gdncheck").setLevel(logging.ERROR)
    return build_base(tmp_path_factory.mktemp("fuzz-base"))
