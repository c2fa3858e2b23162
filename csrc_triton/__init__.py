"""Triton kernels of sgl_convwin and their launchers (installed as ``sgl_convwin.csrc_triton``).

Launchers take tensors that the caller has already validated, read every stride, and launch once;
they never allocate, never read device memory on the host and hold no torch.library code. Each
``planned_<op>`` fixes its launcher's launch for one call signature (the ops' eager plans).
"""

from .gdn_commit import launch_gdn_commit, planned_gdn_commit
from .gdn_ring_verify import (launch_gdn_ring_flush, launch_gdn_ring_verify, planned_gdn_ring_flush,
                              planned_gdn_ring_verify)
from .gdn_verify import launch_gdn_verify, planned_gdn_verify
from .mamba2_commit import launch_mamba2_commit, planned_mamba2_commit
from .mamba2_ring_verify import (launch_mamba2_ring_flush, launch_mamba2_ring_verify, planned_mamba2_ring_flush,
                                 planned_mamba2_ring_verify)
from .mamba2_verify import launch_mamba2_verify, planned_mamba2_verify
from .replay import launch_capture_gates, launch_path_window, planned_capture_gates
from .ring_accept import launch_ring_accept, planned_ring_accept
from .ring_conv import launch_ring_conv1d_verify, planned_ring_conv1d_verify
from .scatter import launch_scatter, planned_scatter
from .scatter_tree import launch_scatter_tree, planned_scatter_tree
from .verify import launch_capture, launch_causal_conv1d_verify, planned_capture, planned_causal_conv1d_verify

__all__ = [
    "launch_capture_gates",
    "launch_gdn_commit",
    "launch_gdn_ring_flush",
    "launch_gdn_ring_verify",
    "launch_gdn_verify",
    "launch_mamba2_commit",
    "launch_mamba2_ring_flush",
    "launch_mamba2_ring_verify",
    "launch_mamba2_verify",
    "launch_path_window",
    "launch_ring_accept",
    "launch_ring_conv1d_verify",
    "launch_capture",
    "launch_causal_conv1d_verify",
    "launch_scatter",
    "launch_scatter_tree",
    "planned_capture",
    "planned_capture_gates",
    "planned_causal_conv1d_verify",
    "planned_gdn_commit",
    "planned_gdn_ring_flush",
    "planned_gdn_ring_verify",
    "planned_gdn_verify",
    "planned_mamba2_commit",
    "planned_mamba2_ring_flush",
    "planned_mamba2_ring_verify",
    "planned_mamba2_verify",
    "planned_ring_accept",
    "planned_ring_conv1d_verify",
    "planned_scatter",
    "planned_scatter_tree",
]
