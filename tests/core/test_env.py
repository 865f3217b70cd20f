"""GDN_BLAS_THREADS: unset or empty is 1; a typo stops the command with what was expected and found."""

from __future__ import annotations

import pytest

from gdncheck.env import blas_threads
from gdncheck.errors import GDNError


@pytest.mark.parametrize(("text", "n"), [(None, 1), ("", 1), (" 2 ", 2), ("4", 4)])
def test_blas_threads_reads_the_variable(monkeypatch, text, n):
    if text is None:
        monkeypatch.delenv("GDN_BLAS_THREADS", raising=False)
    else:
        monkeypatch.setenv("GDN_BLAS_THREADS", text)
    assert blas_threads() == n


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_blas_threads_refuses_a_bad_value(monkeypatch, text):
    monkeypatch.setenv("GDN_BLAS_THREADS", text)
    with pytest.raises(GDNError, match=rf"GDN_BLAS_THREADS: expected a positive integer .* found '{text}'"):
        blas_threads()
