"""Training: config and flags, the run plan, `Trainer` (set-up, the loop and its hooks, the end), tracking."""
