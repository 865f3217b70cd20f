"""What a first GPU run needs besides correct numbers, checked on the CPU: no host synchronisation
in the forward pass, launch grids inside CUDA's limits for any batch, the chunked prefill's memory
bounded (the model of gpu_impl/memory.py against allocations measured here), the occupancy rule,
and decode captured in a CUDA graph (on a GPU)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gdncheck.config import REAL
from gdncheck.errors import InputShapeError
from gdncheck.gpu_impl import Layer
from gdncheck.gpu_impl import memory as M
from gdncheck.gpu_impl.delta_rule_chunked import TEMP_BUDGET, gpu_block_v, slice_rows
from gdncheck.gpu_impl.target import GRID_LIMITS, record_launches
from gdncheck.synthetic import make_inputs, make_weights
from tests.gpu_impl.compare import check
from tests.gpu_impl.helpers import needs_interpreter
from tests.helpers import tiny_config

CFG = tiny_config(Hk=2, Hv=4, dk=16, dv=8, D=32, I=48)


class HostTraffic(TorchDispatchMode):
    """Every value read by the host and every copy between devices inside the block."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self.copies: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__
        if name in ("_local_scalar_dense.default", "is_nonzero.default", "equal.default"):
            self.reads.append(name)
        out = func(*args, **kwargs)
        if name.startswith(("_to_copy", "copy_")):
            src = args[1] if name.startswith("copy_") else args[0]
            dst = args[0] if name.startswith("copy_") else out
            if isinstance(src, torch.Tensor) and src.device != dst.device:
                self.copies.append((src.device.type, dst.device.type))
        return out


def meta_call(seq_pos, B=4, T=1, strict=False):
    """One layer call on meta tensors, launches recorded (nothing runs), host traffic recorded."""
    layer = Layer.shaped(REAL, profile="bf16", delta_rule="auto")
    state = layer.new_state(B)
    x = torch.empty((B, T, REAL.hidden_size), dtype=torch.bfloat16, device="meta")
    with record_launches() as launches, HostTraffic() as traffic:
        layer.forward(x, state, seq_pos, strict=strict)
    return traffic, launches


@pytest.mark.parametrize("seq_pos", [7, [7, 7, 7, 7], "device"], ids=["int", "equal-list", "device-tensor"])
@pytest.mark.parametrize("T", [1, 40])
def test_forward_reads_nothing_on_the_host_and_copies_nothing(seq_pos, T):
    """Decode and prefill: the seq_pos rule on the device, no .item(), no host<->device copy (on
    the meta device, any read of a value would also raise)."""
    if seq_pos == "device":
        seq_pos = torch.full((4,), 7, dtype=torch.int64, device="meta")
    traffic, launches = meta_call(seq_pos, T=T)
    assert traffic.reads == [] and traffic.copies == []
    assert {launch.kernel for launch in launches} >= {"conv1d_qk_norm_kernel", "gated_norm_kernel"}


def test_positions_that_differ_cost_one_copy_and_strict_mode_reads_the_state():
    traffic, _ = meta_call([3, 4, 5, 6])
    assert traffic.reads == [] and traffic.copies == [("cpu", "meta")]
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):  # strict reads seq_len
        meta_call(7, strict=True)


def test_device_seq_pos_is_checked_by_shape_and_dtype():
    layer = Layer.shaped(CFG, profile="bf16")
    state = layer.new_state(2)
    x = torch.empty((2, 1, CFG.hidden_size), dtype=torch.bfloat16, device="meta")
    for bad in (torch.zeros(3, dtype=torch.int64, device="meta"), torch.zeros(2, device="meta")):
        with pytest.raises(InputShapeError, match="one per sequence"), record_launches():
            layer.forward(x, state, bad)


@needs_interpreter  # a layer on the CPU: the interpreter, also on a GPU runner
def test_seq_pos_tensor_on_the_layer_device_resets_rows_like_the_host_form(caplog):
    """The device path of the rule (here CPU tensors, where it is also the host) gives the same
    outputs, seq_len, and one warning as positions given as a list."""
    w = make_weights(CFG, seed=0)
    x = make_inputs(CFG, 2, 6, seed=1)
    layer = Layer(CFG, w, profile="f32", device="cpu", chunk_size=16)
    outs = []
    for pos in ([0, 3], torch.tensor([0, 3])):
        state = layer.new_state(2)
        layer.forward(x[:, :3], state, 0)
        with caplog.at_level(logging.WARNING, logger="gdncheck.gpu_impl"):
            caplog.clear()
            outs.append(layer.forward(x[:, 3:], state, pos)[0])
        assert state.seq_len.tolist() == [3, 6]
        assert len(caplog.records) == 1 and "row 0: state seq_len=3, seq_pos=0" in caplog.records[0].getMessage()
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("T", [1, 20, 100])
def test_grids_stay_inside_cuda_limits_for_any_batch(T):
    """B·Hv = 131072 at B = 4096: far over the 65535 of a grid's y and z. The batch rides on x."""
    layer = Layer.shaped(REAL, profile="bf16")
    B = 4096
    x = torch.empty((B, T, REAL.hidden_size), dtype=torch.bfloat16, device="meta")
    with record_launches() as launches:
        layer.forward(x, layer.new_state(B), 0)
    assert launches
    for launch in launches:
        assert len(launch.grid) <= 3 and all(1 <= g <= lim for g, lim in zip(launch.grid, GRID_LIMITS)), launch


def test_state_block_choice_runs_prefill_in_one_wave_when_it_can():
    # 2 blocks per SM (compile table): B=1, Hv=32 -> BV 16, 256 programs on 264 slots
    assert gpu_block_v(1, 32, 128, 132) == 16
    # blocks that build without spills only (bf16: 16, 32; f32 and f16: 16): the fewest waves of those
    assert gpu_block_v(4, 32, 128, 132) == 32  # 512 programs of BV 32: 2 waves, not 4 of BV 16
    assert gpu_block_v(64, 32, 128, 132) == 32 and gpu_block_v(64, 32, 128, 132, "tf32x3") == 16
    assert gpu_block_v(64, 32, 128, 132, varlen=True) == 16  # packed: BV 32 spills in bf16 too
    assert gpu_block_v(1, 2, 8, 132) == 16  # dv below 16: one block
    assert slice_rows(100, 10, 1000, 30) == 100 and slice_rows(100, 10, 500, 30) == 30
    assert slice_rows(100, 10, 250, 30) == 25 and slice_rows(100, 10**9, 1000, 30) == 1


# --- memory ---------------------------------------------------------------------------------------


def peak_allocated(fn) -> int:
    """Peak bytes allocated by torch on the CPU while ``fn`` runs (the profiler's running total)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0)


@pytest.mark.parametrize("profile", ["bf16", "f32"])
def test_memory_model_matches_the_allocations_of_a_call(profile, monkeypatch):
    """The peak of one prefill (kernels recorded, not run: the allocations are the same) against
    gpu_impl/memory.py's phase model, with a temporaries budget small enough to slice the rows."""
    import importlib

    chunked = importlib.import_module("gdncheck.gpu_impl.delta_rule_chunked")
    B, T, budget = 3, 640, 400_000
    monkeypatch.setattr(chunked, "TEMP_BUDGET", budget)
    layer = Layer(CFG, make_weights(CFG, seed=0), profile=profile, device="cpu", chunk_size=64)
    state = layer.new_state(B)
    x = torch.zeros(B, T, CFG.hidden_size, dtype=layer.dtype)
    with record_launches():
        measured = peak_allocated(lambda: layer.forward(x, state, 0))
    model = M.call_peak(CFG, B, T, profile, chunk=64, budget=budget)
    assert 0 < model.temporaries <= budget < B * CFG.num_v_heads * T * 4 * (2 + 16 + 8 + 64)  # sliced
    assert abs(measured - model.bytes) <= 0.03 * model.bytes + 16384, (measured, model)


def test_b64_t32k_fits_an_h200_with_the_activations():
    total = M.total_bytes(REAL, 64, 32768, "bf16")
    assert total <= M.H200_BYTES
    peak = M.call_peak(REAL, 64, 32768, "bf16")
    assert peak.temporaries <= TEMP_BUDGET  # unsliced they would be 86 GB
    assert 64 * 32 * 32768 * 1288 > 86e9
    assert M.largest_tokens(REAL, 64) >= 32768 and M.total_bytes(REAL, 64, M.largest_tokens(REAL, 64) + 64) > \
        M.H200_BYTES


# --- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_decode_replays_in_a_cuda_graph():
    """Decode captured once and replayed equals decode run plainly, step after step."""
    w = make_weights(CFG, seed=2)
    x = torch.tensor(make_inputs(CFG, 2, 8, seed=3), dtype=torch.bfloat16, device="cuda")
    layer = Layer(CFG, w, profile="bf16", device="cuda")
    plain, graphed = layer.new_state(2), layer.new_state(2)
    layer.forward(x[:, :4], plain, 0)
    layer.forward(x[:, :4], graphed, 0)
    static_x = x[:, 4:5].clone()
    pos = torch.full((2,), 4, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (compiles) outside the capture, then one step captured
        warm = layer.new_state(2)
        warm.restore(graphed.snapshot())
        layer.forward(static_x, warm, pos)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, _ = layer.forward(static_x, graphed, pos)
    for t in range(4, 8):
        want, _ = layer.forward(x[:, t:t + 1], plain, t)
        static_x.copy_(x[:, t:t + 1])
        pos.fill_(t)
        graph.replay()
        check(static_out, want, "forms", "bf16", f"graph replay, token {t}")
    check(graphed.recurrent_state, plain.recurrent_state, "forms", "bf16", "state after replays")
