"""A runner of the issue-36 serving steps written from fixtures/FORMAT.md §4.1 alone ("A mixed call in a
runner" and the `forward_mixed` / `commit` rows): it reads the manifest and the case files, keeps the pool
as three NumPy arrays, and runs each sequence as a plain call of the layer on a one-row state — none of
gdncheck's serving code (no reference.serving, no harness, no gdncheck.calls). Its outputs and pools
must match the goldens of the committed-suite recipes `mixed-batch` and `spec-prefix-cache` to float64
rounding: the format says enough for a port to implement the new steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.fixtures.build import build_suite
from gdncheck.reference import Layer
from gdncheck.safetensors_io import SafetensorsFile

RECIPES = ("mixed-batch", "spec-prefix-cache")


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed-fixtures")
    build_suite("serving", out, names=list(RECIPES))
    return out


class FormatRunner:
    """FORMAT.md §4.1 as read by a port author: pool = (conv [S, conv_dim, K], rec [S, Hv, dk, dv], seq_len [S])."""

    def __init__(self, layer: Layer, size: int):
        self.layer = layer
        st = layer.new_state(size)
        self.conv, self.rec, self.seq_len = st.conv_state.copy(), st.recurrent_state.copy(), st.seq_len.copy()
        self.kept: dict[int, tuple] = {}  # call -> (layout, per-sequence states after each token)

    def _one(self, slot: int, pos: int):
        """A one-row state holding slot ``slot`` (zeros for -1; zeros too when its seq_len is not pos)."""
        one = self.layer.new_state(1)
        one.warned = True
        if slot != -1 and self.seq_len[slot] == pos:
            one.conv_state[0], one.recurrent_state[0] = self.conv[slot], self.rec[slot]
        one.seq_len[0] = pos
        return one

    def _put(self, slot: int, conv, rec, seq_len: int) -> None:
        self.conv[slot], self.rec[slot], self.seq_len[slot] = conv, rec, seq_len

    def forward_mixed(self, x, step):
        cu, pos, slots, verify = step["cu_seqlens"], step["seq_pos"], step["slots"], step["verify"]
        outs, finals, steps = [], [], []
        for i in range(len(slots)):
            one = self._one(slots[i], pos[i])
            xi = x[cu[i]:cu[i + 1]]
            if verify[i]:  # one token at a time, keeping the state after each
                after, rows = [], []
                for j in range(xi.shape[0]):
                    out, _ = self.layer.forward(xi[None, j:j + 1], one, np.array([pos[i] + j]))
                    rows.append(out[0])
                    after.append((one.conv_state[0].copy(), one.recurrent_state[0].copy()))
                outs.append(np.concatenate(rows))
                steps.append(after)
                finals.append(None)
            else:
                out, _ = self.layer.forward(xi[None], one, np.array([pos[i]]))
                outs.append(out[0])
                steps.append(None)
                finals.append((one.conv_state[0].copy(), one.recurrent_state[0].copy()))
        for i, slot in enumerate(slots):  # only once every row ran
            if finals[i] is not None and slot != -1:
                self._put(slot, *finals[i], pos[i] + cu[i + 1] - cu[i])
        self.kept[step["call"]] = (step, steps)
        return np.concatenate(outs)

    def commit(self, step):
        call, steps = self.kept.pop(step["of_call"])
        for i, (slot, n) in enumerate(zip(call["slots"], step["accepted"])):
            if slot != -1 and n >= 1:
                self._put(slot, *steps[i][n - 1], call["seq_pos"][i] + n)
        for i, o, d in zip(step.get("snap_seq", []), step.get("snap_offset", []), step.get("snap_slot", [])):
            self._put(d, *steps[i][o - 1], call["seq_pos"][i] + o)

    def forward_packed(self, x, step, snaps=False):
        cu, pos, slots = step["cu_seqlens"], step["seq_pos"], step["slots"]
        want = {}
        for i, o, d in zip(step.get("snap_seq", []), step.get("snap_offset", []), step.get("snap_slot", [])):
            want.setdefault(i, []).append((o, d))
        outs, writes = [], []
        for i, slot in enumerate(slots):
            one = self._one(slot, pos[i])
            xi, done = x[cu[i]:cu[i + 1]], 0
            for o, d in sorted(want.get(i, [])) + [(xi.shape[0], slot)]:
                if o > done:
                    out, _ = self.layer.forward(xi[None, done:o], one, np.array([pos[i] + done]))
                    outs.append(out[0])
                    done = o
                if d != -1:
                    writes.append((d, one.conv_state[0].copy(), one.recurrent_state[0].copy(), pos[i] + o))
        for w in writes:
            self._put(*w)
        return np.concatenate(outs)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_runner_from_the_format_alone_reproduces_the_goldens(suite_dir, recipe):
    manifest = json.loads((suite_dir / "manifest.json").read_text())
    entry = next(c for c in manifest["cases"] if c["id"].startswith(recipe + "_"))
    gold = SafetensorsFile(suite_dir / entry["file"])
    weights = {k[len("weights."):]: np.asarray(gold.read(k), dtype=np.float64) for k in gold
               if k.startswith("weights.")}
    runner = FormatRunner(Layer(GDNConfig.from_hf(entry["config"]), weights), entry["batch"])
    ops = set()
    for step in entry["program"]:
        op = step["op"]
        ops.add(op)
        if op == "construct":
            continue
        k = step["call"]
        x = np.asarray(gold.read(f"calls.{k}.x"), dtype=np.float64) if op != "commit" else None
        if op == "forward_mixed":
            out = runner.forward_mixed(x, step)
        elif op == "verify_spec":  # a mixed call of verify rows only
            out = runner.forward_mixed(x, {**step, "verify": [1] * len(step["slots"])})
        elif op == "commit":
            out = runner.commit(step)
        else:
            assert op in ("forward_packed", "prefix_snapshots"), op
            out = runner.forward_packed(x, step)
        if out is not None:
            want = gold.read(f"calls.{k}.out")
            assert np.abs(out - want).max() <= 1e-9 * max(1.0, np.abs(want).max()), (recipe, k)
        np.testing.assert_allclose(runner.rec, gold.read(f"calls.{k}.recurrent_state"), rtol=0, atol=1e-9)
        np.testing.assert_allclose(runner.conv, gold.read(f"calls.{k}.conv_state"), rtol=0, atol=1e-9)
        np.testing.assert_array_equal(runner.seq_len, step["seq_len_after"])
    assert "commit" in ops and ("forward_mixed" in ops) == (recipe == "mixed-batch")
