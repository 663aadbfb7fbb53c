"""Attention kernels for tree verification; they depend only on torch (and triton when present)."""
