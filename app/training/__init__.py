"""Training: config, Trainer, batching, evaluation loop, schedule, tracking."""
