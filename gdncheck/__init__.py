"""gdncheck: numerical verification and conformance suite for the Qwen3.5 Gated DeltaNet layer.

This package holds what every implementation shares and that is not math: the stage vocabulary
(:mod:`gdncheck.stages`), configuration (:mod:`gdncheck.config`), errors (:mod:`gdncheck.errors`),
weights and checkpoint loading, snapshot files and safetensors I/O. The float64 reference lives in
:mod:`gdncheck.reference`, the Triton path in :mod:`gdncheck.gpu_impl`.
"""

from ._version import __version__
from .checkpoint import load_layer, read_config
from .config import GDNConfig
from .errors import GDNError
from .snapshot import Snapshot
from .weights import LayerWeights

__all__ = ["GDNConfig", "GDNError", "LayerWeights", "Snapshot", "__version__", "load_layer", "read_config"]
