"""What one dock knows about the runs on one input layer: results, parameters, outputs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.planes import PlaneIndex


@dataclass
class RunRecord:
    """Results of the runs on one input layer, and the parameters that made them."""

    source_id: Any
    source_name: str
    geometry: SourceGeometry
    results: dict[PlaneIndex, AttentionResult]
    params: dict[str, Any]
    thresholds: dict[str, Any]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The output layers of this run, by kind (object identity, not names or metadata).
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def grid_shape(self) -> tuple[int, int]:
        return next(iter(self.results.values())).grid_shape

    @property
    def any_result(self) -> AttentionResult:
        return next(iter(self.results.values()))

    @property
    def preset(self) -> str:
        return self.any_result.preset

    def output_shape(self, supersample: int = 1) -> tuple[int, ...]:
        shape = list(self.geometry.shape[:-2]) + [n * supersample for n in self.grid_shape]
        if self.geometry.channel_axis is not None:
            shape[self.geometry.channel_axis] = 1
        return tuple(shape)

    def plane_slot(self, plane: PlaneIndex) -> tuple[Any, ...]:
        """Index of one plane's token grid in the stacked output array."""
        slot: list[Any] = [slice(None)] * len(self.output_shape())
        for axis, i in zip(self.geometry.stack_axes, plane):
            slot[axis] = i
        if self.geometry.channel_axis is not None:
            slot[self.geometry.channel_axis] = 0
        return tuple(slot)

    def merge(self, other: RunRecord) -> bool:
        """Add another run's planes when it fits the same stack and token grid."""
        if not (self.geometry.same_grid(other.geometry) and self.grid_shape == other.grid_shape
                and self.params.get("model") == other.params.get("model")
                and self.preset == other.preset):
            return False
        self.results.update(other.results)
        self.params = other.params
        self.source_name = other.source_name
        return True
