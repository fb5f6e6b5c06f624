"""An in-memory image scaled to [0, 1] for a tiled run, on the run's device.

:func:`scale_large` is the host's scaling of a large image: one float32 copy, percentiles
from every pixel up to 4096² and from a regular grid above. :func:`scale_on_device` gives
the same float32 values bit for bit, made on the compute device: the raw pixels travel in
their own dtype (a quarter of the float32 bytes for 8-bit images, half for 16-bit), the
percentiles are NumPy's linear ones taken from the device's order statistics, and the
arithmetic is the host's, step for step. On an H100 the host's way had cost 0.46 s of a
0.81 s run of ViT-S/16 tiles over an 8192² field (percentiles, scaling and the upload of the
float32 copy), against 0.14 s of forward passes.

32/64-bit integers and float64 keep the host's scaling (their wide values are first made
exact on the host, :func:`~napari_attnreg.core.run.images.scale_intensity`), and so does an
Apple GPU (MPS has no float64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from napari_attnreg.core.run.images import scale_intensity

#: Up to 4096² pixels, percentiles from every pixel, as for an untiled image.
EXACT_SCALING_PIXELS = 1 << 24
#: The percentiles every scaling of an image takes (those of ``scale_intensity``).
PERCENTILES = (0.5, 99.8)
#: dtypes scaled on the device; the others are scaled on the host first.
DEVICE_DTYPES = tuple(np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.uint16,
                                            np.float16, np.float32))
CONSTANT = ("The image is constant (every pixel has the same value), so attention on it has "
            "nothing to find; check that the right layer/channel was chosen.")


def scale_large(arr: np.ndarray, percentiles: tuple[float, float] = PERCENTILES,
                window: tuple[float, float] | None = None) -> np.ndarray:
    """:func:`~napari_attnreg.core.run.images.scale_intensity` in one float32 copy of the image.

    Images up to 4096² pixels are scaled by ``scale_intensity`` itself. Larger ones take
    their percentiles from a regular grid of about 16 M pixels and are scaled in place:
    the full-image percentile and out-of-place arithmetic would need several more float32
    copies (2 GB for a 10000² image).
    """
    n_pixels = arr.shape[0] * arr.shape[1]
    if window is not None or n_pixels <= EXACT_SCALING_PIXELS or arr.dtype in (np.uint8, np.bool_):
        return scale_intensity(arr, percentiles, window)
    step = grid_step(arr.shape)
    lo, hi = (float(v) for v in np.percentile(arr[::step, ::step].astype(np.float32), percentiles))
    out = arr.astype(np.float32)
    if hi <= lo:  # spiky data: fall back to the full range
        lo, hi = float(out.min()), float(out.max())
    if hi > lo:
        out -= np.float32(lo)
        out /= np.float32(hi - lo)
        np.clip(out, 0.0, 1.0, out=out)
    else:
        out[...] = 0.0
    if float(out.max()) - float(out.min()) <= 0:
        raise ValueError(CONSTANT)
    return out


def grid_step(shape: tuple[int, ...]) -> int:
    """The stride of the grid a large image's percentiles come from (about 16 M pixels)."""
    return int(np.ceil(np.sqrt(shape[0] * shape[1] / EXACT_SCALING_PIXELS)))


@dataclass(frozen=True)
class Scaling:
    """``clip((x - offset) / divisor, 0, 1)`` computed in ``dtype``, then float32.

    The steps of :func:`scale_large` for every dtype it scales itself: uint8 is x / 255 and
    bool x / 1 in float32; up to 4096² the float64 arithmetic of ``scale_intensity`` (its
    percentiles are float64, so NumPy promotes); above, float32 in place.
    """

    dtype: torch.dtype
    offset: float
    divisor: float

    def on_host(self, arr: np.ndarray) -> np.ndarray:
        """``arr`` ``(h, w[, c])`` scaled on the host, as the device scales it."""
        host = np.float64 if self.dtype == torch.float64 else np.float32
        out = arr.astype(host)
        out -= host(self.offset)
        out /= host(self.divisor)
        return np.clip(out, 0.0, 1.0, out=out).astype(np.float32, copy=False)

    def on_device(self, raw: torch.Tensor) -> torch.Tensor:
        """``raw`` in any dtype → float32 in [0, 1], on its device."""
        # a copy (a float32 image's own memory is never written), channels first in memory
        out = raw.to(self.dtype, memory_format=torch.contiguous_format, copy=True)
        # tensors, not Python numbers: CUDA divides by a scalar as a product with its
        # reciprocal, which can differ from the division in the last bit
        if self.offset != 0:  # x - 0 is x: uint8 and bool skip a pass over the image
            out.sub_(torch.full((1,), self.offset, dtype=self.dtype, device=raw.device))
        if self.divisor != 1:
            out.div_(torch.full((1,), self.divisor, dtype=self.dtype, device=raw.device))
        if self.offset != 0 or raw.dtype not in (torch.uint8, torch.bool):  # else in [0, 1]
            out.clamp_(0.0, 1.0)
        return out.to(torch.float32)


def scale_on_device(arr: np.ndarray, device: torch.device | str,
                    window: tuple[float, float] | None = None,
                    ) -> tuple[torch.Tensor, Callable[[int], np.ndarray]]:
    """``arr`` ``(H, W[, C])`` → ``(C, H, W)`` float32 in [0, 1] on ``device`` (the values of
    :func:`scale_large`), and ``part(step)``: ``scale_large(arr)[::step, ::step]`` made on
    the host only when asked (``step=1`` is the display image, a larger one a thumbnail).
    An intensity ``window`` (low, high) is applied on the host, as an untiled run's is.
    """
    device = torch.device(device)
    # MPS has no float64, which the host's scaling of images up to 4096² uses; a window is
    # rare on a tiled image (a large radiograph) and scaled as an untiled image's is
    if window is not None or arr.dtype not in DEVICE_DTYPES or device.type == "mps":
        host = scale_large(arr, window=window)
        return (_channels_first(torch.from_numpy(host)).to(device).contiguous(),
                lambda step: host[::step, ::step])
    raw = _channels_first(upload(arr, device))
    scaling = scaling_of(arr, raw)
    if not scaling.divisor > 0:
        raise ValueError(CONSTANT)
    out = scaling.on_device(raw)
    low, high = torch.aminmax(out)
    if float(high) - float(low) <= 0:
        raise ValueError(CONSTANT)
    return out.contiguous(), lambda step: scaling.on_host(arr[::step, ::step])


def upload(arr: np.ndarray, device: torch.device, *, widen: bool | None = None) -> torch.Tensor:
    """``arr``'s pixels on ``device`` as they are stored (one copy up, in their own bytes).

    uint16 goes up as the int16 of the same bits and is widened there to int32 (``widen``,
    default: on any device but the CPU): torch's unsigned 16-bit type has few GPU kernels.
    """
    pixels = np.ascontiguousarray(arr)
    if widen is None:
        widen = device.type != "cpu"
    if pixels.dtype == np.uint16 and widen:
        bits = torch.from_numpy(pixels.view(np.int16)).to(device)
        return bits.to(torch.int32).bitwise_and_(0xFFFF)
    return torch.from_numpy(pixels).to(device)


def scaling_of(arr: np.ndarray, raw: torch.Tensor) -> Scaling:
    """The scaling :func:`scale_large` applies to ``arr``, found from ``raw`` (the same
    pixels ``(C, H, W)`` on the device)."""
    if arr.dtype == np.bool_:
        return Scaling(torch.float32, 0.0, 1.0)
    if arr.dtype == np.uint8:
        return Scaling(torch.float32, 0.0, 255.0)
    if arr.shape[0] * arr.shape[1] <= EXACT_SCALING_PIXELS:  # scale_intensity's _scaled
        lo, hi = percentiles(raw, arr.dtype)
        if hi > lo:
            return Scaling(torch.float64, lo, hi - lo)
        low, high = (np.float32(v) for v in torch.aminmax(raw.float()))
        return Scaling(torch.float32, float(low), float(high - low))  # float32, as NumPy does
    step = grid_step(arr.shape)
    lo, hi = percentiles(raw[:, ::step, ::step], arr.dtype)
    if hi <= lo:
        low, high = torch.aminmax(raw.float())
        lo, hi = float(low), float(high)
    return Scaling(torch.float32, float(np.float32(lo)), float(np.float32(hi - lo)))


def percentiles(values: torch.Tensor, dtype: np.dtype, q: tuple[float, float] = PERCENTILES,
                *, by: str | None = None) -> tuple[float, float]:
    """``np.percentile(values.astype(float32), q)`` (linear) of device values, exactly.

    On a CPU, NumPy's own percentile of floats and a histogram of integers (up to 16 bits);
    on a GPU the order statistics of a sort (a GPU's histogram counts with atomics, which
    torch's deterministic mode refuses). ``by`` (``"numpy"``, ``"histogram"``, ``"sort"``)
    chooses the way for a test.
    """
    flat = values.reshape(-1)
    if by is None:
        on_cpu = flat.device.type == "cpu"
        by = "sort" if not on_cpu else "numpy" if dtype.kind == "f" else "histogram"
    if by == "numpy":
        result = np.percentile(flat.cpu().numpy().astype(np.float32), q)
        return float(result[0]), float(result[1])
    if by == "histogram":
        statistic = _histogram_order(flat)
    else:
        ordered = torch.sort(flat.float()).values
        statistic = lambda k: float(ordered[k])  # noqa: E731
    return tuple(float(v) for v in linear_percentiles(statistic, flat.numel(), q))


def _histogram_order(flat: torch.Tensor) -> Callable[[int], float]:
    """``k`` → the k-th smallest of ``flat`` (integers of at most 16 bits), by counting."""
    values = flat.to(torch.int32)
    low = int(values.min())
    counts = torch.bincount(values - low)
    below = torch.cumsum(counts, 0)  # below[v] = how many values are <= low + v

    def statistic(k: int) -> float:
        key = torch.tensor([k], dtype=below.dtype, device=below.device)
        return float(low + int(torch.searchsorted(below, key, right=True)[0]))

    return statistic


def linear_percentiles(statistic: Callable[[int], float], n: int,
                       q: tuple[float, ...]) -> np.ndarray:
    """NumPy's linear percentiles (``method="linear"``) of ``n`` float32 values whose k-th
    smallest is ``statistic(k)``: the same index arithmetic and interpolation as
    ``np.percentile``, so the float64 results are its results bit for bit."""
    quantiles = np.true_divide(np.asarray(q, dtype=np.float64), 100)
    virtual = (n - 1) * quantiles
    previous = np.floor(virtual)
    following = previous + 1
    at_end = virtual >= n - 1
    previous[at_end] = n - 1
    following[at_end] = n - 1
    gamma = np.asarray(virtual - previous, dtype=virtual.dtype)
    gamma[at_end] = virtual[at_end] - (-1.0)  # NumPy indexes the end as -1
    a = np.array([statistic(int(k)) for k in previous], dtype=np.float32)
    b = np.array([statistic(int(k)) for k in following], dtype=np.float32)
    diff = b - a
    result = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=result, where=gamma >= 0.5, casting="unsafe")
    return result


def _channels_first(hwc: torch.Tensor) -> torch.Tensor:
    return hwc[None] if hwc.ndim == 2 else hwc.permute(2, 0, 1)
