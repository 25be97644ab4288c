"""Fused advantage and loss kernels (time-major). Depends only on torch (and triton when present)."""
from kernels.gae import gae, gae_reference

__all__ = ["gae", "gae_reference"]
