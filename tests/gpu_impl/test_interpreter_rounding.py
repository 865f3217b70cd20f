"""Under Triton's interpreter a float32 -> bfloat16 store rounds to nearest even, as a GPU does
(Triton 3.9's interpreter truncates; gpu_impl/target.py wraps its cast). Compared with torch's
own conversion, bit for bit, on values chosen to round up, tie, overflow and stay NaN."""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl

from gdncheck.gpu_impl.target import kernel


@kernel
def _store_bf16_kernel(x_ptr, y_ptr, z_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    tl.store(y_ptr + o, x)  # implicit cast at the store
    tl.store(z_ptr + o, x.to(tl.bfloat16))  # explicit cast


def test_interpreted_bf16_cast_rounds_to_nearest_even():
    bits = np.array([0x4200FDF4,  # 32.2479: truncation gives 32.0, rounding 32.25
                     0x3F808000, 0x3F818000,  # ties: to even (down), to even (up)
                     0x3F80C000, 0x7F7FFFFF,  # above half; the largest float rounds to +inf
                     0xC200FDF4, 0x00018000,  # negative; a subnormal tie
                     0x7FC00000, 0x7F800001,  # NaNs stay NaN
                     0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3F800001, 0x40490FDB, 0x3DCCCCCD],
                    dtype=np.uint32)
    x = torch.from_numpy(bits.view(np.float32).copy())
    y = torch.empty(16, dtype=torch.bfloat16)
    z = torch.empty(16, dtype=torch.bfloat16)
    _store_bf16_kernel[(1,)](x_ptr=x, y_ptr=y, z_ptr=z, N=16)
    want = x.to(torch.bfloat16).view(torch.int16).numpy()
    nan = np.isnan(x.numpy())
    for got in (y, z):
        g = got.view(torch.int16).numpy()
        assert np.array_equal(g[~nan], want[~nan]), f"bf16 bits {g[~nan]} but torch rounds to {want[~nan]}"
        assert np.isnan(got.float().numpy()[nan]).all()
    assert float(y[0]) == 32.25
