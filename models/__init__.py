"""Draft-model architectures and checkpoint key maps."""
