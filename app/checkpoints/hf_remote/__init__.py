"""The `transformers` remote code of an export (copied verbatim into every export folder).

These files run inside `transformers`' module cache, far from this repository: they import torch and
transformers only, never `app`. `app.checkpoints.hf_format` copies them; nothing in `app` imports them.
"""
