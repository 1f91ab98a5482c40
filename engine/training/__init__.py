"""Training: the loop and its hooks (trainer), evaluation (evaluator), optimizers and LR schedules (optim), batch samplers (samplers), atomic checkpoints (checkpoint)."""
