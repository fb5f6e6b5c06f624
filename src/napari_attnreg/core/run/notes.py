"""What preparing or reading an image says about it, for the result's diagnostics.

Torch-free, so a file reader can catch these warnings without loading the model's stack.
"""

from __future__ import annotations


class ImageNoteWarning(UserWarning):
    """Something about the image as it was read or prepared that its result lists among its
    diagnostics (:attr:`~napari_attnreg.core.run.images.PreparedImage.notes`, a reader's
    :attr:`~napari_attnreg.io.readers.ImageInfo.notes`)."""


class TransparencyWarning(ImageNoteWarning):
    """An RGBA image has transparent pixels: they were analysed as a plain background."""
