"""Apple MLX (mlx-lm's own Qwen3.5 layer) through the harness: a few dense cases conform in f32 and bf16 as a
plug-in (``gdncheck run gdncheck.conformance.engines.mlx.adapter:mlx`` then ``gdncheck verify``), and a machine
without MLX gets one line saying how to install it. Mutants of the glue (the state layout, the norm fold,
the head order), caught at their stage: tests/meta/test_mlx_glue_mutants.py."""

from __future__ import annotations

import json
import sys

import pytest

from gdncheck.cli import main as cli
from gdncheck.errors import GDNError

PLUGIN = "gdncheck.conformance.engines.mlx.adapter:mlx"


def _mlx_module():
    from gdncheck.conformance.engines.mlx import adapter as module

    return module


def test_a_machine_without_mlx_gets_one_line_saying_how_to_install_it(monkeypatch):
    module = _mlx_module()
    monkeypatch.setitem(sys.modules, "mlx_lm", None)  # `import mlx_lm...` now raises ImportError
    with pytest.raises(GDNError) as exc:
        module.engine()
    assert str(exc.value) == ("implementation 'mlx' needs mlx and mlx-lm, not installed here: "
                              "pip install \"mlx[cpu]\" mlx-lm")
    with pytest.raises(GDNError, match="needs mlx and mlx-lm"):
        module.check_case({"hidden_size": 8}, [{"op": "construct", "strict": False}])  # config error -> asks MLX


@pytest.fixture(autouse=True)
def _needs_mlx(request):
    """Every test but the not-installed one needs MLX and mlx-lm; without them it is skipped, saying why."""
    if request.node.originalname != "test_a_machine_without_mlx_gets_one_line_saying_how_to_install_it":
        pytest.importorskip("mlx.core", reason="MLX is not installed (pip install \"mlx[cpu]\" mlx-lm)")
        pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install \"mlx[cpu]\" mlx-lm)")

#: dense cases: prefill then decode over a batch (Hv/Hk = 3), dk != dv, a continuation prefill
CASES = ["prefill-decode_T65", "dk-gt-dv_T63", "segments_T150"]


def _run_verify(tmp_path, profile: str, cases: list[str], name: str = "out") -> tuple[int, dict]:
    out = tmp_path / f"{name}-{profile}"
    selection = [a for c in cases for a in ("--case", c)]
    assert cli(["run", PLUGIN, "--profile", profile, "--out", str(out), "-q", *selection]) == 0
    rc = cli(["verify", "--outputs", str(out), "--profile", profile, "-q", "--diagnose", "0", *selection])
    return rc, json.loads((out / f"verify-summary-{profile}.json").read_text())


@pytest.mark.parametrize("profile", ["f32", "bf16"])
def test_mlx_conforms_on_dense_cases(tmp_path, profile):
    rc, summary = _run_verify(tmp_path, profile, CASES)
    statuses = {c["id"].split("_")[0]: c["status"] for c in summary["cases"]}
    assert rc == 0, statuses
    assert set(statuses.values()) == {"pass"} and len(statuses) == len(CASES)
    assert all("mlx-lm" in c.get("implementation", "mlx-lm") for c in summary["cases"])


def test_the_adapter_drives_mlx_lm_own_layer_and_restores_its_modules(fixtures_dir, manifest):
    from mlx_lm.models import gated_delta, qwen3_5

    from gdncheck.conformance.ports.run import load_case_input
    from gdncheck.harness.program import CaseInput, execute

    module = _mlx_module()
    before = (qwen3_5.mx, gated_delta.gated_delta_ops, gated_delta.gated_delta_kernel)
    entry = next(c for c in manifest["cases"] if c["id"].startswith("prefill-decode_T65"))
    inp, _ = load_case_input(fixtures_dir, entry)
    built = []

    def factory(*args, **kwargs):
        built.append(module.mlx(*args, **kwargs))
        return built[0]

    factory.check_case = module.check_case
    res = execute(factory, CaseInput(inp.id, inp.config, inp.weights, inp.batch, inp.program, inp.inputs),
                  profile="f32")
    assert res.error is None and res.not_applicable is None
    assert (qwen3_5.mx, gated_delta.gated_delta_ops, gated_delta.gated_delta_kernel) == before
    layer = built[0]
    assert type(layer.layer) is qwen3_5.DecoderLayer
    assert all(c["functions"] == ["gated_delta_ops"] for c in layer.calls)  # the CPU backend's rule, every call
    names = {k.split(".", 2)[2] for k in res.outputs}
    assert {"x_norm", "qkv", "z", "a", "b", "qkv_conv", "q", "k", "v", "beta", "core", "core_gated", "attn_out",
            "h", "h_norm", "mlp_out", "out", "conv_state", "recurrent_state"} <= names
    assert "g" not in names  # MLX computes exp(g) only (module docstring)
    # the conv state's K-1 newest columns are MLX's cache; the oldest is its conv window's
    assert res.outputs["calls.0.conv_state"].shape[-1] == inp.config["linear_conv_kernel_dim"]


# --- what MLX cannot express ----------------------------------------------------------------------------
def test_what_mlx_cannot_express_is_not_applicable_and_what_it_refuses_has_its_code(tmp_path):
    cases = ["per-head-norm", "restore-mismatch", "packed-mixed", "error-head-ratio", "error-missing-head-setting"]
    rc, summary = _run_verify(tmp_path, "f32", cases, name="na")
    by = {c["id"].split("_")[0]: c for c in summary["cases"]}
    assert by["per-head-norm"]["status"] == "not_applicable" and "per_head" in by["per-head-norm"]["not_applicable"][
        "reason"]
    assert by["restore-mismatch"]["status"] == "not_applicable"
    assert "seq-len rule" in by["restore-mismatch"]["not_applicable"]["reason"]
    assert by["packed-mixed"]["status"] == "not_applicable"
    assert by["error-missing-head-setting"]["status"] == "not_applicable"
    assert by["error-head-ratio"]["status"] == "pass"  # GatedDeltaNet's own check
    assert by["error-head-ratio"]["error_check"]["match"] == "exact"
    assert rc == 0


def test_refusal_codes_name_the_parameter_mlx_names():
    module = _mlx_module()
    assert module.refusal_code("Missing 1 parameters: \nmlp.gate.weight.") == "missing_weight"
    assert module.refusal_code("Expected shape (4,) but received shape (5,) for parameter linear_attn.norm.weight") \
        == "norm_weight_size"
    assert module.refusal_code("Expected shape (16, 4, 1) but received shape (16, 3, 1) for parameter "
                               "linear_attn.conv1d.weight") == "conv_kernel_mismatch"
    assert module.config_refusal_code("num_v_heads (3) must be divisible by num_k_heads (2)") == "head_ratio"
    assert module.config_refusal_code("[RMSNorm] 'eps' must be positive but got 0.0.") == "invalid_eps"
