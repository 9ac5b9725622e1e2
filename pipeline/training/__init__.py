"""Training a Transformer: the loop (steps, validation, checkpoints), its speed probe and
budgets."""
