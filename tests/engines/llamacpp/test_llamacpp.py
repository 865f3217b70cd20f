"""llama.cpp (its qwen35 and qwen35moe model paths through llama-cpp-python) through the harness: dense dk = dv cases
conform in f32 and bf16 end to end as a plug-in (``gdncheck run
gdncheck.conformance.engines.llamacpp.adapter:llamacpp`` then ``gdncheck verify``), so do the sparse block's cases
in bf16, and in f32 every tensor of the block (its one deviation, the softplus of g, shows in g alone), mutants of
the glue (the state layout, the value-head order, the routing weights' tensor, the experts' gate/up order in the
checkpoint, the shared expert's gate) are caught at their
stage, what llama.cpp cannot express is not applicable with its reason, and a machine without llama-cpp-python gets
one line saying how to install it."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from gdncheck.cli import main as cli
from gdncheck.errors import GDNError

PLUGIN = "gdncheck.conformance.engines.llamacpp.adapter:llamacpp"


def _module():
    from gdncheck.conformance.engines.llamacpp import adapter as module

    return module


def test_a_machine_without_llama_cpp_gets_one_line_saying_how_to_install_it(monkeypatch):
    module = _module()
    monkeypatch.setattr(module, "_ENGINE", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # find_spec now says: not there
    with pytest.raises(GDNError) as exc:
        module.engine()
    assert str(exc.value) == module.NOT_INSTALLED
    assert str(exc.value).startswith("implementation 'llamacpp' needs llama-cpp-python (built from its sdist: ")
    assert "\n" not in str(exc.value)


def test_value_heads_map_back_from_tiled_to_grouped():
    module = _module()
    Hk, Hv = 2, 6  # grouped: [g0v0 g0v1 g0v2 g1v0 g1v1 g1v2]; tiled: [g0v0 g1v0 g0v1 g1v1 g0v2 g1v2]
    grouped = np.array([0, 1, 2, 10, 11, 12])
    tiled = np.array([0, 10, 1, 11, 2, 12])
    assert np.array_equal(module.heads_to_hf(tiled, 0, Hk, Hv), grouped)
    assert np.array_equal(module.heads_to_hf(grouped[:3], 0, 1, 3), grouped[:3])  # one key head: nothing moves
    S = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert module.recurrent_to_format(S).shape == (2, 4, 3)


def test_refusal_codes_name_the_tensor_llama_cpp_names():
    module = _module()
    assert module.refusal_code("llama_model_load: error loading model: missing tensor 'blk.0.ffn_up.weight'") \
        == "missing_weight"
    assert module.refusal_code("tensor 'blk.0.ssm_norm.weight' has wrong shape; expected     4, got     8") \
        == "norm_weight_size"
    assert module.refusal_code("tensor 'blk.0.ssm_conv1d.weight' has wrong shape; expected     4,    16, got     3,"
                               "    16") == "conv_kernel_mismatch"
    assert module.refusal_code("tensor 'blk.0.attn_qkv.weight' has wrong shape; expected     8,    16, got     8,"
                               "    17") == "projection_size"
    assert module.refusal_code("llama_model_load: error loading model: check_tensor_dims: tensor "
                               "'blk.0.ffn_gate_inp.weight' not found") == "missing_weight"
    assert module.refusal_code("check_tensor_dims: tensor 'blk.0.ffn_gate_exps.weight' has wrong shape; expected "
                               "     8,      4,      4, got      8,      2,      4,      1") == "weight_shape"


def test_experts_are_written_one_by_one_unless_their_shape_is_wrong():
    """A checkpoint's per-expert names (the converter stacks them again); a gate_up_proj of the wrong shape stays
    stacked, for the converter to split and llama.cpp's loader to refuse by name."""
    from gdncheck.config import GDNConfig
    from gdncheck.synthetic import make_weights

    module = _module()
    cfg = GDNConfig(hidden_size=8, intermediate_size=None, num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4,
                    conv_kernel=4, rms_norm_eps=1e-6, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=4,
                    shared_expert_intermediate_size=4)
    w = {k: np.asarray(v) for k, v in make_weights(cfg).items()}
    out = module.checkpoint_experts(cfg, w)
    assert "mlp.experts.gate_up_proj" not in out and "mlp.gate.weight" in out
    assert np.array_equal(out["mlp.experts.2.gate_proj.weight"], w["mlp.experts.gate_up_proj"][2, :4])
    assert np.array_equal(out["mlp.experts.2.up_proj.weight"], w["mlp.experts.gate_up_proj"][2, 4:])
    assert np.array_equal(out["mlp.experts.1.down_proj.weight"], w["mlp.experts.down_proj"][1])
    bad = {**w, "mlp.experts.gate_up_proj": w["mlp.experts.gate_up_proj"][:, :4]}
    assert module.checkpoint_experts(cfg, bad) is bad


@pytest.fixture
def llama(request):
    """The engine (llama-cpp-python and the vendored converter), or a skip saying what is missing."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (built from its sdist)")
    module = _module()
    try:
        return module.engine()
    except GDNError as exc:
        pytest.skip(str(exc))


def _run_verify(tmp_path, profile: str, cases: list[str], name: str = "out") -> tuple[int, dict]:
    out = tmp_path / f"{name}-{profile}"
    selection = [a for c in cases for a in ("--case", c)]
    assert cli(["run", PLUGIN, "--profile", profile, "--out", str(out), "-q", *selection]) == 0
    rc = cli(["verify", "--outputs", str(out), "--profile", profile, "-q", "--diagnose", "0", *selection])
    return rc, json.loads((out / f"verify-summary-{profile}.json").read_text())


#: dense dk = dv cases that conform in f32: a one-token decode stream (Hv/Hk = 2), a prefill continued by two more
#: calls (one key head, Hv = 4), gates at the sigmoid's edges over four calls
CASES_F32 = ["decode_T12", "one-key-head_T68", "sigmoid-edges_T27"]


def test_llama_cpp_conforms_on_dense_cases_in_f32(llama, tmp_path):
    rc, summary = _run_verify(tmp_path, "f32", CASES_F32)
    statuses = {c["id"].split("_")[0]: c["status"] for c in summary["cases"]}
    assert rc == 0, statuses
    assert set(statuses.values()) == {"pass"} and len(statuses) == len(CASES_F32)
    assert all("llama.cpp" in c.get("implementation", "llama.cpp") for c in summary["cases"])


def test_llama_cpp_conforms_on_a_batched_prefill_then_decode_in_bf16(llama, tmp_path):
    rc, summary = _run_verify(tmp_path, "bf16", ["prefill-decode_T65", "batch-positions_T20"])
    assert rc == 0 and {c["status"] for c in summary["cases"]} == {"pass"}, [c["status"] for c in summary["cases"]]


def test_llama_cpp_softplus_deviation_is_localised_in_g(llama, tmp_path):
    """ggml's softplus is logf(1 + expf(x)) (conformance/engines/llamacpp/repros/llamacpp_softplus.py): in f32 the
    realistic prefill-then-decode fails in g alone; every other tensor of every call, states included, is within
    its bound."""
    rc, summary = _run_verify(tmp_path, "f32", ["prefill-decode_T65"])
    (c,) = summary["cases"]
    assert rc == 1 and c["status"] == "fail"
    assert c["first_divergence"]["stage"] == "gates" and c["first_divergence"]["tensor"] == "g"
    assert {r["tensor"] for r in c["records"] if r.get("verdict") == "fail"} == {"g"}


# --- the sparse block (qwen35moe) -------------------------------------------------------------------------
#: the sparse cases llama.cpp can be asked (dk = dv, renormalised routing): 256 experts / 8 over prefill segments,
#: and three zero router rows tying exactly on the k boundary
MOE_CASES = ["moe-e256-k8", "moe-exact-tie"]
MOE_STAGES = ("router", "routing", "experts", "shared_expert", "mlp")


def test_llama_cpp_conforms_on_the_sparse_block_in_bf16(llama, tmp_path):
    rc, summary = _run_verify(tmp_path, "bf16", MOE_CASES)
    statuses = {c["id"].split("_")[0]: c["status"] for c in summary["cases"]}
    assert rc == 0 and set(statuses.values()) == {"pass"} and len(statuses) == 2, statuses
    for c in summary["cases"]:
        judged = {r["tensor"] for r in c["records"] if r["stage"] in MOE_STAGES and r["verdict"] == "pass"}
        assert judged == {"router_logits", "routing_weights", "selected_experts", "experts_out", "shared_out",
                          "mlp_out"}, (c["id"], judged)
        assert "qwen35moe" in c.get("implementation", "qwen35moe")


def test_llama_cpp_sparse_block_conforms_in_f32_where_only_g_deviates(llama, tmp_path):
    """In f32 the sparse cases fail, in g alone (ggml's softplus: the realistic attention half has long-memory
    heads, where logf(1 + expf(x)) loses its relative precision); every tensor of the block, in every call, is
    within its bound, and the exact ties are llama.cpp's argsort's convention, judged for its own experts."""
    rc, summary = _run_verify(tmp_path, "f32", MOE_CASES)
    assert rc == 1
    for c in summary["cases"]:
        assert c["status"] == "fail" and c["first_divergence"]["tensor"] == "g", c["first_divergence"]
        assert {r["tensor"] for r in c["records"] if r["verdict"] != "pass"} == {"g"}, c["id"]
        block = [r for r in c["records"] if r["stage"] in MOE_STAGES]
        assert block and all(r["verdict"] == "pass" for r in block)
        assert len(block) == 6 * len({r["call"] for r in block})
    (tie,) = [c for c in summary["cases"] if c["id"].startswith("moe-exact-tie")]
    # which tied expert std::sort keeps is the C++ library's (here the higher index): a convention if any
    assert all(r["convention"]["kind"] == "routing_tie" for r in tie["records"] if r.get("convention"))


def test_llama_cpp_refuses_sparse_weight_errors_with_their_codes(llama, tmp_path):
    rc, summary = _run_verify(tmp_path, "f32", ["error-moe-experts-shape", "error-moe-missing-router"], name="err")
    checks = {c["id"].split("_")[0]: (c["status"], c["error_check"]) for c in summary["cases"]}
    assert rc == 0, checks
    assert checks["error-moe-experts-shape"][1]["actual"] == "weight_shape"
    assert "ffn_gate_exps" in checks["error-moe-experts-shape"][1]["actual_message"]
    assert checks["error-moe-missing-router"][1]["actual"] == "missing_weight"
    assert "ffn_gate_inp" in checks["error-moe-missing-router"][1]["actual_message"]
    assert all(c["error_check"]["match"] == "exact" for c in summary["cases"])


# --- glue mutants: each must fail verify at its stage ---------------------------------------------------
MUTANTS = {
    # llama.cpp's [Hv, dv, dk] state written as it is (dk = dv: the same shape, transposed values)
    "state_untransposed": ("recurrent_to_format", lambda module: (lambda S: S), "decode_T12", "delta_rule"),
    # value heads left in the converter's tiled order: the first per-head tensor is in_proj's (qkv's V, z)
    "heads_left_tiled": ("heads_to_hf", lambda module: (lambda arr, axis, hk, hv: arr), "decode_T12", "in_proj"),
}




def _captured_instead(old: str, new: str):
    """MOE_CAPTURED with llama.cpp's tensor ``old`` replaced by ``new`` for the same stage tensor."""
    return lambda module: {(new if k == old else k): v for k, v in module.MOE_CAPTURED.items()}


def _gate_up_swapped(module):
    real = module.checkpoint_experts

    def swapped(cfg, arrays):
        gate_up = arrays.get("mlp.experts.gate_up_proj")
        if gate_up is not None:
            Im = cfg.moe_intermediate_size
            arrays = {**arrays, "mlp.experts.gate_up_proj": np.concatenate([gate_up[:, Im:], gate_up[:, :Im]], 1)}
        return real(cfg, arrays)

    return swapped


#: the sparse block's glue, run in bf16 (where the cases pass: the first divergence is the mutant's)
MOE_MUTANTS = {
    # the selected probabilities before build_moe_ffn's renormalisation (ffn_moe_weights, not _norm)
    "routing_weights_unnormalised": ("MOE_CAPTURED", _captured_instead("ffn_moe_weights_norm-0", "ffn_moe_weights-0"),
                                     "moe-e256-k8", "routing"),
    # each expert's gate and up projections written the other way round (silu(up) * gate)
    "expert_gate_up_swapped": ("checkpoint_experts", _gate_up_swapped, "moe-e256-k8", "experts"),
    # the shared expert before its sigmoid gate (ffn_shexp, not ffn_shexp_gated)
    "shared_gate_dropped": ("MOE_CAPTURED", _captured_instead("ffn_shexp_gated-0", "ffn_shexp-0"), "moe-e256-k8",
                            "shared_expert"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS) + sorted(MOE_MUTANTS))
def test_glue_mutants_are_caught_at_their_stage(llama, tmp_path, monkeypatch, mutant):
    module = _module()
    attr, make, case, stage = MUTANTS.get(mutant) or MOE_MUTANTS[mutant]
    profile = "f32" if mutant in MUTANTS else "bf16"
    monkeypatch.setattr(module, attr, make(module))
    rc, summary = _run_verify(tmp_path, profile, [case], name=mutant)
    assert rc == 1
    (c,) = summary["cases"]
    assert c["status"] == "fail" and c["first_divergence"]["stage"] == stage, c["first_divergence"]


def test_what_llama_cpp_cannot_express_is_not_applicable(llama, tmp_path):
    cases = ["dk-gt-dv", "per-head-norm", "packed-mixed", "error-head-ratio", "snapshot-replay", "moe-no-renorm",
             "moe-e512-k10"]
    # bf16: snapshot-replay's first call passes there, so it reaches its save; decode_T12 is judged (exit 0, not 2)
    rc, summary = _run_verify(tmp_path, "bf16", [*cases, "decode_T12"], name="na")
    by = {c["id"].split("_")[0]: c for c in summary["cases"]}
    assert all(by[c]["status"] == "not_applicable" for c in cases), {c: by[c]["status"] for c in cases}
    assert "S_k == S_v" in by["dk-gt-dv"]["not_applicable"]["reason"]
    assert "per_head" in by["per-head-norm"]["not_applicable"]["reason"]
    assert "GGML_ASSERT" in by["error-head-ratio"]["not_applicable"]["reason"]
    assert "norm_w = true" in by["moe-no-renorm"]["not_applicable"]["reason"]
    assert "S_k == S_v" in by["moe-e512-k10"]["not_applicable"]["reason"]
    assert rc == 0
