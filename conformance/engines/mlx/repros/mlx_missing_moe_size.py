"""mlx-lm crashes with ZeroDivisionError on a Qwen3.5-MoE config without ``moe_intermediate_size``.

Standalone (imports only mlx-lm and the standard library): ``python mlx_missing_moe_size.py``.

A Qwen3.5-MoE text config that leaves out ``moe_intermediate_size`` (the width of each expert) is
incomplete: there is no sensible default for it. mlx-lm's ``TextModelArgs`` defaults the missing key to
0 without a check, and building the model then fails deep inside ``SwitchLinear.__init__``
(``math.sqrt(1 / input_dims)``) with a ``ZeroDivisionError`` that names neither the key nor the config.
A loader should refuse the config up front, naming the missing key (gdncheck's suite expects the error
``missing_config_key``; fixtures/FORMAT.md section 6).

Seen with mlx 0.32.4 and mlx-lm 0.32.2 (gdncheck case ``error-moe-missing-moe-size``).
"""

from __future__ import annotations

import sys
import traceback
from importlib.metadata import version

#: the exit status when the repro cannot run (the engine is not installed here): neither fixed (0) nor reproduced (1)
CANNOT_RUN = 3

try:
    from mlx_lm.models import qwen3_5_moe
except ImportError as exc:
    print(f"cannot run: needs mlx-lm (pip install \"mlx[cpu]\" mlx-lm): {exc}", file=sys.stderr)
    sys.exit(CANNOT_RUN)

TEXT_CONFIG = {
    "model_type": "qwen3_5_moe_text", "num_hidden_layers": 1, "vocab_size": 16,
    "hidden_size": 8, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
    "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "shared_expert_intermediate_size": 4,
    # "moe_intermediate_size" is missing
}


def main() -> int:
    print(f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}")
    args = qwen3_5_moe.ModelArgs.from_dict({"model_type": "qwen3_5_moe", "text_config": TEXT_CONFIG})
    print(f"TextModelArgs accepted the config; moe_intermediate_size defaulted to "
          f"{args.text_config.get('moe_intermediate_size', 0)!r}")
    try:
        qwen3_5_moe.Model(args)
    except ZeroDivisionError:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        print(f"building the model raised ZeroDivisionError at {frame.filename.rsplit('/', 2)[-1]}:{frame.lineno} "
              f"({frame.line}): the missing key is never named")
        return 1
    except Exception as exc:  # noqa: BLE001 - a refusal is what a correct engine does
        if "moe_intermediate_size" in str(exc):
            print(f"refused: {type(exc).__name__}: {exc}: the missing key is named, the finding is fixed")
            return 0
        print(f"building the model raised {type(exc).__name__}: {exc}: still a crash that names no key")
        return 1
    print("the model was built: this mlx-lm no longer crashes here (check whether it refuses the config instead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
