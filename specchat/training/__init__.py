"""Training drafters for a target: self-distillation data (`data`, `prompts`), the index and vocabulary
building blocks of the trainer (`indices`, `vocab`)."""
