"""napari-attnreg: which parts of a Vision Transformer's attention are real.

``from napari_attnreg import regularize`` needs no GUI toolkit. Heavy imports (torch, timm)
happen on first use of a public name, so napari can read the plugin manifest cheaply.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("napari-attnreg")
except PackageNotFoundError:  # source tree without an install
    __version__ = "unknown"

_PUBLIC = {
    "regularize": "napari_attnreg.api",
    "regularize_stack": "napari_attnreg.api",
    "StackResults": "napari_attnreg.core.run.api",
    "PartialStackWarning": "napari_attnreg.core.run.api",
    "Thresholds": "napari_attnreg.core.run.thresholds",
    "run_engine": "napari_attnreg.core.run.engine",
    "RunConfig": "napari_attnreg.core.run.config",
    "CancelToken": "napari_attnreg.core.run.passes",
    "RunCancelled": "napari_attnreg.core.run.passes",
    "Progress": "napari_attnreg.core.run.passes",
    "AttentionResult": "napari_attnreg.core.results.result",
    "load_backbone": "napari_attnreg.core.models.backbones",
    "prepare_image": "napari_attnreg.core.run.images",
    "concept_from": "napari_attnreg.core.run.concept",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'napari_attnreg' has no attribute {name!r}")
