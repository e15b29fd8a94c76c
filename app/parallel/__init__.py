"""Everything that knows DeepSpeed: layout, pipeline, partition, engine, process group."""
