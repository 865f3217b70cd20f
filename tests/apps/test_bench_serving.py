"""Smoke test of the serving benchmark's code path at tiny sizes (``serving --quick``): its table and JSON
have every field, and the packed and separate calls it times agree. Timings are never checked here."""

from __future__ import annotations

import json

import pytest

from gdncheck import bench
from gdncheck.bench import common as bench_common
from gdncheck.bench import serving as bench_serving

FIGURE_KEYS = {"seconds", "min_seconds", "runs", "cpu_seconds", "sys_seconds", "peak_mib"}


def test_quick_serving_bench_table_and_json(tmp_path, capsys):
    path = tmp_path / "serving.json"
    assert bench.main(["serving", "--quick", "--threads", "1", "--lengths", "1,64,65", "--json", str(path)]) == 0
    out, result = capsys.readouterr().out, json.loads(path.read_text())
    assert result["config"] == bench_common.QUICK.summary() and result["lengths"] == [1, 64, 65]
    assert result["total_tokens"] == 130 and result["pool_size"] == 3 + bench_serving.POOL_EXTRA
    (row,) = result["rows"]
    for key in ("packed", "separate"):
        assert set(row[key]) == FIGURE_KEYS and len(row[key]["runs"]) == 1
    assert row["packed_vs_separate"] <= 1e-12  # the difference the benchmark prints is a real one
    assert "| threads | packed | separate | packed/separate |" in out
    assert sum(line.startswith("| 1 |") for line in out.splitlines()) == 1


def test_default_lengths_are_eight_sequences_of_1_to_2048():
    assert len(bench_serving.LENGTHS) == 8 and min(bench_serving.LENGTHS) == 1 and max(bench_serving.LENGTHS) == 2048


@pytest.mark.parametrize("text", ["0,3", "a", ""])
def test_bad_lengths_are_refused(text, capsys):
    with pytest.raises(SystemExit) as info:
        bench.main(["serving", "--quick", "--lengths", text])
    assert info.value.code == 2
    assert "sequence lengths >= 1" in capsys.readouterr().err
