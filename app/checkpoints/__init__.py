"""Every on-disk model format: training checkpoints, consolidation, exports, opening --checkpoint."""
