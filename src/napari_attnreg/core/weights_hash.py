"""Which weights made a result: the SHA-256 of the weights file, computed once per file.

Recorded in every result's metadata (``weights_sha256``) and in exported provenance, so a
table or map can be traced to the exact weights even after a file was renamed.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from .catalogue import is_bundled

_BUNDLED_MODELS = Path(__file__).resolve().parents[1] / "models"


def weights_file(weights: Any, model: Any) -> Path | None:
    """The local file a result's ``weights`` metadata names, if it still exists."""
    if not isinstance(weights, str) or weights in ("pretrained", "random-init", "given module"):
        return None
    candidates = [Path(weights)]
    if isinstance(model, str) and is_bundled(model):  # bundled models record only their file name
        candidates.append(_BUNDLED_MODELS / weights)
    return next((p for p in candidates if p.is_file()), None)


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file (weights), read in 1 MiB blocks; cached by path, size and mtime."""
    p = Path(path).resolve()
    stat = p.stat()
    return _sha256_cached(str(p), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _sha256_cached(path: str, _size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(weights: Any, model: Any) -> str | None:
    """SHA-256 of the weights file a backbone was loaded from; None for hub or given weights."""
    found = weights_file(weights, model)
    return file_sha256(found) if found is not None else None
