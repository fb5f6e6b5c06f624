"""Which weights made a result: the SHA-256 of the weights file, computed once per file.

Recorded in every result's metadata (``weights_sha256``) and in exported provenance, so a
table or map can be traced to the exact weights even after a file was renamed.
"""

from __future__ import annotations

import hashlib
import stat
from functools import lru_cache
from pathlib import Path
from typing import Any

from napari_attnreg.core.models.catalogue import is_bundled

_BUNDLED_MODELS = Path(__file__).resolve().parents[2] / "models"


#: The weights file of a transformers folder, in the order transformers loads them.
FOLDER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def weights_file(weights: Any, model: Any) -> Path | None:
    """The local file a result's ``weights`` metadata names, if it still exists: for a
    transformers folder (``save_pretrained``), its single weights file (the one the hub
    lists a SHA-256 for); none for a folder of sharded weights."""
    if not isinstance(weights, str) or weights in ("pretrained", "random-init", "given module"):
        return None
    folder = Path(weights)
    if folder.is_dir():
        # a DINOv2-family encoder saved as a folder had no checksum in its results at all
        return next((folder / n for n in FOLDER_WEIGHTS if (folder / n).is_file()), None)
    candidates = [folder]
    if isinstance(model, str) and is_bundled(model):  # bundled models record only their file name
        candidates.append(_BUNDLED_MODELS / weights)
    return next((p for p in candidates if p.is_file()), None)


def bundled_weights(weights: Any, model: Any) -> Path | None:
    """The package's own demo weights, when a result's metadata names them by file name.

    Unlike :func:`weights_file` this never follows a path out of the package's model folder
    (``../../etc/shadow``): metadata read from a file is not trusted to choose what is opened.
    """
    if model != "demo" or not isinstance(weights, str) or Path(weights).name != weights:
        return None
    candidate = _BUNDLED_MODELS / weights
    return candidate if candidate.is_file() else None


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file (weights), read in 1 MiB blocks; cached by path, size and mtime.

    Raises
    ------
    ValueError
        ``path`` is not a regular file (a folder, a device, a FIFO), or holds more bytes than
        its size says (``/proc`` files): hashing is bounded to the size a stat reports.
    """
    p = Path(path).resolve()
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p} is not a regular file; only weights files are hashed.")
    return _sha256_cached(str(p), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=32)
def _sha256_cached(path: str, size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    left = size
    with open(path, "rb") as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            digest.update(block)
            left -= len(block)
        if fh.read(1):  # a /proc or growing file: its stated size is not its content
            raise ValueError(f"{path} holds more than its stated size of {size} bytes; it is "
                             "not a weights file and is not hashed.")
    return digest.hexdigest()


def weights_sha256(weights: Any, model: Any) -> str | None:
    """SHA-256 of the weights file a backbone was loaded from; None for hub or given weights
    (or a path that is not a regular file)."""
    found = weights_file(weights, model)
    try:
        return file_sha256(found) if found is not None else None
    except (ValueError, OSError):
        return None
