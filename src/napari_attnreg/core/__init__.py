"""Core library: imports no GUI toolkit, here or below (runs without a display).

Submodules are imported on first use of a public name. Subpackages, lowest first: ``models`` (backbones,
attention), ``stats`` (the statistics and rules), ``results`` (a run's maps and files), ``run``
(options, images, nulls, the chunk loop, the engines and the pipeline service). The pipeline function is
``napari_attnreg.regularize`` (``core.run.engine``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_PUBLIC = {
    "Backbone": "models.backbones", "BackboneError": "models.backbones", "load_backbone": "models.backbones",
    "CancelToken": "run.passes", "Progress": "run.passes", "RunCancelled": "run.passes", "RunConfig": "run.config",
    "drain": "run.engine", "regularize_stack": "run.api", "StackResults": "run.api",
    "PartialStackWarning": "run.api", "Thresholds": "run.thresholds", "OPTIONS": "run.options",
    "validate_options": "run.options", "PlaneStack": "run.planes", "ModelSpec": "run.service",
    "Job": "run.service", "Outcome": "run.service", "run_job": "run.service",
    "resolve_device": "run.engine", "run_engine": "run.engine",
    "PreparedImage": "run.images", "prepare_image": "run.images",
    "NULL_METHODS": "run.options", "NullConfig": "run.nulls", "null_images": "run.nulls",
    "AttentionResult": "results.result",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
