"""What every benchmark of :mod:`gdncheck.bench` shares: the real and quick layer sizes, timing with
peak memory, thread and load information, normwise differences."""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..config import GDNConfig

QUICK = GDNConfig(hidden_size=32, intermediate_size=48, num_k_heads=2, num_v_heads=4, head_k_dim=16,
                  head_v_dim=8, conv_kernel=4)


# --- measuring ----------------------------------------------------------------------------------------
def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> None:
    """Free what can be freed, then restart the peak resident set count (VmHWM) at the current one."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def measure(fns: dict[str, Callable[[], object]], repeat: int, keep: bool = True) -> tuple[dict, dict]:
    """Run each function ``repeat`` times, taking turns (a, b, a, b, ...), so that a busy neighbour on a
    shared machine slows them alike. Per function: the median and least wall seconds, the median CPU
    seconds of the process (all its threads; kernel time such as page faults included), the median
    kernel (system) seconds alone, and the peak memory growth (MiB) of its first run.

    Returns the figures and (``keep``) the result of each function's last run, by name.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    sys_: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, float | None] = {}
    results: dict[str, object] = {}
    for i in range(repeat):
        for name, fn in fns.items():
            results[name] = None
            if i == 0:
                _reset_peak()
                base = _rss_kb("VmRSS")
            t0, c0, s0 = time.perf_counter(), time.process_time(), os.times().system
            result = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            sys_[name].append(os.times().system - s0)
            if keep:
                results[name] = result
            del result
            if i == 0:
                hwm = _rss_kb("VmHWM")
                peaks[name] = max(0, hwm - base) / 1024 if base is not None and hwm is not None else None
    figures = {name: {"seconds": statistics.median(ts), "min_seconds": min(ts), "runs": ts,
                      "cpu_seconds": statistics.median(cpu[name]), "sys_seconds": statistics.median(sys_[name]),
                      "peak_mib": peaks[name]}
               for name, ts in times.items()}
    return figures, results


def normwise(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a − ref| / max |ref| (0 when both are all zeros)."""
    den = float(np.abs(ref).max()) if ref.size else 0.0
    num = float(np.abs(np.asarray(a, dtype=np.float64) - ref).max()) if ref.size else 0.0
    return num / den if den else num


# --- the benchmark ----------------------------------------------------------------------------------
def thread_info() -> dict:
    """What actually runs: BLAS libraries with their thread counts, torch's thread count."""
    info: dict = {"cpus": os.cpu_count()}
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [f"{d.get('internal_api')} {d.get('version')} threads={d.get('num_threads')}"
                        for d in threadpool_info() if d.get("user_api") == "blas"]
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        info["blas"] = []
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def set_numpy_hugepage(enable: bool | None) -> bool | None:
    """Set numpy's madvise(MADV_HUGEPAGE) switch (what NUMPY_MADVISE_HUGEPAGE sets at import) unless
    ``enable`` is None; return the previous setting (None where numpy has no such switch)."""
    try:
        from numpy._core.multiarray import _get_madvise_hugepage, _set_madvise_hugepage
    except ImportError:  # pragma: no cover - numpy < 2 or not Linux
        return None
    return bool(_set_madvise_hugepage(enable)) if enable is not None else bool(_get_madvise_hugepage())


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (how busy the machine was), or None."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def package_version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


# --- reporting --------------------------------------------------------------------------------------
def fmt_measure(m: dict | None) -> str:
    if not m:
        return "-"
    peak = f"{m['peak_mib']:.0f} MiB" if m.get("peak_mib") is not None else "? MiB"
    return f"{m['seconds']:.3f} s / {peak}"
