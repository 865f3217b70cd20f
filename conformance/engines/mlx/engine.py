"""Apple MLX as an engine: mlx-lm's own Qwen3.5 model path (``adapter.py``)."""

from ..schema import Engine, Finding

ENGINE = Engine(
    name="mlx",
    impl="mlx",
    judged="end_to_end",
    profiles=("f32", "bf16"),
    modules=("mlx", "mlx_lm"),
    packages=("mlx", "mlx-lm"),
    install="pip install \"mlx[cpu]\" mlx-lm",
    about="Apple MLX: mlx-lm's qwen3_5 / qwen3_5_moe DecoderLayer and ArraysCache (conformance/engines/mlx/adapter.py)",
)

REPROS = "conformance/engines/mlx/repros"

FINDINGS = (
    Finding(
        case="error-input-dtype", profile="*", cls="deviation",
        explanation="MLX computes the layer on an int32 x (its ops promote it) instead of refusing it; the "
        "result is the layer on the promoted input, so the caller's bug goes unnoticed",
        repro=f"{REPROS}/mlx_int32_input.py",
        expect={"kind": "error_check", "expected": "input_dtype", "actual": None}),
    Finding(
        case="error-moe-missing-moe-size", profile="*", cls="engine_crash",
        explanation="mlx-lm's TextModelArgs defaults a missing moe_intermediate_size to 0 and SwitchLinear's "
        "constructor divides by it (math.sqrt(1 / input_dims)): a ZeroDivisionError that names neither the key "
        "nor the config; the adapter maps it to config_error, which the case accepts as its family",
        repro=f"{REPROS}/mlx_missing_moe_size.py",
        expect={"exception": "ZeroDivisionError"}),
    Finding(
        case="moe-", profile="bf16", cls="missing_feature",
        explanation="SwitchGLU's expert matmuls run mx.gather_mm, whose CPU kernel (GatherMM::eval) "
        "supports float32 only: the sparse block in bf16 cannot run on MLX's CPU backend",
        expect={"kind": "not_applicable"}),
    Finding(
        case="moe-exact-tie", profile="f32", cls="convention",
        explanation="mlx-lm routes with mx.argpartition, which may keep another of exactly tied experts at the "
        "k boundary than the reference's lower index (measured here: the higher); docs/moe.md, Ties",
        may_not_occur=True),
)
