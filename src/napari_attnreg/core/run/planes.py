"""One image or a stack of images: which axes index planes, which axis holds channels.

Every front end (Python, CLI, napari, notebook) turns its array into a :class:`PlaneStack`
and runs one plane at a time, so a file or a layer is split the same way everywhere. The
array is never copied: a dask or zarr array is read one plane at a time by :meth:`read`.

Rules when the layout is not given (``rgb=None``, no ``channel_axis``, no ``channel_last``):

- ``(H, W)`` is a grey image; ``(H, W, 3|4)`` is RGB(A); ``(H, W, 1|2)`` has 1 or 2 channels
  (never ``H`` planes of ``W × 2`` pixels);
- ``(N, H, W)`` with ``N > 4`` is a stack of ``N`` grey planes; with ``N ≤ 4`` it may as well be
  ``N`` channels, so it is refused with advice (unless ``stack=True`` says it is a stack);
- ``(..., H, W, 1..4)`` with more leading axes is refused with advice: a stack of colour
  images needs ``rgb=True`` or ``channel_last=True``.

Example
-------
>>> import numpy as np
>>> stack = PlaneStack.from_array(np.zeros((5, 64, 80, 3), np.uint8), rgb=True)
>>> stack.n_planes, stack.plane_shape, stack.planes()[:2]
(5, (64, 80), [(0,), (1,)])
>>> plane, channel_axis = stack.read((2,))
>>> plane.shape, channel_axis
((64, 80, 3), None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PlaneIndex = tuple[int, ...]

AMBIGUOUS_CHANNELS = 4  # a first axis this short may be channels as well as planes


def as_plain_array(image: Any) -> np.ndarray:
    """``np.asarray(image)``, refusing a masked array (whose mask ``asarray`` would drop).

    Raises
    ------
    ValueError
        ``image`` is a ``numpy.ma.MaskedArray``: the values under its mask would be analysed
        as if they were image. There is no neutral value to put there for a ViT, so the
        caller chooses one.
    """
    if isinstance(image, np.ma.MaskedArray):
        raise ValueError("The image is a masked array; its mask would be ignored and the values "
                         "under it analysed. Pass image.filled(value) with a background value "
                         "of your choice, or image.data to analyse every pixel.")
    try:
        arr = np.asarray(image)
    except ValueError as err:  # nested lists of unequal lengths
        raise ValueError(f"The image is not a rectangular array ({err}); pass a 2D (or "
                         "stacked) array of numbers.") from None
    if arr.dtype.kind not in "biufc":  # objects, text, dates: numpy's own errors say less
        raise ValueError(f"Image dtype {arr.dtype} is not numeric; pass an array of numbers "
                         "(e.g. np.asarray(image, dtype=float)).")
    return arr


def _shape(data: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in data.shape)


def _normalise_axis(axis: Any, ndim: int, shape: tuple[int, ...]) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"channel_axis must be an integer axis number, got {axis!r}.")
    if not -ndim <= int(axis) < ndim:
        raise ValueError(f"channel_axis={int(axis)} does not exist for an image of shape {shape} "
                         f"({ndim} axes): give a number from {-ndim} to {ndim - 1}.")
    return int(axis) % ndim


@dataclass(frozen=True)
class PlaneStack:
    """An image or a stack of images: which axes index planes, which axis holds channels.

    Attributes
    ----------
    data : array-like
        numpy, dask or zarr array; never copied, planes are read on demand.
    stack_axes : tuple of int
        Data axes that index planes (iterated in C order).
    channel_axis : int or None
        Data axis of channels (multichannel) or of RGB(A) colours.
    rgb : bool
        The channel axis is a trailing RGB(A) axis (transparent pixels become background
        when the image is prepared).
    """

    data: Any
    stack_axes: tuple[int, ...]
    channel_axis: int | None
    rgb: bool = False

    @classmethod
    def from_array(cls, data: Any, *, channel_axis: int | None = None, rgb: bool | None = None,
                   channel_last: bool = False, stack: bool = False) -> PlaneStack:
        """Work out the layout of ``data``, or refuse it with a message that says what to give.

        Parameters
        ----------
        data : array-like
            At least 2D. Anything without ``shape`` is converted with ``np.asarray``.
        channel_axis : int, optional
            Axis of channels (negative counts from the end).
        rgb : bool, optional
            ``True``: the last axis (3 or 4 long) is RGB(A); ``False``: there is no colour axis;
            ``None``: decide from the shape where that is unambiguous.
        channel_last : bool
            The last axis holds channels (RGB(A) if 3 or 4 long and ``rgb`` is not ``False``).
        stack : bool
            The caller says the leading axes are planes (e.g. ``regularize_stack``), so a short
            first axis of a 3D array is not mistaken for channels.

        Raises
        ------
        ValueError
            Fewer than 2 axes, an empty axis, a channel axis that does not exist, or an
            ambiguous layout.
        """
        if isinstance(data, np.ndarray) or not (
                hasattr(data, "shape") and hasattr(data, "__getitem__")):
            data = as_plain_array(data)  # a masked stack is refused, not read without its mask
        shape = _shape(data)
        ndim = len(shape)
        if ndim < 2:
            raise ValueError(f"Expected an image with at least 2 axes (H, W), got shape {shape}.")
        if 0 in shape:
            raise ValueError(f"The image/stack is empty: shape {shape} has an axis of length 0; "
                             "load a non-empty image.")
        axis = None if channel_axis is None else _normalise_axis(channel_axis, ndim, shape)
        if channel_last:
            if axis is not None and axis != ndim - 1:
                raise ValueError(f"channel_last=True puts channels on the last axis, but "
                                 f"channel_axis={channel_axis} was given too; give one of them.")
            axis = ndim - 1
        if rgb:
            if ndim < 3 or shape[-1] not in (3, 4):
                raise ValueError(f"rgb=True needs a last axis of length 3 or 4, got shape {shape}.")
            if axis is not None and axis != ndim - 1:
                raise ValueError(f"rgb=True puts colours on the last axis, but channel_axis="
                                 f"{channel_axis} was given too; give one of them.")
            axis = ndim - 1
        elif rgb is None and axis is None:
            axis, rgb = cls._infer(shape, stack)
        elif rgb is None:  # channels last of 3 or 4 are colours unless rgb=False says otherwise
            rgb = channel_last and axis == ndim - 1 and shape[-1] in (3, 4)
        if axis is not None and ndim < 3:
            raise ValueError(f"A channel axis needs an image with 3 or more axes, got shape "
                             f"{shape}.")
        image_axes = [a for a in range(ndim) if a != axis][-2:]
        stack_axes = tuple(a for a in range(ndim) if a != axis and a not in image_axes)
        return cls(data, stack_axes, axis, bool(rgb))

    @staticmethod
    def _infer(shape: tuple[int, ...], stack: bool) -> tuple[int | None, bool]:
        """``(channel_axis, rgb)`` from the shape alone, or a ValueError when it is ambiguous."""
        ndim, last = len(shape), shape[-1]
        if ndim == 2:
            return None, False
        if ndim == 3 and last in (3, 4):
            return 2, True
        if ndim == 3 and last <= 2:
            return 2, False
        if last <= 4:
            raise ValueError(
                f"A stack of shape {shape} ends in an axis of length {last}: if those are colours "
                "or channels, say so with rgb=True or channel_last=True (command line: "
                "--channel-axis -1); otherwise the planes would be only "
                f"{shape[-2]}x{last} px.")
        if ndim == 3 and shape[0] <= AMBIGUOUS_CHANNELS and not stack:
            raise ValueError(
                f"An image of shape {shape} is ambiguous: {shape[0]} channels or {shape[0]} "
                "planes? For channels give channel_axis=0 (command line: --channel-axis 0); for "
                "planes use regularize_stack() or split the file into one image per plane.")
        return None, False

    @property
    def image_axes(self) -> tuple[int, int]:
        """The data axes of the plane's rows and columns."""
        rows, cols = (a for a in range(len(self.shape))
                      if a != self.channel_axis and a not in self.stack_axes)
        return rows, cols

    @property
    def shape(self) -> tuple[int, ...]:
        return _shape(self.data)

    @property
    def stack_shape(self) -> tuple[int, ...]:
        """Lengths of the stack axes (``()`` for a single image)."""
        return tuple(self.shape[a] for a in self.stack_axes)

    @property
    def plane_shape(self) -> tuple[int, int]:
        """``(H, W)`` of every plane."""
        rows, cols = self.image_axes
        return self.shape[rows], self.shape[cols]

    @property
    def n_channels(self) -> int:
        """Channels (or colours) per plane; 1 for grey."""
        return 1 if self.channel_axis is None else self.shape[self.channel_axis]

    @property
    def n_planes(self) -> int:
        return int(np.prod(self.stack_shape, dtype=np.int64))

    @property
    def is_stack(self) -> bool:
        return bool(self.stack_axes)

    def planes(self) -> list[PlaneIndex]:
        """Every plane index in C order; ``[()]`` for a single image."""
        return [tuple(int(i) for i in idx) for idx in np.ndindex(self.stack_shape)]

    def plane_channel_axis(self) -> int | None:
        """Channel axis within a plane read by :meth:`read` (None for grey and RGB(A))."""
        if self.channel_axis is None or self.rgb:
            return None
        return self.channel_axis - sum(1 for a in self.stack_axes if a < self.channel_axis)

    def read(self, plane: PlaneIndex) -> tuple[np.ndarray, int | None]:
        """One plane as a numpy array, and its channel axis within it.

        The channel axis keeps its place relative to the image axes. RGB(A) planes come as
        ``(H, W, 3|4)`` with channel axis None, which ``prepare_image`` reads as colour.
        """
        plane = tuple(plane)
        if len(plane) != len(self.stack_axes) or any(
                not 0 <= int(i) < n for i, n in zip(plane, self.stack_shape, strict=True)):
            raise ValueError(f"Plane {plane} is not in this stack of shape {self.stack_shape}.")
        index: list[Any] = [slice(None)] * len(self.shape)
        for axis, i in zip(self.stack_axes, plane, strict=True):
            index[axis] = int(i)
        return np.asarray(self.data[tuple(index)]), self.plane_channel_axis()

    def describe(self, plane: PlaneIndex, names: tuple[str, ...] = ()) -> str:
        """``"plane 2, 0"`` (``"z = 2"`` with the stack axes' ``names``) for a stack, ``""``
        for a single image (for messages, labels)."""
        return plane_label(plane, names) if self.stack_axes else ""


def plane_label(plane: PlaneIndex, names: tuple[str, ...] = ()) -> str:
    """A plane as a message names it: ``"z = 2, t = 0"`` where the stack axes have ``names``
    (one per index), else ``"plane 2, 0"``; never a Python tuple such as ``(2,)``."""
    plane = tuple(int(i) for i in plane)
    if names and len(names) == len(plane):
        return ", ".join(f"{name} = {i}" for name, i in zip(names, plane))
    return "plane " + ", ".join(str(i) for i in plane)


def layout_from_axes(axes: str) -> dict[str, Any]:
    """:meth:`PlaneStack.from_array` keywords from a file's axis letters (tifffile, OME).

    ``C`` is channels, a last ``S`` samples (colours or channels), other named axes (Z, T, ...)
    planes. Unnamed pages (``Q``) are planes unless the shape says channels (``(H, W, 2)``);
    planar samples of unknown meaning (a leading ``S``, as tifffile writes any ``(3, H, W)``)
    follow the shape rules alone, which call a short first axis ambiguous.

    >>> layout_from_axes("TCZYX"), layout_from_axes("YXS"), layout_from_axes("ZYX")
    ({'channel_axis': 1}, {'channel_last': True}, {'rgb': False})
    """
    axes = axes.upper()
    if "S" in axes[:-1] or len(axes) < 3 or axes[-2:] not in ("YX", "XS"):
        return {}
    if "C" in axes:
        return {} if axes.endswith("S") else {"channel_axis": axes.index("C")}
    if axes.endswith("S"):
        return {"channel_last": True}
    return {"stack": True} if "Q" in axes else {"rgb": False}
