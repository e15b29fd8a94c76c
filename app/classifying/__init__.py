"""Labelling new text at scale with a kept classifier (app/classify.py): streamed input, data-parallel ranks,
resumable part files."""
