"""What a run read, kept on the GUI thread so its result is attached only to that content.

When the job returns, the source layer may have been deleted, reshaped, or given other
data of the same shape (a new file opened into it, an in-place edit). A result computed
from the old content must not be attached silently to the new one: the core's
:class:`~napari_attnreg.core.run.service.Outcome` carries a fingerprint of every plane it read,
compared here with the layer's data now.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from napari_attnreg._napari.geometry import AnalysedGrid, SourceGeometry
from napari_attnreg.core.run.service import Job, Outcome, plane_fingerprint


@dataclass
class PendingRun:
    """A started run: its job, the source layer and where the source sat at the start.

    ``grid`` ties the pixels the run analysed to the layer's, when the run read a slide at
    another level or resolution (:mod:`.slide_run`); ``source_data`` is the layer's data at
    the start (the job's own, unless the job reads the slide's file).
    """

    job: Job
    layer: Any
    geometry: SourceGeometry
    grid: AnalysedGrid | None = None
    source_data: Any = None
    #: The UserWarnings raised while the job was built (shown with its result or error).
    warnings: list[str] = field(default_factory=list)
    #: The analyst's Labels or Shapes layer the run's *Tissue mask* named (None: another mask).
    mask_layer: Any = None

    def placed(self, geometry: SourceGeometry) -> SourceGeometry:
        """Where the run's analysed image lies on a layer placed by ``geometry``."""
        return geometry if self.grid is None else self.grid.place(geometry)

    def problem(self, viewer: Any, outcome: Outcome) -> str | None:
        """Why the result must not be attached now (None: the source is as the run read it)."""
        layer = self.layer
        if layer not in viewer.layers:
            return (f"The image layer {layer.name!r} was removed during the run; nothing was "
                    "added.")
        if tuple(layer.data.shape[: layer.ndim]) != self.geometry.shape:
            return f"{layer.name!r} changed shape during the run; nothing was added. Run it again."
        changed = (f"The data of {layer.name!r} changed during the run; the result of the old "
                   "content was not added. Run it again.")
        read = self.source_data if self.source_data is not None else self.job.stack.data
        if layer.data is not read:
            return changed
        # in-place edits: in-memory planes are re-read and compared (lazy data is not re-read;
        # a slide read from its file is not the layer's pixels)
        if isinstance(layer.data, np.ndarray) and getattr(self.job.stack, "data", None) is read:
            stack = replace(self.job.stack, data=layer.data)
            for plane, fingerprint in outcome.fingerprints.items():
                if plane_fingerprint(stack.read(plane)[0]) != fingerprint:
                    return changed
        return None
