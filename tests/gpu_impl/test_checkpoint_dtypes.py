"""The Triton path holds A_log and the gated norm's weight in float32 in every profile (issue 44): a
released checkpoint's float32 values reach the gates and gated-norm kernels bit for bit, never rounded
to the profile's dtype; a bf16 or f16 model keeps its matrices in that dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdncheck.gpu_impl import Layer
from gdncheck.synthetic import CHECKPOINT_F32, realistic_weights
from tests.gpu_impl.helpers import DEVICE
from tests.helpers import tiny_config


@pytest.mark.parametrize("profile", ["bf16", "f16"])
def test_the_float32_checkpoint_weights_stay_float32(profile):
    cfg = tiny_config(Hk=2, Hv=4, dk=16, dv=16, D=32, I=48)
    w = realistic_weights(cfg, 4, f32=CHECKPOINT_F32)
    layer = Layer(cfg, w, profile=profile, device=DEVICE)
    for held, name in ((layer.A_log, "linear_attn.A_log"), (layer.w_norm, "linear_attn.norm.weight")):
        assert held.dtype == torch.float32, name
        want = np.asarray(w[name], dtype=np.float32)
        assert np.array_equal(held.detach().cpu().numpy().view(np.uint32), want.view(np.uint32)), name
    assert layer.w_out.dtype == getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[profile])
