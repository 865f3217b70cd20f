"""The committed default suite: format, checksums, precision promises, coverage, and the goldens
themselves against an independent scalar implementation of the layer."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from gdncheck.config import GDNConfig
from gdncheck.dtypes import is_representable
from gdncheck.fixtures.build import build_suite, check_suite
from gdncheck.fixtures.manifest import SCHEMA_PATH, FixtureError, sha256_file
from gdncheck.safetensors_io import SafetensorsFile
from tests.reference.naive_layer import naive_layer

ID = re.compile(r"^[a-z0-9.-]+_T\d+_Hk\d+_Hv\d+_dk\d+_dv\d+_s\d+$")


def test_manifest_matches_its_schema_and_files(fixtures_dir, manifest):
    raw = json.loads((fixtures_dir / "manifest.json").read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(raw)
    total = 0
    for c in manifest["cases"]:
        assert ID.match(c["id"]), c["id"]
        assert c["file"] == c["id"] + ".safetensors"
        assert sha256_file(fixtures_dir / c["file"]) == c["sha256"]
        assert (fixtures_dir / c["file"]).stat().st_size == c["bytes"]
        assert c["generator"]["numpy"] and c["config_summary"].startswith("D=")
        total += c["bytes"]
    assert total <= 40e6, f"default suite is {total / 1e6:.1f} MB, budget 40 MB"
    stored = {p.name for p in fixtures_dir.glob("*.safetensors")}
    assert stored == {c["file"] for c in manifest["cases"]}, "files on disk and manifest differ"


def test_weights_and_inputs_exact_in_bf16_and_f16_expected_in_f64(fixtures_dir, manifest):
    for c in manifest["cases"]:
        f = SafetensorsFile(fixtures_dir / c["file"])
        for key in f:
            if key.startswith("weights.") or key.endswith(".x"):
                if f.dtype_of(key) == "I32":
                    continue  # the input-dtype error case
                arr = f.read(key)
                assert is_representable(arr, "bf16") and is_representable(arr, "f16"), (c["id"], key)
            else:
                assert f.dtype_of(key) == "F64", (c["id"], key)
        for step in c["program"]:
            if step["op"] in ("forward", "decode") and c["kind"] == "forward":
                for name in step["expected"]:
                    shape = f.shape_of(f"calls.{step['call']}.{name}")
                    assert shape[0] == c["batch"]
                if c["state_in"]:
                    assert f"calls.{step['call']}.recurrent_state_in" in f


def _gold(fixtures_dir, manifest, prefix):
    c = next(c for c in manifest["cases"] if c["id"].startswith(prefix))
    return c, SafetensorsFile(fixtures_dir / c["file"])


def test_goldens_agree_with_the_independent_scalar_layer(fixtures_dir, manifest):
    """naive_layer (tests/reference) shares no code with the reference that built the goldens."""
    for prefix in ("decode_T12", "prefill_T1_", "one-key-head"):
        c, f = _gold(fixtures_dir, manifest, prefix)
        cfg = GDNConfig.from_hf(c["config"])
        weights = {k[8:]: f.read(k) for k in f if k.startswith("weights.")}
        conv, S = None, None
        for step in c["program"]:
            if step["op"] not in ("forward", "decode"):
                continue
            x = f.read(f"calls.{step['call']}.x")[0].tolist()
            out, conv, S = naive_layer(cfg, weights, x, conv, S)
            gold = f.read(f"calls.{step['call']}.out")[0]
            np.testing.assert_allclose(np.array(out), gold, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.array(S), f.read(f"calls.{step['call']}.recurrent_state")[0], rtol=1e-9,
                                   atol=1e-12)


def test_the_suite_covers_the_issue_list(fixtures_dir, manifest):
    fwd = [c for c in manifest["cases"] if c["kind"] == "forward"]
    ops = {c["id"]: [s["op"] for s in c["program"]] for c in fwd}
    calls = {c["id"]: [s for s in c["program"] if s["op"] in ("forward", "decode")] for c in fwd}
    cfgs = {c["id"]: GDNConfig.from_hf(c["config"]) for c in fwd}
    assert any(all(s["op"] == "forward" for s in calls[i]) and len(calls[i]) == 1 for i in calls)  # prefill only
    assert any(all(s["op"] == "decode" for s in calls[i]) for i in calls)  # decode only
    assert any(sum(s["op"] == "forward" and s["T"] > 1 for s in calls[i]) >= 3 for i in calls)  # prefill segments
    Ts = {s["T"] for cs in calls.values() for s in cs}
    assert 1 in Ts and any(t % 64 for t in Ts if t > 64)
    assert {c.num_v_heads // c.num_k_heads for c in cfgs.values()} >= {1, 2, 3, 4}
    assert {c["norm_mode"] for c in fwd} == {"shared", "per_head"}
    assert any({"snapshot", "restore", "save", "load"} <= set(o) for o in ops.values())
    assert any(sum(s["T"] for s in cs if s["op"] == "decode") >= 2048 for cs in calls.values())
    assert any(len(set(s["seq_pos"])) > 1 for cs in calls.values() for s in cs)  # rows at different positions
    real = {(c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim) for c in cfgs.values()}
    assert {(16, 32, 128, 128), (16, 48, 128, 128)} <= real
    # resets: a call whose seq_pos differs from where its row stood (restore-mismatch, mid-stream)
    resets = [i for i, c in ((c["id"], c) for c in fwd) if _has_mismatch(c)]
    assert any(i.startswith("restore-mismatch") for i in resets) and any(i.startswith("mismatch-midstream")
                                                                       for i in resets)
    codes = {c["expected_error"]["code"] for c in manifest["cases"] if c["kind"] == "error"}
    assert codes >= {"missing_head_setting", "head_ratio", "projection_size", "missing_weight", "conv_kernel_mismatch",
                     "invalid_eps", "norm_mode_conflict", "norm_weight_size", "input_shape", "input_dtype"}


def test_the_dimension_mix_is_that_of_real_models(manifest):
    """Most forward cases have dk = dv, Hk > 1, Hv/Hk > 1 and a call that enters with a state (a port
    restricted to dk = dv is judged on nearly everything; a wrong head order cannot hide); dk != dv
    has cases of its own. The serving cases have the real mix too (dk = dv = 16, two key heads of two
    value heads): a dk = dv port is judged on every serving pattern."""
    fwd = [c for c in manifest["cases"] if c["kind"] == "forward"]
    plain = [c for c in fwd if not c["regime"].startswith("serving: ")]
    serving = [c for c in fwd if c["regime"].startswith("serving: ")]

    def real_mix(c):
        cfg = GDNConfig.from_hf(c["config"])
        continued = sum(s["op"] in ("forward", "decode") for s in c["program"]) > 1
        return cfg.head_k_dim == cfg.head_v_dim and cfg.num_k_heads > 1 and cfg.head_ratio > 1 and continued

    assert sum(map(real_mix, plain)) >= 0.6 * len(plain)
    assert len(serving) >= 4
    for c in serving:
        cfg = GDNConfig.from_hf(c["config"])
        assert cfg.head_k_dim == cfg.head_v_dim and cfg.num_k_heads > 1 and cfg.head_ratio > 1, c["id"]
    ne = [c for c in fwd if GDNConfig.from_hf(c["config"]).head_k_dim != GDNConfig.from_hf(c["config"]).head_v_dim]
    assert 2 <= len(ne) <= 0.1 * len(fwd) and all("dk-ne-dv" in c["tags"] for c in ne), [c["id"] for c in ne]


def test_every_case_states_its_regime_and_what_it_exposes(manifest):
    from gdncheck.fixtures.cases import EDGES

    fwd = [c for c in manifest["cases"] if c["kind"] == "forward"]
    assert all(c["exposes"] for c in manifest["cases"])
    regimes = [c["regime"] for c in fwd]
    assert set(EDGES.values()) <= set(regimes)  # every edge has its case
    # the sparse cases are built for their routing (router, experts and stream; their attention half is
    # realistic since issue 24, and their regime says so): the realistic share is that of the dense cases
    sparse = [c for c in fwd if c["regime"].startswith("sparse: ")]
    assert sparse and all("moe" in c["tags"] for c in sparse)
    # the serving cases likewise (their weights and stream are the serving work's): their own regime
    serving = [c for c in fwd if c["regime"].startswith("serving: ")]
    assert len(serving) == 4 and all("packed" in c["tags"] for c in serving)
    assert all(c["regime"] in ("realistic", *EDGES.values()) for c in fwd if c not in sparse and c not in serving)
    assert regimes.count("realistic") >= 0.6 * (len(fwd) - len(sparse) - len(serving))
    assert all(c["regime"].startswith("error: ") for c in manifest["cases"] if c["kind"] == "error")


def _tensor(f, c, name):
    return [f.read(f"calls.{s['call']}.{name}") for s in c["program"]
            if s["op"] in ("forward", "decode") and f"calls.{s['call']}.{name}" in f]


def test_realistic_cases_remember_and_have_real_activation_sizes(fixtures_dir, manifest):
    """In the realistic cases typical heads remember for hundreds of tokens and q, k before their
    norm are far from the L2 norm's eps (read off the goldens)."""
    decays, sq = [], []
    for c in manifest["cases"]:
        if c["kind"] != "forward" or c["regime"] != "realistic":
            continue
        f = SafetensorsFile(fixtures_dir / c["file"])
        cfg = GDNConfig.from_hf(c["config"])
        decays += [np.exp(g).ravel() for g in _tensor(f, c, "g")]
        for u in _tensor(f, c, "qkv_conv"):
            qk = u[..., : 2 * cfg.key_dim].reshape(*u.shape[:-1], 2 * cfg.num_k_heads, cfg.head_k_dim)
            sq.append(np.sum(qk * qk, axis=-1).ravel())
    d, sq = np.concatenate(decays), np.concatenate(sq)
    assert np.median(d) > 0.98 and np.mean(d > 0.99) > 0.4  # a memory of 100 tokens and more
    assert np.mean(d < 0.1) < 0.3  # transformers' initialisation (fast forgetting) for a minority of heads
    assert np.quantile(sq, 0.01) > 1e-2  # no q or k anywhere near the eps 1e-6


def test_each_edge_case_reaches_its_edge(fixtures_dir, manifest):
    """Read off the goldens: every edge case puts its nonlinearity where its misuse shows."""
    from gdncheck.fixtures.cases import EDGES

    def case(edge):
        c = next(c for c in manifest["cases"] if c.get("regime") == EDGES[edge])
        return c, SafetensorsFile(fixtures_dir / c["file"]), GDNConfig.from_hf(c["config"])

    c, f, cfg = case("rmsnorm-eps")
    for name in ("x", "h"):
        ms = np.concatenate([np.mean(t * t, axis=-1).ravel() for t in _tensor(f, c, name)])
        assert np.mean((ms > 1e-7) & (ms < 1e-5)) > 0.25, name  # a third of the tokens near eps = 1e-6
    c, f, cfg = case("qk-eps")
    u = np.concatenate(_tensor(f, c, "qkv_conv"), axis=1)
    q = u[..., cfg.head_k_dim: 2 * cfg.head_k_dim]  # key head 1's q
    assert 2e-7 < np.median(np.sum(q * q, axis=-1)) < 5e-6
    c, f, cfg = case("gated-eps")
    core = np.concatenate(_tensor(f, c, "core"), axis=1)[..., 2, :]
    assert 1e-8 < np.median(np.mean(core * core, axis=-1)) < 1e-6
    c, f, cfg = case("softplus")
    g = np.concatenate(_tensor(f, c, "g"), axis=1)
    x = np.concatenate(_tensor(f, c, "a"), axis=1) + f.read("weights.linear_attn.dt_bias")
    assert g.max() > -1e-12 and g.min() < -100 and x.max() > 20 and x.min() < -20
    assert np.any((x < -15) & (g < -1e-3))  # softplus underflows in f32 where the decay still matters
    c, f, cfg = case("sigmoid")
    beta, g = np.concatenate(_tensor(f, c, "beta"), axis=1), np.concatenate(_tensor(f, c, "g"), axis=1)
    assert beta.min() < 1e-9 and beta.max() > 1 - 1e-9
    one_token = [s["call"] for s in c["program"] if s["op"] == "forward" and s["T"] == 1]
    assert any(np.any((f.read(f"calls.{k}.g") < -18) & (f.read(f"calls.{k}.beta") < 1e-8)) for k in one_token)
    c, f, cfg = case("state-norms")
    S = _tensor(f, c, "recurrent_state")[-1]
    norms = np.linalg.norm(S, axis=(2, 3))
    assert norms.max() > 1000 and norms.min() < 1e-3
    assert np.concatenate(_tensor(f, c, "g"), axis=1).max() > -1e-7  # a decay of 1 - 1e-8
    c, f, cfg = case("f16-state")
    g, beta = np.concatenate(_tensor(f, c, "g"), axis=1), np.concatenate(_tensor(f, c, "beta"), axis=1)
    # every decay moves the state by more than 1e-4 of itself a token, yet by less than half an f16 ulp
    # (2.44e-4 of a value at best), so a state stored in f16 does not decay at all
    assert -g.max() > 1e-4 and -g.min() < 2.44e-4
    assert beta[:, :8].min() > 0.9 and beta[:, 8:].max() < 1e-5  # strong writes, then writes below f16's rounding
    S = _tensor(f, c, "recurrent_state")[0]
    assert np.mean(np.abs(S) > 2.0 ** -14) > 0.9  # in f16's normal range: frozen, not flushed


def _has_mismatch(case) -> bool:
    pos = [0] * case["batch"]
    slots, files = {}, {}
    for s in case["program"]:
        if s["op"] == "snapshot":
            slots[s["slot"]] = list(pos)
        elif s["op"] == "save":
            files[s["file"]] = slots[s["slot"]]
        elif s["op"] == "load":
            slots[s["slot"]] = files[s["file"]]
        elif s["op"] == "restore":
            pos = list(slots[s["slot"]])
        elif s["op"] == "reset":
            pos = [0] * case["batch"]
        elif s["op"] in ("forward", "decode"):
            if list(s["seq_pos"]) != pos and any(p != 0 for p in s["seq_pos"]):
                return True
            pos = list(s["seq_len_after"])
    return False


def test_build_is_deterministic(tmp_path):
    a = build_suite("default", tmp_path / "a", names=["snapshot-replay", "error-input-dtype"])
    b = build_suite("default", tmp_path / "b", names=["snapshot-replay", "error-input-dtype"])
    assert [c["sha256"] for c in a["cases"]] == [c["sha256"] for c in b["cases"]]
    for c in a["cases"]:
        assert (tmp_path / "a" / c["file"]).read_bytes() == (tmp_path / "b" / c["file"]).read_bytes()
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()


def test_fixtures_check_reproduces_the_committed_suite(fixtures_dir):
    """Bit for bit, on any CPU (the golden arithmetic; test_fixtures_portable.py tries other kernels)."""
    report = check_suite(fixtures_dir)
    bad = [r for r in report if r["status"] != "identical"]
    assert not bad, bad
    assert len(report) >= 29


def test_fixtures_check_detects_drift(fixture_copy):
    path = fixture_copy / "manifest.json"
    doc = json.loads(path.read_text())
    step = doc["cases"][0]["program"][1]  # the recipe in the manifest no longer matches the suite's
    step["T"] += 1
    step["seq_len_after"] = [n + 1 for n in step["seq_len_after"]]  # (consistent with itself, FORMAT.md §2)
    path.write_text(json.dumps(doc))
    target = next(c for c in doc["cases"] if c["id"].startswith("decode_T12"))
    data = bytearray((fixture_copy / target["file"]).read_bytes())
    data[-8:] = b"\x00" * 8  # the file no longer matches its checksum
    (fixture_copy / target["file"]).write_bytes(bytes(data))
    report = {r["id"]: r for r in check_suite(fixture_copy)}
    assert report[doc["cases"][0]["id"]]["status"] == "changed"
    assert report[target["id"]]["status"] == "changed" and "sha256" in report[target["id"]]["detail"]
    others = {i: r["status"] for i, r in report.items() if i not in (doc["cases"][0]["id"], target["id"])}
    assert len(others) == len(doc["cases"]) - 2 and set(others.values()) == {"identical"}, others


@pytest.mark.parametrize("suite_name", ["full"])
def test_full_suite_lists_real_sizes(suite_name):
    from gdncheck.fixtures.cases import suite

    ids = [s.case_id(0) for s in suite(suite_name)]
    assert len(ids) == len(set(ids))
    assert any(i.startswith("qwen3.5-27b_T102_Hk16_Hv48_dk128_dv128") for i in ids)


def test_fixtures_from_a_checkpoint(tmp_path):
    """--from-checkpoint: goldens from a (synthetic) Hugging Face checkpoint's layer, verified with the
    global bounds, rebuilt identically by check."""
    from gdncheck.conformance.judge.verify import verify
    from gdncheck.conformance.ports.run import run_impl
    from gdncheck.fixtures.build import build_checkpoint_suite
    from gdncheck.synthetic import make_weights, write_hf_checkpoint

    cfg = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                    head_v_dim=8)
    ckpt = write_hf_checkpoint(tmp_path / "ckpt", cfg, {1: make_weights(cfg, 7)}, num_layers=2)
    doc = build_checkpoint_suite(ckpt, 1, tmp_path / "fx")
    assert [c["id"].split("_")[0] for c in doc["cases"]] == ["ckpt-l1-prefill-decode", "ckpt-l1-segments",
                                                              "ckpt-l1-decode"]
    assert doc["source"]["layer"] == 1
    run_impl("reference", tmp_path / "fx", tmp_path / "out", "bf16")
    s = verify(tmp_path / "fx", tmp_path / "out", "bf16")
    assert s.exit_code == 0
    assert {r.bound["source"] for c in s.cases for r in c.records if r.bound} == {"global"}
    assert {r["status"] for r in check_suite(tmp_path / "fx", checkpoint=ckpt)} == {"identical"}
    with pytest.raises(FixtureError, match="--checkpoint DIR"):  # never the folder the manifest names
        check_suite(tmp_path / "fx")
