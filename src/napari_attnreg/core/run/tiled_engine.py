"""Tiled runs of large images: observed tiles, one null, statistics over all.

:func:`run_tiled` is what :func:`~napari_attnreg.core.run.engine.run_engine` runs for
``RunConfig(tiled=True)``. Tiles and null images go through the backbone in the chunk loop
of the untiled nulls (:meth:`~napari_attnreg.core.run.passes.Run.chunks`): a
:class:`~napari_attnreg.core.run.passes.Progress` after each chunk (its ``done``/``total``
count forward passes), cancellation between chunks and chunk halving on out-of-memory.
With ``null_scope="image"`` (default) the run costs ``n_tiles + B`` forward passes;
``"tile"`` draws ``B`` nulls for every tile, ``n_tiles · (1 + B)``. This module imports the
loop and the options (:mod:`.config`), never the untiled engine.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import Backbone, resolve_device
from napari_attnreg.core.models.scorers import Needs, Scorer
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.config import (
    CPU_EFFICIENT_CHUNK,
    RunConfig,
    auto_chunk_size,
    latency_chunk,
    null_config,
    scorer_of,
    tests_shares,
)
from napari_attnreg.core.run.device_scaling import scale_on_device
from napari_attnreg.core.run.images import (
    ChannelMap,
    ImageNoteWarning,
    IntensityScaling,
    PreparedImage,
    TransparencyWarning,
    check_values,
    to_channels_last,
)
from napari_attnreg.core.run.lazy import (
    ChunkCache,
    LazyImage,
    TileReader,
    intensity_range,
    sample_step,
    scaled,
    to_unit,
)
from napari_attnreg.core.run.maps import values_for_procedure
from napari_attnreg.core.run.nulls import null_images
from napari_attnreg.core.run.passes import CancelToken, Progress, Run, TokenMaps, rewarn
from napari_attnreg.core.run.tiling import (
    ImageNull,
    RunTiles,
    TileLayout,
    make_layout,
    run_tiles,
    scatter,
    work_shape,
)
from napari_attnreg.core.run.tissue import TissueMask, stored_mask, tissue_for


def tile_overlap(config: RunConfig, backbone: Backbone) -> int:
    """The overlap of a run in pixels: as given, else a quarter of the tile in whole patches.

    Side by side (0) the seams between tiles showed in the maps: a token at a tile's edge
    sees only half its neighbourhood.
    """
    if config.tile_overlap is not None:
        return int(config.tile_overlap)
    patch = min(backbone.patch_size)
    return min(backbone.input_size[1:]) // 4 // patch * patch


@dataclass(frozen=True)
class TiledImage:
    """A large image ready for tiling: its intensities in its own channels and the tiles.

    Attributes
    ----------
    source : torch.Tensor
        ``(c, H, W)`` in [0, 1] at the tiled pixel size.
    channel_map : ChannelMap
    display_part : callable
        ``display_part(step)`` → the scaled original at stride ``step``, made on the host
        when asked (:attr:`display` is stride 1, for figures; a tissue mask takes a
        thumbnail). Of an image read on demand, a strided read: of the level analysed
        when it shows more than the slide's coarser level, else the statistics' sample.
    image_shape : (int, int)
        ``(H0, W0)`` of the original image.
    layout : TileLayout
    reader : callable, optional
        ``reader(y, x, h, w)`` → ``(c, h, w)`` in [0, 1], for images that stay on disk
        (:class:`~napari_attnreg.core.run.lazy.LazyImage`); ``source`` is then a strided sample
        of the image, used for the null's statistics.
    read_raw, finish : callable, optional
        The same reading in two halves, for the reading thread: ``read_raw(index)`` → tile
        ``index``'s stored pixels (decoded on the CPU), ``finish(blocks, device)`` → their
        ``(n, c, th, tw)`` in [0, 1], scaled and resampled on ``device``.
    tissue : TissueMask, optional
        The tiles that are run (all when None).
    raw_tile_bytes : int
        Bytes of one tile's stored pixels as :attr:`read_raw` gives them (0: not read
        lazily). A slide read much coarser than its level reads a region many times the
        tile's size per tile, which bounds the tiles read ahead and per chunk.
    notes : tuple of str
        What preparing it said about the image (transparent pixels made background,
        :class:`~napari_attnreg.core.run.images.ImageNoteWarning`); the result lists them
        among its diagnostics, whoever prepared it.
    """

    source: torch.Tensor
    channel_map: ChannelMap
    display_part: Callable[[int], np.ndarray]
    image_shape: tuple[int, int]
    layout: TileLayout
    reader: Callable[[int, int, int, int], torch.Tensor] | None = None
    read_raw: Callable[[int], np.ndarray] | None = None
    finish: Callable[[Sequence[np.ndarray], torch.device], torch.Tensor] | None = None
    tissue: TissueMask | None = None
    raw_tile_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def display(self) -> np.ndarray:
        """The scaled original ``(H0, W0[, c])``, for figures."""
        return self.display_part(1)

    def tiles(self, indices: Sequence[int]) -> torch.Tensor:
        """``(len(indices), c, th, tw)`` crops of the image."""
        th, tw = self.layout.tile
        if self.read_raw is not None and self.finish is not None:
            return self.finish([self.read_raw(i) for i in indices], torch.device("cpu"))
        if self.reader is not None:
            crops = [self.reader(*self.layout.origin(i), th, tw) for i in indices]
            return torch.stack(crops)
        return _crops(self.source, self.layout, indices)

    def run_tiles(self) -> RunTiles:
        """The tiles run and the tokens they own (every tile without a tissue mask)."""
        return run_tiles(self.layout, None if self.tissue is None else self.tissue.tiles)


def _crops(source: torch.Tensor, layout: TileLayout, indices: Sequence[int]) -> torch.Tensor:
    """``(n, c, th, tw)`` tiles of ``source`` ``(c, H, W)``.

    On a GPU in one gather: a slice per tile is a Python step and a launch per tile (2,209
    of them for an 8192² field). On a CPU the slices are copied faster (144 tiles of 2048²
    RGB: 30 ms against 65 ms for the gather).
    """
    th, tw = layout.tile
    rows, cols = np.divmod(np.asarray(indices, dtype=np.int64), len(layout.starts[1]))
    origins = np.stack([np.asarray(layout.starts[0], dtype=np.int64)[rows],
                        np.asarray(layout.starts[1], dtype=np.int64)[cols]], axis=1)
    if source.device.type == "cpu":
        return torch.stack([source[:, y:y + th, x:x + tw] for y, x in origins.tolist()])
    return gathered_crops(source, origins, (th, tw))


def gathered_crops(source: torch.Tensor, origins: np.ndarray,
                   tile: tuple[int, int]) -> torch.Tensor:
    """``(n, c, th, tw)`` crops of ``source`` at ``origins`` ``(n, 2)``, in one gather."""
    device = source.device
    rows = (torch.from_numpy(origins[:, 0]).to(device)[:, None, None]
            + torch.arange(tile[0], device=device)[None, :, None])
    cols = (torch.from_numpy(origins[:, 1]).to(device)[:, None, None]
            + torch.arange(tile[1], device=device)[None, None, :])
    return source[:, rows, cols].transpose(0, 1).contiguous()


def prepare_tiled(image: Any, backbone: Backbone, config: RunConfig,
                  device: torch.device | str | None = None) -> TiledImage:
    """Scale intensities over the whole image, resize by ``tile_scale``, lay out the tiles.

    An array in memory is scaled and resized on ``device`` (default: the run's,
    ``config.device``), where its tiles are cut: the raw pixels are uploaded once, in their
    own dtype. A :class:`PreparedImage` is tiled at the size it was prepared at
    (``tile_scale`` unused).
    """
    if isinstance(image, TiledImage):
        return image
    scaling = IntensityScaling.of(config.intensity_window, config.extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImageNoteWarning)
        if scaling.note is not None and not isinstance(image, PreparedImage):
            warnings.warn(scaling.note, ImageNoteWarning, stacklevel=2)
        tiled = _prepare_tiled(image, backbone, config, device, scaling.window)
    return replace(tiled, notes=tuple(rewarn(caught, ImageNoteWarning)))


def _prepare_tiled(image: Any, backbone: Backbone, config: RunConfig,
                   device: torch.device | str | None,
                   window: tuple[float, float] | None = None) -> TiledImage:
    """:func:`prepare_tiled` of an image not yet tiled (``window``: the intensity window,
    None for percentiles)."""
    patch = backbone.patch_size
    if isinstance(image, LazyImage):
        tiled = _prepare_lazy(image, backbone, config, window)
        spec = tissue_spec(config, image)
        if isinstance(spec, str) and spec == "none":  # no thumbnail read for nothing
            return tiled
        # the thumbnail (or a user's mask) covers the whole image, the layout its crop
        return replace(tiled, tissue=tissue_for(spec, image.overview(THUMBNAIL_PIXELS),
                                                tiled.layout, covers=image.analysed_shape))
    if isinstance(image, PreparedImage):
        source, channel_map = image.source, image.channel_map
        display_part, image_shape = _strided(image.display), image.image_shape
    else:
        from napari_attnreg.core.run.planes import as_plain_array  # a masked array is refused (#18)

        arr = as_plain_array(image)
        check_values(arr)
        arr = to_channels_last(arr, channel_axis=config.channel_axis, channels=config.channels,
                               merge=config.merge)
        h0, w0 = arr.shape[:2]
        if h0 < patch[0] or w0 < patch[1]:
            raise ValueError(f"The image ({h0}x{w0} px) is smaller than one {patch[0]}x{patch[1]} "
                             "patch of this model; use a larger image or a smaller tile_scale.")
        chw, display_part = scale_on_device(arr, resolve_device(device or config.device),
                                            window)
        h, w = work_shape((h0, w0), patch, config.tile_scale)
        if (h, w) != (h0, w0):
            chw = F.interpolate(chw[None], size=(h, w), mode="bilinear",
                                antialias=h < h0 or w < w0, align_corners=False)[0]
        source = chw.contiguous()
        channel_map = ChannelMap(int(source.shape[0]), len(backbone.mean),
                                 tuple(float(v) for v in backbone.mean),
                                 tuple(float(v) for v in backbone.std))
        image_shape = (h0, w0)
    layout = make_layout(tuple(source.shape[1:]), tile=tuple(backbone.input_size[1:]),
                         patch=patch, overlap=tile_overlap(config, backbone))
    spec = tissue_spec(config, image)
    step = max(1, int(np.ceil(np.sqrt(image_shape[0] * image_shape[1] / THUMBNAIL_PIXELS))))
    tissue = (None if isinstance(spec, str) and spec == "none"
              else tissue_for(spec, display_part(step), layout))
    return TiledImage(source=source, channel_map=channel_map, display_part=_kept(display_part),
                      image_shape=(int(image_shape[0]), int(image_shape[1])), layout=layout,
                      tissue=tissue)


#: Pixels of the thumbnail an automatic tissue mask is computed from (about 2048²).
THUMBNAIL_PIXELS = 1 << 22
#: Pixels of a lazily read image's display, read from the level analysed when it shows more
#: than the coarser level (about 2048²: figures are drawn at most 1024 a side, sampled from
#: a picture twice as fine).
DISPLAY_PIXELS = 1 << 22


def tissue_spec(config: RunConfig, image: Any) -> Any:
    """The run's ``tissue_mask``: as given, else ``"auto"`` for a slide and ``"none"`` for
    any other image (a microscopy pyramid read at a level, e.g. an OME-TIFF, included)."""
    if config.tissue_mask is not None:
        return config.tissue_mask
    slide = isinstance(image, LazyImage) and image.level is not None
    return "auto" if slide and config.extra.get("image_kind", "pathology") == "pathology" \
        else "none"


def _prepare_lazy(image: LazyImage, backbone: Backbone, config: RunConfig,
                  window: tuple[float, float] | None = None) -> TiledImage:
    """Tiles read on demand; percentiles and null statistics from a strided sample.

    The image is tiled at its own pixel size (a slide read at a chosen resolution: its
    level's pixels resampled by ``image.scale``), cropped to whole patches (the last few
    pixels of the far edges, fewer than one patch, are left out so every token is exactly
    one patch of pixels; ``image_shape`` is the analysed part).
    """
    if config.tile_scale != 1 or config.channels is not None or config.merge is not None:
        raise ValueError("Images read lazily are tiled at their own pixel size with their own "
                         "channels; for tile_scale, channels or merge read the image into memory.")
    ph, pw = backbone.patch_size
    h0, w0 = image.analysed_shape
    clear = image.transparency()
    if clear > 0:  # too large to flatten in memory: said, never silently analysed
        warnings.warn(
            f"{Path(image.path).name or 'The image'}: its alpha channel marks about "
            f"{100 * clear:.3g}% of its pixels transparent, but an RGBA image this large is "
            "read tile by tile with the colours stored under them (transparency is not "
            "applied). Flatten it onto its background first (ImageMagick: magick IN "
            "-background white -flatten OUT) and run that file.",
            TransparencyWarning, stacklevel=2)
    if h0 < ph or w0 < pw:
        finer = ""
        if image.mpp is not None:  # the resolution asked for shrank it below a patch
            finer = (f"; analyse it at a finer resolution (at most "
                     f"{image.mpp * min(h0 / ph, w0 / pw):.3g} µm per pixel) or a finer level")
        raise ValueError(f"The image ({h0}x{w0} px) is smaller than one {ph}x{pw} patch{finer}.")
    h, w = h0 // ph * ph, w0 // pw * pw
    if image.overview_array is None and image.scale == 1:
        step = sample_step((h, w))
        raw = image.read(slice(0, h, step), slice(0, w, step))  # the one read of the whole extent
    else:  # a slide: its coarser level is the sample
        raw = image.overview()
    lo, hi = intensity_range(raw) if window is None else window
    sample = scaled(raw, lo, hi)
    del raw
    layout = make_layout((h, w), tile=tuple(backbone.input_size[1:]), patch=(ph, pw),
                         overlap=tile_overlap(config, backbone))
    read_region = _region_reader(image, w)
    th, tw = layout.tile

    def read_raw(index: int) -> np.ndarray:
        y, x = layout.origin(index)
        return read_region(y, x, th, tw)

    def finish(blocks: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
        if image.scale == 1:
            return to_unit(blocks, lo, hi, (th, tw), device)
        # regions larger than the tile: each shrunk alone (the same values), so a chunk
        # never holds every region's float copy at once
        return torch.cat([to_unit([block], lo, hi, (th, tw), device) for block in blocks])

    def reader(y: int, x: int, rh: int, rw: int) -> torch.Tensor:
        return to_unit([read_region(y, x, rh, rw)], lo, hi, (rh, rw))[0]

    channel_map = ChannelMap(int(sample.shape[0]), len(backbone.mean),
                             tuple(float(v) for v in backbone.mean),
                             tuple(float(v) for v in backbone.std))
    display_part = _strided(_channels_last(sample))
    if image.overview_array is not None and image.level_shown(DISPLAY_PIXELS):
        # a slide small enough is shown from the level analysed, not from its coarser level
        # (the sample above, which the statistics keep): read when a figure asks for it
        sh, sw = image.shape
        extent = (h, w) if image.scale == 1 else (min(sh, round(h * image.scale)),
                                                  min(sw, round(w * image.scale)))
        display_part = _made_once(lambda: _channels_last(
            scaled(image.picture(DISPLAY_PIXELS, extent), lo, hi)))
    region = (max(1, round(th * image.scale)), max(1, round(tw * image.scale)))
    raw_bytes = region[0] * region[1] * int(sample.shape[0]) * np.dtype(image.dtype).itemsize
    return TiledImage(source=sample, channel_map=channel_map, display_part=display_part,
                      image_shape=(h, w), layout=layout, reader=reader, read_raw=read_raw,
                      finish=finish, raw_tile_bytes=raw_bytes)


def _region_reader(image: LazyImage, width: int) -> Callable[[int, int, int, int], np.ndarray]:
    """``read(y, x, h, w)`` → the stored pixels under that region of the analysed image
    (``width`` wide: the far columns short of a whole patch are never read).

    A slide read at a coarser resolution than its level maps the region to the level's
    pixels (resampled later, on the device). An image is read a row band at a time: tiles
    come row by row, and one read of the band serves all its tiles (a file in full-width
    strips would otherwise decode the same strips once per tile); a tiled slide is read tile
    by tile, so the glass its tissue mask leaves out is never decoded.
    """
    scale, (sh, sw) = image.scale, image.shape
    band_width = min(sw, width) if scale == 1 else sw  # resampled regions round outward
    chunks = getattr(image.array, "chunks", None)
    col_axis = 2 if image.channel_axis == 0 else 1
    strips = chunks is None or len(chunks) <= col_axis or int(chunks[col_axis]) >= sw
    bands = strips or image.level is None  # a slide's tissue tiles: only their own chunks
    # a slide's stored tiles are decoded once each, not once per overlapping model tile
    cache = ChunkCache(image) if not bands and image.channel_axis != 0 else None
    band: dict[str, Any] = {}
    lock = threading.Lock()  # the reading thread and the null's reads share the band

    def read(y: int, x: int, h: int, w: int) -> np.ndarray:
        if scale != 1:
            rh, rw = max(1, round(h * scale)), max(1, round(w * scale))
            y, x = min(round(y * scale), sh - rh), min(round(x * scale), sw - rw)
            h, w = rh, rw
        if cache is not None:
            return cache.read(slice(y, y + h), slice(x, x + w))
        if not bands:
            return image.read(slice(y, y + h), slice(x, x + w))
        with lock:
            if band.get("rows") != (y, h):
                band.clear()
                band.update(rows=(y, h),
                            pixels=image.read(slice(y, y + h), slice(0, band_width)))
            return band["pixels"][:, x:x + w]

    return read


def _strided(display: np.ndarray) -> Callable[[int], np.ndarray]:
    return lambda step: display[::step, ::step]


def _channels_last(chw: torch.Tensor) -> np.ndarray:
    """``(c, h, w)`` → ``(h, w)`` for one channel, else ``(h, w, c)`` (a view)."""
    return chw[0].numpy() if chw.shape[0] == 1 else chw.permute(1, 2, 0).numpy()


def _made_once(make: Callable[[], np.ndarray]) -> Callable[[int], np.ndarray]:
    """``display_part`` of a display read from the file when first asked, then kept: a run
    that draws no figure never reads it."""
    made: list[np.ndarray] = []
    lock = threading.Lock()

    def part(step: int) -> np.ndarray:
        with lock:
            if not made:
                made.append(make())
        return made[0] if step == 1 else made[0][::step, ::step]

    return part


def _kept(part: Callable[[int], np.ndarray]) -> Callable[[int], np.ndarray]:
    """``part`` with its full-size image kept once made (a figure and a batch both ask)."""
    made: dict[int, np.ndarray] = {}

    def kept(step: int) -> np.ndarray:
        if step != 1:
            return part(step)
        if 1 not in made:
            made[1] = part(1)
        return made[1]

    return kept


TILE_OOM = ("Out of memory with a single image per chunk; use a larger tile_scale, a smaller "
            "model, or device='cpu'.")


def run_tiled(image: Any, backbone: Backbone, config: RunConfig,
              cancel: CancelToken | None = None) -> Generator[Progress, None, AttentionResult]:
    """The tiled pipeline; same contract as :func:`~napari_attnreg.core.run.engine.run_engine`.

    ``config`` must be resolved. The result's token grid covers the whole image: its
    ``model_shape`` is the tiled pixel size, so ``token_scale`` and ``to_pixels`` are exact.
    With a tissue mask only the tissue tiles are run and tested; tokens no tissue tile holds
    were never run: their p, q, lfdr and posterior (evidence) are NaN, "not measured", as
    for attention sinks left out of the test, and their attention and z hold 0 as a fill
    (see :func:`_on_image_grid`). Tokens of a run tile that are glass by the mask
    (:func:`~.tissue.glass_tokens`) are reported the same way (see :func:`_tile_statistics`).
    """
    if isinstance(image, LazyImage):  # what the file says, unless the caller said it
        config = replace(config, extra={**image.run_extra(), **config.extra})
    run = Run.start(config, cancel)
    tiled = prepare_tiled(image, backbone, config, run.device)
    # what reading and preparing the image said: diagnostics, as for an untiled run
    run.warnings_seen.extend([*config.extra.get("reading_notes", ()), *tiled.notes])
    backbone = backbone.on(run.device)  # a copy on another device; the shared one never moves
    tiled = replace(tiled, source=tiled.source.to(run.device))
    layout, owned = tiled.layout, tiled.run_tiles()
    glass = _glass_of(tiled, owned)
    scope = config.null_scope or "image"
    n_tiles = int(owned.order.size)
    n_null = int(config.n_boot) * (n_tiles if scope == "tile" else 1)
    total = n_tiles + n_null  # progress counts forward passes: the tiles, then the nulls
    chunk = _chunk_size(config, backbone, layout.tile, run)
    if tiled.raw_tile_bytes and not config.chunk_size:  # regions many times a tile's size
        chunk = min(chunk, raw_tiles_in(tiled.raw_tile_bytes))
    run.lap("prepare_s", run.t_start)

    scorer = scorer_of(config)  # a tiled class map states its target (validate_map)
    tiles = _ObservedTiles(tiled, owned.order, backbone, config, run, chunk, scorer,
                           keep_heads=keeps_head_maps(owned, backbone.num_heads))
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            # a chunk halved here stays halved for the nulls: they are images of the same size
            chunk = yield from run.chunks(tiles, n_tiles, chunk, stage="observed", label="tiles",
                                          grand_total=total, oom_message=TILE_OOM)
            tiles.close()
            run.lap("observed_s", t0)

            t0 = time.perf_counter()
            nulls = _NullTiles(tiled, owned.order, backbone, config, run, scope, scorer)
            chunk = yield from run.chunks(nulls, n_null, chunk, stage="nulls",
                                          label="null images", offset=n_tiles,
                                          grand_total=total, oom_message=TILE_OOM)
            run.synchronize()
            run.lap("nulls_s", t0)

            observed, stats = _tile_statistics(owned, layout, tiles.scores, nulls.scores,
                                               config, run, scope, scorer.needs, glass)
            heads = _head_maps(owned, layout, tiles.heads)
            if glass is not None:  # not measured: the fill of the tokens of tiles left out
                left_out = torch.from_numpy(owned.tested[glass])
                observed.view(-1)[left_out] = 0
                if heads is not None:
                    heads.view(heads.shape[0], -1)[:, left_out] = 0
            maps = TokenMaps(observed, heads, tiled.image_shape, layout.shape,
                             backbone.patch_size, tiled.channel_map.kind)
            kept = _kept_nulls(owned, layout, nulls.scores, scope) if config.keep_nulls else None
    finally:  # also when cancelled or closed early: the reading thread stops with the run
        tiles.close()
    extra = dict(**scorer.describe(), null_scope=scope, tile_shape=list(layout.tile), n_tiles=n_tiles,
                 tile_origins_y=list(layout.starts[0]), tile_origins_x=list(layout.starts[1]),
                 forward_passes=total, read_on_demand=tiled.reader is not None,
                 **_tissue_record(tiled, stats, owned, glass))
    measured = owned.tested if glass is None else owned.tested[~glass]
    result = run.result(config, backbone, stats, maps, chunk=chunk, kept=kept, extra=extra,
                        tested=None if measured.size == owned.n_image else measured)
    yield run.progress("statistics", total, total, chunk, "statistics done")
    return result


def _tissue_record(tiled: TiledImage, stats: Any, owned: RunTiles,
                   glass: np.ndarray | None) -> dict[str, Any]:
    """The metadata of the tissue mask (and the mask itself among the saved arrays).

    ``tissue_glass_tokens`` (among the saved arrays): the flat image tokens of run tiles
    left out as glass, ascending; with the run tiles they say which tokens were measured.
    """
    if tiled.tissue is None:
        return {"tissue_mask": "none"}
    stats.null_summary["tissue_mask"] = stored_mask(tiled.tissue.mask)  # for display
    stats.null_summary["tissue_tiles"] = tiled.tissue.tiles.copy()
    left_out = np.empty(0, np.int64) if glass is None else owned.tested[glass]
    stats.null_summary["tissue_glass_tokens"] = left_out.astype(
        np.int32 if owned.n_image < 2**31 else np.int64)
    return {**tiled.tissue.record(), "n_glass_tokens": int(left_out.size),
            "n_tissue_tokens": int(owned.tested.size - left_out.size)}


def _glass_of(tiled: TiledImage, owned: RunTiles) -> np.ndarray | None:
    """``(n_tested,)`` bool: the tokens of run tiles that are glass by the tissue mask
    (:meth:`~.tissue.TissueMask.glass`); None without a mask or when there are none."""
    if tiled.tissue is None:
        return None
    glass = tiled.tissue.glass(tiled.layout).reshape(-1)[owned.tested]
    return glass if bool(glass.any()) else None


#: Most tiles per chunk: the memory budget decides below it (a small model's tiles are cheap).
TILED_MAX_CHUNK = 4096
#: Stored pixels held per chunk, and again read ahead, of an image read lazily. A slide read
#: at 8 µm from a 0.25 µm level reads a 4096² region (50 MB) per 128² tile: without a bound
#: a chunk and its read-ahead held gigabytes (24 GB for a 30000² slide at --mpp 8).
RAW_CHUNK_BYTES = 256 << 20


def raw_tiles_in(raw_tile_bytes: int, budget: int | None = None) -> int:
    """Tiles whose stored pixels fit ``budget`` (default :data:`RAW_CHUNK_BYTES`; at least one)."""
    budget = RAW_CHUNK_BYTES if budget is None else budget
    return max(1, int(budget // max(1, raw_tile_bytes)))


def tiled_chunk_size(config: RunConfig, backbone: Backbone, tile: tuple[int, int],
                     device: torch.device, dtype: torch.dtype | None) -> int:
    """Tiles (and null tiles) per chunk: as given, else chosen for the device.

    On a GPU from the memory budget, up to :data:`TILED_MAX_CHUNK`; on a CPU from the memory
    budget and about a second a chunk (the cancel latency), without the untiled cap, but at
    least :data:`CPU_EFFICIENT_CHUNK` tiles where the memory budget allows.
    """
    if config.chunk_size:
        return int(config.chunk_size)
    chunk = auto_chunk_size(backbone, tile, device, dtype, config.memory_fraction,
                            largest=TILED_MAX_CHUNK)
    if device.type == "cpu":
        chunk = min(chunk, max(CPU_EFFICIENT_CHUNK, latency_chunk(backbone, tile)))
    return chunk


def _chunk_size(config: RunConfig, backbone: Backbone, tile: tuple[int, int], run: Run) -> int:
    return tiled_chunk_size(config, backbone, tile, run.device, run.dtype)


def _forward(tiled: TiledImage, backbone: Backbone, config: RunConfig, run: Run,
             images: torch.Tensor, scorer: Scorer) -> torch.Tensor:
    """The map's scores ``(n, T_tile)`` of ``(n, c, th, tw)`` tiles in the image's own
    channels (maps made of the CLS attention: from one :func:`cls_attention` call)."""
    batch = tiled.channel_map(images)
    with run.amp():
        if scorer.needs.cls_heads:
            maps = cls_attention(backbone, batch, layer=config.layer, head=scorer.cls_head)
            return maps.reshape(*maps.shape[:-2], -1).float()
        return scorer.score(backbone, batch).float()


class _ObservedTiles:
    """The step of the observed pass: every head's attention and the map on run tiles
    ``start .. + size``.

    ``heads`` is ``(n_run, n_heads, tgh, tgw)`` and ``scores`` ``(n_run, tile tokens)``, both
    on the CPU (a large image has many tiles); ``heads`` is None when the result will not
    keep the per-head maps (:func:`keeps_head_maps`). A lazy image's tiles come from a
    :class:`TileReader` thread, two chunks ahead.
    """

    def __init__(self, tiled: TiledImage, order: np.ndarray, backbone: Backbone,
                 config: RunConfig, run: Run, chunk: int, scorer: Scorer,
                 keep_heads: bool = True) -> None:
        self.tiled, self.backbone, self.config, self.run = tiled, backbone, config, run
        self.scorer = scorer
        self.order = [int(i) for i in order]
        grid = tiled.layout.tile_grid
        # a slide's heads of every run tile would be the run's largest array (0.4 GB for
        # a 50,000² field in ViT-S/16 tiles): made only when the result keeps them
        self.heads = (torch.empty((len(self.order), backbone.num_heads, *grid),
                                  dtype=torch.float32) if keep_heads else None)
        self.scores = torch.empty((len(self.order), grid[0] * grid[1]), dtype=torch.float32)
        depth = min(2 * chunk, raw_tiles_in(tiled.raw_tile_bytes)) if tiled.raw_tile_bytes \
            else 2 * chunk
        self.reader = (TileReader(tiled.read_raw, self.order, depth=depth)
                       if tiled.read_raw is not None else None)

    def __call__(self, start: int, size: int) -> None:
        if self.reader is not None:
            batch = self.tiled.finish(self.reader.take(start, size), self.run.device)
        else:
            batch = self.tiled.tiles(self.order[start:start + size]).to(self.run.device)
        with self.run.amp():
            heads = cls_attention(self.backbone, self.tiled.channel_map(batch),
                                  layer=self.config.layer, head="all").float().cpu()
        if self.heads is not None:
            self.heads[start:start + size] = heads
        if self.scorer.needs.cls_heads:  # one reduction over the head axis for the chunk
            self.scores[start:start + size] = self.scorer.from_heads(heads.flatten(2))
        else:
            self.scores[start:start + size] = _forward(self.tiled, self.backbone, self.config,
                                                       self.run, batch, self.scorer).cpu()

    def close(self) -> None:
        """Stop the reading thread (idempotent)."""
        if self.reader is not None:
            self.reader.close()


class _NullTiles:
    """The step of the null pass: null tiles ``start .. start + size``, scored.

    ``null_scope="image"``: job ``j`` is null image ``j``, a tile-sized draw from the whole
    image's statistics; ``scores`` is ``(B, tile tokens)``. ``"tile"``: job ``j`` is null
    ``j % B`` of run tile ``j // B``, seeded by ``j`` so tiles differ; ``scores`` is
    ``(B, n_run · tile tokens)``, tile after tile.
    """

    def __init__(self, tiled: TiledImage, order: np.ndarray, backbone: Backbone,
                 config: RunConfig, run: Run, scope: str, scorer: Scorer) -> None:
        self.tiled, self.backbone, self.config, self.run = tiled, backbone, config, run
        layout = tiled.layout
        self.order = [int(i) for i in order]
        self.n_boot = int(config.n_boot)
        self.tile_tokens = layout.tile_grid[0] * layout.tile_grid[1]
        self.null_config = null_config(config, backbone.patch_size[0])
        self.scorer = scorer
        columns = self.tile_tokens * (len(self.order) if scope == "tile" else 1)
        self.scores = torch.empty((self.n_boot, columns), dtype=torch.float32,
                                  device=run.device)
        self.image_null = (ImageNull(tiled.source, self.null_config, layout.tile,
                                     backbone.patch_size[0], reader=tiled.reader,
                                     shape=layout.shape, accept=_in_tissue(tiled),
                                     tissue=None if tiled.tissue is None else tiled.tissue.mask)
                           if scope == "image" else None)

    def __call__(self, start: int, size: int) -> None:
        jobs = range(start, start + size)
        own = self._draw(jobs)
        if self.config.procedure.clamps_nulls:  # the observed tiles went through the clamp
            own.clamp_(0.0, 1.0)
        maps = _forward(self.tiled, self.backbone, self.config, self.run, own,
                        self.scorer).reshape(size, -1)
        if self.image_null is not None:
            self.scores[start:start + size] = maps
            return
        # one indexed copy, not one per null map (a launch each on a GPU: 440,000 for a
        # slide of 2,200 tiles at B = 200)
        job = torch.arange(start, start + size, device=self.scores.device)
        per_tile = self.scores.view(self.n_boot, -1, self.tile_tokens)
        per_tile[job % self.n_boot, job // self.n_boot] = maps.to(self.scores.dtype)

    def _draw(self, jobs: range) -> torch.Tensor:
        if self.image_null is not None:
            return self.image_null.draw(jobs, seed=self.config.seed)
        n_boot, device = self.n_boot, self.run.device
        return torch.cat([
            null_images(self.tiled.tiles([self.order[rank]])[0].to(device),
                        [j for j in jobs if j // n_boot == rank], self.null_config,
                        seed=self.config.seed, patch_size=self.backbone.patch_size[0])
            for rank in sorted({j // n_boot for j in jobs})])


def _in_tissue(tiled: TiledImage) -> Callable[[int, int], bool] | None:
    """Whether a null tile at ``(y, x)`` has its centre on tissue (None: no mask)."""
    if tiled.tissue is None:
        return None
    mask = tiled.tissue.mask
    (h, w), (th, tw) = tiled.layout.shape, tiled.layout.tile

    def accept(y: int, x: int) -> bool:
        my = min(mask.shape[0] - 1, int((y + th / 2) * mask.shape[0] / h))
        mx = min(mask.shape[1] - 1, int((x + tw / 2) * mask.shape[1] / w))
        return bool(mask[my, mx])

    return accept


#: Most values (heads × image tokens) of the per-head maps a tiled result keeps. A whole slide's
#: grid is tens of millions of tokens: its head maps in float64 (1.25 GB for 4 heads on a
#: 50,000² slide) plus their float32 assembly would be the largest part of the run's memory,
#: and a tiled run never needs them (it refuses ``map="heads"``, the one reader of them in the
#: patch report). 2**24 values keep them for every field up to 8192² with a ViT-S/16 or the
#: demo model.
TILED_HEADS_MAX_VALUES = 2**24


def keeps_head_maps(owned: RunTiles, n_heads: int) -> bool:
    """Whether a tiled result keeps its per-head maps: up to :data:`TILED_HEADS_MAX_VALUES`."""
    return n_heads * owned.n_image <= TILED_HEADS_MAX_VALUES


def _head_maps(owned: RunTiles, layout: TileLayout,
               heads: torch.Tensor | None) -> torch.Tensor | None:
    """The per-head maps on the image grid, or None when the result does not keep them."""
    if heads is None or not keeps_head_maps(owned, heads.shape[1]):
        return None
    return _assemble(owned, layout, heads)


def _assemble(owned: RunTiles, layout: TileLayout, tile_maps: torch.Tensor) -> torch.Tensor:
    """``(n_run, ..., tgh, tgw)`` run-tile maps → ``(..., gh, gw)``, 0 where untested."""
    if owned.order.size == layout.n_tiles:
        return layout.assemble(tile_maps)
    flat = tile_maps.reshape(tile_maps.shape[0], -1, layout.tile_grid[0] * layout.tile_grid[1])
    picked = flat[torch.from_numpy(owned.family), :, torch.from_numpy(owned.local)]
    out = torch.zeros((owned.n_image, flat.shape[1]), dtype=flat.dtype, device=flat.device)
    out[torch.from_numpy(owned.tested)] = picked
    return out.transpose(0, 1).contiguous().reshape(*tile_maps.shape[1:-2], *layout.grid_shape)


def _tile_statistics(owned: RunTiles, layout: TileLayout, scores: torch.Tensor,
                     null_scores: torch.Tensor, config: RunConfig, run: Run,
                     scope: str, needs: Needs,
                     glass: np.ndarray | None = None) -> tuple[torch.Tensor, Any]:
    """The map of the whole image from its run tiles, and the preset's statistics on the
    tokens the run tiles hold.

    Under the step-down preset every run tile is a family of its own; tiles left out by a
    tissue mask are no family, so they take no share of the BH level. The statistics see the
    values their procedure tests (:func:`~.maps.values_for_procedure`); the returned map is
    the raw one, for display.

    ``glass`` (bool over ``owned.tested``): tokens of run tiles that are glass by the mask,
    reported as not measured. The step-down tests every tile whole (the model saw the tile
    whole, and dropping hypotheses after a test that controls the family-wise error keeps
    that control) and drops them afterwards. The pooled presets leave them out before the
    statistics: the mask does not depend on the attention, and glass counted in π0, the
    q-values' Benjamini–Hochberg count and the lfdr fit would change the tissue's q and lfdr.
    """
    raw = scores.reshape(scores.shape[0], *layout.tile_grid)
    tested, null_scores = values_for_procedure(
        scores, null_scores, signed=needs.signed, sign=config.sign,
        shares=tests_shares(config), log_scale=needs.shares)
    tile_maps = tested.reshape(raw.shape)
    observed = _assemble(owned, layout, tile_maps)
    positions = owned.local
    if scope == "tile":  # each tile's null is its own: positions run over all tiles' tokens
        positions = owned.family * (layout.tile_grid[0] * layout.tile_grid[1]) + positions
    # tiles are families of the step-down only: the pooled presets pool every tile (METHOD)
    tiles = {"families": tile_maps.reshape(owned.order.size, -1).to(run.device),
             "owner": (owned.family, owned.local),
             "family_tokens": owned.family_tokens} if tests_shares(config) else {}
    values = observed.reshape(-1)[torch.from_numpy(owned.tested)]
    pooled = glass is not None and not tiles
    if pooled:  # glass left out before pooling (see above)
        values, positions = values[torch.from_numpy(~glass)], positions[~glass]
    stats = run.statistics(config, values, null_scores, positions, **tiles)
    return _assemble(owned, layout, raw), _on_image_grid(owned, stats, glass, pooled)


def _on_image_grid(owned: RunTiles, stats: Any, glass: np.ndarray | None = None,
                   pooled: bool = False) -> Any:
    """Statistics of the tested tokens spread over the image grid.

    Tokens no run tile holds (glass a tissue mask left out) were never run: p, q, lfdr and
    posterior are NaN there, the convention of tokens left out of the test
    (:func:`~.maps.mark_untested`), so a saved p or q map never counts them as tested and
    not significant. z is 0 there, a fill as the attention's 0 is: the rules read z only
    with p, which says the token was not tested, and a NaN z would be refused by them.
    The tokens ``glass`` (bool over ``owned.tested``) of run tiles are reported the same way;
    ``pooled``: the statistics hold the other tokens alone, else every tested token. The
    step-down's stored steps still name them (the test is unchanged); their NaN evidence
    keeps every rule from marking them.
    """
    if owned.complete and glass is None:
        return stats
    measured = owned.tested if glass is None else owned.tested[~glass]

    def spread(values: np.ndarray, fill: float) -> np.ndarray:
        values = np.asarray(values)
        if glass is not None and not pooled:
            values = values[~glass]
        return scatter(measured, owned.n_image, values, fill)

    summary = dict(stats.null_summary)
    if "stepdown_step_token" in summary:  # stored steps name image tokens
        summary["stepdown_step_token"] = owned.tested[summary["stepdown_step_token"]] \
            .astype(np.int32)
        summary["stepdown_family"] = spread(summary["stepdown_family"], -1).astype(np.int32)
    return replace(stats, z=spread(stats.z, 0.0), p=spread(stats.p, np.nan),
                   lfdr=spread(stats.lfdr, np.nan), posterior=spread(stats.posterior, np.nan),
                   q=spread(stats.q, np.nan), null_summary=summary)


def _kept_nulls(owned: RunTiles, layout: TileLayout, null_scores: torch.Tensor,
                scope: str) -> np.ndarray:
    """The null maps to keep: per-tile nulls have a place in the image, image-level ones not."""
    n_boot = null_scores.shape[0]
    kept = null_scores.reshape(n_boot, -1, *layout.tile_grid).cpu()
    return (_assemble(owned, layout, kept.transpose(0, 1)) if scope == "tile"
            else kept[:, 0]).numpy()
