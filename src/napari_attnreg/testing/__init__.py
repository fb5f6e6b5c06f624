"""Test articles with a known answer, kept apart from the analysis code in ``core``.

:mod:`napari_attnreg.testing.phantoms` draws CT-like phantom slices with planted lesions,
the data of the bundled ``phantom`` model.
"""

from __future__ import annotations

from napari_attnreg.testing.phantoms import (
    PhantomSample,
    make_phantom_image,
    phantom_sample,
    write_phantom_files,
)

__all__ = ["PhantomSample", "make_phantom_image", "phantom_sample", "write_phantom_files"]
