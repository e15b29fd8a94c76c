"""The embedded default corpus: real English text every Python install has, with no download.

Up to half of ``--default-max-mb`` is CPython's own documentation (the ``pydoc_data`` help topics,
~465 KB, in topic-name order); the rest is standard-library source files (``sysconfig``'s stdlib,
excluding site-packages and caches), taken in the order of a hash of their relative path: a
deterministic sample that spreads over the whole library instead of its first directories.
Each topic and each file is one document. Which files exist depends on the Python version, so the
source fingerprint in meta.json records it.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(slots=True)
class DefaultCorpus:
    topics: list[tuple[str, str]]  # (name, text) of pydoc help topics
    files: list[Path]  # stdlib .py files, sampled order
    root: Path
    python: str


def _stdlib_files(root: Path) -> list[Path]:
    files = [p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: hashlib.blake2b(p.relative_to(root).as_posix().encode()).digest())


def default_corpus(max_mb: float) -> DefaultCorpus:
    """Pick topics then stdlib files until ``max_mb`` megabytes (10**6 bytes) of text."""
    from pydoc_data.topics import topics

    budget = int(max_mb * 1e6)
    chosen_topics: list[tuple[str, str]] = []
    used = 0
    for name in sorted(topics):
        size = len(topics[name].encode("utf-8"))
        if used + size > budget // 2:
            break
        chosen_topics.append((name, topics[name]))
        used += size
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for path in _stdlib_files(root):
        if used >= budget:
            break
        size = path.stat().st_size
        if size == 0:
            continue  # empty package markers are not documents
        if used + size > budget and files:
            continue  # keep filling with smaller files; the order stays deterministic
        files.append(path)
        used += size
    return DefaultCorpus(chosen_topics, files, root, sys.version.split()[0])
