"""The property suite under pytest, against the implementation named by GDN_IMPL in GDN_PROFILE
(default: the reference in f32), the array-api-tests way::

    GDN_IMPL=triton GDN_PROFILE=bf16 GDN_HYPOTHESIS_PROFILE=ci python -m pytest tests/properties/test_env_subject.py
"""

from __future__ import annotations

import os

import pytest

from gdncheck.conformance.properties import PROPERTIES
from gdncheck.conformance.properties.registry import subject_from_env
from gdncheck.conformance.properties.runner import format_result, run_property


@pytest.mark.parametrize("name", sorted(PROPERTIES))
def test_property(name):
    hyp = os.environ.get("GDN_HYPOTHESIS_PROFILE") or "dev"
    r = run_property(name, subject_from_env(), hypothesis_profile=hyp, max_examples=None)
    if r.status == "skip":
        pytest.skip(r.message)
    assert r.status == "pass", format_result(r)
