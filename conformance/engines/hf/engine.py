"""Hugging Face transformers as an engine: its Qwen3.5 decoder layers and cache (``adapter.py``, ``trace.py``)."""

from ..schema import Engine, Finding

ENGINE = Engine(
    name="hf",
    impl="hf",
    judged="end_to_end",
    profiles=("f32", "bf16"),
    modules=("transformers", "torch"),
    packages=("transformers", "torch"),
    install="pip install -e '.[hf]' (transformers, torch)",
    about="Hugging Face transformers' Qwen3_5DecoderLayer / Qwen3_5MoeDecoderLayer and DynamicCache on the CPU "
          "(conformance/engines/hf/adapter.py)",
)

FINDINGS = (
    Finding(
        case="moe-exact-tie", profile="*", cls="convention",
        explanation="transformers routes with torch.topk, whose CPU kernel keeps whichever of exactly tied "
        "experts at the k boundary its C++ library's selection leaves (the reference: the lower index; which one "
        "depends on the machine); docs/moe.md, Ties",
        may_not_occur=True),
)
