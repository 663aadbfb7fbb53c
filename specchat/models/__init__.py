"""Draft-model architectures that read the target: LongSpec, GLIDE; their checkpoint loaders."""
