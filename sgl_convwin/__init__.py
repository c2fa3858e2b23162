"""The whole speculative-decoding state of Gated DeltaNet and Mamba2 layers, kept once: the draft
tokens' conv inputs in one deduplicated buffer, and a commit that replays the accepted path onto the
recurrent state and the conv window -- no state snapshots, chains and trees -- as torch.library ops
with Triton kernels.

``import sgl_convwin`` registers the ``torch.ops.convwin`` operators.
"""

from .layout import (
    CHANNEL_MAJOR,
    DENSE,
    DIM_MAJOR,
    LAYOUTS,
    STATE_LAYOUTS,
    TOKEN_MAJOR,
    WINDOW_MAJOR,
    dedup_ratio,
    dim_per_rank,
    physical_nbytes,
    physical_shape,
    sequence_length,
    token_views,
    window_view,
)
from .cache import ConvWindowCache, RingCache
from .ops import alloc_windows, capture, causal_conv1d_verify, scatter, scatter_tree
from .ops_replay import alloc_gates, capture_gates, gdn_commit, mamba2_commit
from .ops_verify import gdn_verify, mamba2_verify
from .ops_ring import (DEFAULT_CAPACITY, Ring, alloc_ring, gdn_ring_flush, gdn_ring_verify,
                       ring_accept, ring_conv1d_verify)
from .ops_ring_mamba2 import alloc_mamba2_ring, mamba2_ring_flush, mamba2_ring_verify
from .validation import index_checks, index_checks_enabled, set_index_checks
from . import integrations  # engine adapters (SGLang, vLLM) and pool sizing

__version__ = "0.1.0"

__all__ = [
    "ConvWindowCache",
    "DEFAULT_CAPACITY",
    "Ring",
    "RingCache",
    "CHANNEL_MAJOR",
    "DENSE",
    "DIM_MAJOR",
    "LAYOUTS",
    "STATE_LAYOUTS",
    "TOKEN_MAJOR",
    "WINDOW_MAJOR",
    "alloc_gates",
    "alloc_mamba2_ring",
    "alloc_ring",
    "alloc_windows",
    "capture_gates",
    "capture",
    "causal_conv1d_verify",
    "dedup_ratio",
    "dim_per_rank",
    "gdn_commit",
    "gdn_ring_flush",
    "gdn_ring_verify",
    "gdn_verify",
    "index_checks",
    "index_checks_enabled",
    "mamba2_commit",
    "mamba2_ring_flush",
    "mamba2_ring_verify",
    "mamba2_verify",
    "physical_nbytes",
    "physical_shape",
    "ring_accept",
    "ring_conv1d_verify",
    "scatter",
    "scatter_tree",
    "sequence_length",
    "token_views",
    "set_index_checks",
    "window_view",
]
