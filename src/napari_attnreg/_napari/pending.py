"""What a run read, kept on the GUI thread so its result is attached only to that content.

When the job returns, the source layer may have been deleted, reshaped, or given other
data of the same shape (a new file opened into it, an in-place edit). A result computed
from the old content must not be attached silently to the new one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .geometry import SourceGeometry
from .jobs import JobSpec, read_plane

#: In-memory planes up to this many bytes get a checksum (crc32 runs at about 1 GB/s);
#: larger or lazy (dask, zarr) data is compared by identity only, never read twice.
CHECKSUM_MAX_BYTES = 256 * 2**20


def data_fingerprint(spec: JobSpec) -> int | None:
    """A cheap checksum of the planes ``spec`` reads (None for lazy or very large data)."""
    data = spec.data
    if not isinstance(data, np.ndarray) or data.nbytes > CHECKSUM_MAX_BYTES:
        return None
    crc = 0
    for plane in spec.planes:
        arr, _ = read_plane(data, plane, spec.stack_axes, spec.channel_axis)
        crc = zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).ravel(), crc)
    return crc


@dataclass
class PendingRun:
    """A started run: its job, the source layer and what the source held at the start."""

    spec: JobSpec
    layer: Any
    geometry: SourceGeometry
    fingerprint: int | None

    @classmethod
    def start(cls, spec: JobSpec, layer: Any, geometry: SourceGeometry) -> PendingRun:
        return cls(spec, layer, geometry, data_fingerprint(spec))

    def problem(self, viewer: Any) -> str | None:
        """Why the result must not be attached now (None: the source is as the run read it)."""
        layer = self.layer
        if layer not in viewer.layers:
            return (f"The image layer {layer.name!r} was removed during the run; nothing was "
                    "added.")
        if tuple(layer.data.shape[: layer.ndim]) != self.geometry.shape:
            return f"{layer.name!r} changed shape during the run; nothing was added. Run it again."
        same = layer.data is self.spec.data
        if same and self.fingerprint is not None:
            same = data_fingerprint(self.spec) == self.fingerprint
        if not same:
            return (f"The data of {layer.name!r} changed during the run; the result of the old "
                    "content was not added. Run it again.")
        return None
