"""keras-hub computes its Qwen3.5 decoder layer on an integer input instead of refusing it.

Standalone: imports only keras (torch backend), keras_hub, torch and the standard library.

A hidden-state input of an integer dtype is a caller's bug (token ids passed where embeddings belong): FORMAT.md §6
expects ``input_dtype``. Keras 3's ``Layer.__call__`` converts every tensor argument to the layer's compute dtype
(``DTypePolicy.convert_input``), integers included, so ``Qwen3_5TransformerDecoder`` runs on the promoted values and
returns an output; the bug goes unnoticed.

    python conformance/engines/keras/repros/keras_int_input.py

Exit status: 1 while the integer input is computed on (the defect reproduces), 0 once it is refused, 3 when
keras-hub cannot be run here.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
try:
    import torch
    from keras_hub.src.models.qwen3_5.qwen3_5_decoder import Qwen3_5TransformerDecoder
except ImportError as exc:
    print(f"cannot run: needs keras (torch backend), keras-hub and torch ({exc})")
    sys.exit(3)


def main() -> int:
    layer = Qwen3_5TransformerDecoder(layer_type="linear_attention", intermediate_dim=24, num_query_heads=1,
                                      num_key_value_heads=1, head_dim=8, linear_num_key_heads=1,
                                      linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
    layer.build((None, None, 16))
    x = torch.arange(48, dtype=torch.int32).reshape(1, 3, 16)
    try:
        out = layer(x)
    except Exception as exc:  # a refusal, whatever its class, is the fix
        print(f"refused: {type(exc).__name__}: {exc}")
        return 0
    print(f"an int32 input of shape {list(x.shape)} was computed on: output {out.dtype} {list(out.shape)} "
          "(expected a refusal: input_dtype)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
