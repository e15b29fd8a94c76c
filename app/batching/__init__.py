"""A prepared split as batches: token stores, bucketed and carried-state schedules, a run's --data opened once."""
