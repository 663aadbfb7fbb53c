"""Drafters propose token trees for the target to verify; one file each, behind one protocol."""

# Drafters this build can run; "none" is plain autoregressive decoding.
AVAILABLE = ("none",)
