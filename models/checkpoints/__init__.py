"""Drafter checkpoints specchat trains and ships for its profiles: one directory each, `<profile>-<drafter>`,
with config.json, model.safetensors and training.json (how it was made); docs/training.md has the recipe."""
