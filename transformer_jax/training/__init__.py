"""Training: optimizer and schedule, loss, train/eval steps, data parallelism, checkpoints, loop."""
