"""Core library: imports no GUI toolkit, here or below (runs without a display).

Submodules are imported on first use of a public name. ``core.regularize`` is the module of
regularization rules; the pipeline function is ``napari_attnreg.regularize`` (core.engine).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "Backbone": "backbones", "BackboneError": "backbones", "load_backbone": "backbones",
    "CancelToken": "engine", "Progress": "engine", "RunCancelled": "engine", "RunConfig": "engine",
    "drain": "engine", "regularize_stack": "engine", "StackResults": "engine",
    "PartialStackWarning": "engine", "Thresholds": "thresholds", "OPTIONS": "options",
    "validate_options": "options", "PlaneStack": "planes", "ModelSpec": "service",
    "Job": "service", "Outcome": "service", "run_job": "service",
    "resolve_device": "engine", "run_engine": "engine",
    "PreparedImage": "images", "prepare_image": "images",
    "NULL_METHODS": "nulls", "NullConfig": "nulls", "null_images": "nulls",
    "AttentionResult": "result",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
