"""Helpers of the conformance tests: outputs written straight from the goldens (a perfect port),
then altered one way at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gdncheck.fixtures.manifest import load_manifest
from gdncheck.safetensors_io import SafetensorsFile, write_safetensors


def case_entry(fixtures_dir, prefix: str) -> dict:
    return next(c for c in load_manifest(fixtures_dir)["cases"] if c["id"].startswith(prefix))


def perfect_outputs(fixtures_dir, prefix: str, out_dir, *, alter=None, meta=None, dtypes=None) -> Path:
    """The outputs file of a port whose every expected tensor equals the golden (rounded to float32).
    ``alter(tensors)`` changes the dict before writing; ``meta`` updates the metadata."""
    entry = case_entry(fixtures_dir, prefix)
    gold = SafetensorsFile(Path(fixtures_dir) / entry["file"])
    tensors = {}
    for step in entry["program"]:
        if step["op"] in ("forward", "decode"):
            for name in step["expected"]:
                key = f"calls.{step['call']}.{name}"
                tensors[key] = gold.read(key).astype(np.float32)
            tensors[f"calls.{step['call']}.seq_len"] = np.asarray(step["seq_len_after"], dtype=np.int64)
    if alter:
        alter(tensors)
    md = {"format": "gdncheck-outputs", "format_version": "1", "case": entry["id"], "implementation": "golden copy",
          "profile": "f32", "fixture_sha256": entry["sha256"]}
    md.update(meta or {})
    path = Path(out_dir) / f"{entry['id']}.safetensors"
    write_safetensors(path, tensors, {k: v for k, v in md.items() if v is not None}, dtypes)
    return path
