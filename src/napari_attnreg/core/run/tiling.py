"""Tile layout of a large image and the image-level null (no GUI, no model).

A large image is analysed at its native pixel size (or downsampled by ``tile_scale``)
instead of being shrunk to the model's input size: it is cut into tiles of that input
size, every tile's tokens land on one token grid over the whole image, and the bootstrap
null is drawn once for the whole image (:class:`ImageNull`) rather than once per tile.

Example
-------
>>> layout = make_layout((300, 200), tile=(128, 128), patch=(8, 8), overlap=16)
>>> layout.starts
((0, 112, 172), (0, 72))
>>> layout.grid_shape, layout.n_tiles
((37, 25), 6)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from napari_attnreg.core.run.nulls import (
    NullConfig,
    image_seed,
    normal_draws,
    resampled_pixels,
    shuffled_blocks,
    uniform_draws,
)


def _axis_starts(length: int, size: int, overlap: int) -> tuple[int, ...]:
    """Tile origins along one axis: a regular stride, the last tile flush with the end."""
    if length <= size:
        return (0,)
    stride = size - overlap
    starts = list(range(0, length - size, stride))
    starts.append(length - size)  # never a partial tile: the last one overlaps more instead
    return tuple(starts)


@dataclass(frozen=True)
class TileLayout:
    """Where the tiles of an image lie, and which tile each token of the image comes from.

    Attributes
    ----------
    shape : (int, int)
        ``(H, W)`` of the image that is tiled, multiples of the patch size.
    tile : (int, int)
        Tile size ``(th, tw)``; smaller than the model input only when the image is.
    patch : (int, int)
    starts : (tuple of int, tuple of int)
        Tile origins along y and along x; tiles are the product, in C order.
    """

    shape: tuple[int, int]
    tile: tuple[int, int]
    patch: tuple[int, int]
    starts: tuple[tuple[int, ...], tuple[int, ...]]

    @property
    def n_tiles(self) -> int:
        return len(self.starts[0]) * len(self.starts[1])

    @property
    def grid_shape(self) -> tuple[int, int]:
        """Token grid over the whole image."""
        return (self.shape[0] // self.patch[0], self.shape[1] // self.patch[1])

    @property
    def tile_grid(self) -> tuple[int, int]:
        """Token grid of one tile."""
        return (self.tile[0] // self.patch[0], self.tile[1] // self.patch[1])

    def origin(self, index: int) -> tuple[int, int]:
        """``(y, x)`` pixel origin of tile ``index`` (C order over the starts)."""
        iy, ix = divmod(int(index), len(self.starts[1]))
        return (self.starts[0][iy], self.starts[1][ix])

    @cached_property
    def _owners(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per axis: the tile whose centre is nearest each token's centre, and the local index.

        Tiles are a product of per-axis origins and all have one size, so the nearest centre
        in 2D is the nearest along each axis; it always contains the token.
        """
        out = []
        for axis in range(2):
            p, size = self.patch[axis], self.tile[axis]
            token_centre = (np.arange(self.grid_shape[axis]) + 0.5) * p
            starts = np.asarray(self.starts[axis])
            distance = np.abs(token_centre[:, None] - (starts[None, :] + size / 2))
            owner = np.argmin(distance, axis=1)  # ties: the first tile
            local = (np.arange(self.grid_shape[axis]) * p - starts[owner]) // p
            out += [owner, local]
        return tuple(out)  # type: ignore[return-value]

    def tile_index(self) -> np.ndarray:
        """``(gh, gw)`` index of the tile each image token is taken from."""
        oy, _, ox, _ = self._owners
        return oy[:, None] * len(self.starts[1]) + ox[None, :]

    def local_index(self) -> np.ndarray:
        """``(gh, gw)`` flat index of each image token inside its tile's token grid."""
        _, ly, _, lx = self._owners
        return ly[:, None] * self.tile_grid[1] + lx[None, :]

    def tile_tokens(self, indices: np.ndarray | None = None) -> np.ndarray:
        """``(n, tgh·tgw)`` flat image-grid index of every token of the tiles ``indices``
        (all tiles, in order, by default)."""
        tgh, tgw = self.tile_grid
        gw = self.grid_shape[1]
        iy, ix = (np.divmod(np.arange(self.n_tiles), len(self.starts[1])) if indices is None
                  else np.divmod(np.asarray(indices, dtype=np.int64), len(self.starts[1])))
        ty = np.asarray(self.starts[0], dtype=np.int64)[iy] // self.patch[0]
        tx = np.asarray(self.starts[1], dtype=np.int64)[ix] // self.patch[1]
        rows = (ty[:, None] + np.arange(tgh))[:, :, None] * gw
        cols = (tx[:, None] + np.arange(tgw))[:, None, :]
        return (rows + cols).reshape(-1, tgh * tgw)

    def assemble(self, tile_maps: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """``(n_tiles, ..., tgh, tgw)`` per-tile token maps → ``(..., gh, gw)`` image map."""
        tgh, tgw = self.tile_grid
        if tuple(tile_maps.shape[-2:]) != (tgh, tgw) or tile_maps.shape[0] != self.n_tiles:
            raise ValueError(f"expected ({self.n_tiles}, ..., {tgh}, {tgw}) tile maps, "
                             f"got {tuple(tile_maps.shape)}")
        flat = tile_maps.reshape(self.n_tiles, -1, tgh * tgw)
        tile, local = self.tile_index().ravel(), self.local_index().ravel()
        if isinstance(flat, torch.Tensor):
            tile, local = torch.from_numpy(tile), torch.from_numpy(local)
        picked = flat[tile, :, local]  # (gh·gw, k)
        if isinstance(picked, np.ndarray):
            return np.ascontiguousarray(picked.T).reshape(*tile_maps.shape[1:-2], *self.grid_shape)
        # contiguous: strided inputs take other (scalar) kernels, which round differently
        return picked.transpose(0, 1).contiguous().reshape(*tile_maps.shape[1:-2], *self.grid_shape)


@dataclass(frozen=True)
class RunTiles:
    """The tiles a run computes (all of them, or a tissue mask's) and the tokens they own.

    Each image token is owned by the run tile whose centre is nearest (among the run tiles
    that contain it); a token no run tile contains is untested. With every tile run this is
    :meth:`TileLayout.tile_index` / :meth:`TileLayout.local_index` exactly.

    Attributes
    ----------
    order : np.ndarray
        ``(n_run,)`` layout indices of the run tiles, ascending; run tile ``k`` is family ``k``.
    tested : np.ndarray
        ``(n_tested,)`` flat image-grid indices of the tokens a run tile owns.
    family, local : np.ndarray
        ``(n_tested,)`` the owning run tile (its rank in ``order``) and the index inside it.
    family_tokens : np.ndarray
        ``(n_run, tgh·tgw)`` every token of every run tile as an index into ``tested``.
    n_image : int
        Tokens of the whole image grid.
    """

    order: np.ndarray
    tested: np.ndarray
    family: np.ndarray
    local: np.ndarray
    family_tokens: np.ndarray
    n_image: int

    @property
    def complete(self) -> bool:
        """Every token is tested (every tile is run, or the run tiles cover the image)."""
        return self.tested.size == self.n_image

    def scatter(self, values: np.ndarray, fill: float) -> np.ndarray:
        """``(n_tested,)`` values → ``(n_image,)``, ``fill`` at untested tokens."""
        return scatter(self.tested, self.n_image, values, fill)


def scatter(tokens: np.ndarray, n_image: int, values: np.ndarray, fill: float) -> np.ndarray:
    """Values of the flat image tokens ``tokens`` (ascending) → ``(n_image,)``, ``fill``
    elsewhere (float64 or wider); ``values`` itself when ``tokens`` are all of them."""
    if tokens.size == n_image:
        return np.asarray(values)
    out = np.full(n_image, fill, dtype=np.result_type(np.asarray(values).dtype, np.float64))
    out[tokens] = values
    return out


def run_tiles(layout: TileLayout, keep: np.ndarray | None = None) -> RunTiles:
    """The :class:`RunTiles` of ``layout`` when only the tiles ``keep`` (bool) are run."""
    n_image = layout.grid_shape[0] * layout.grid_shape[1]
    if keep is None or bool(np.all(keep)):
        return RunTiles(order=np.arange(layout.n_tiles), tested=np.arange(n_image),
                        family=layout.tile_index().ravel(), local=layout.local_index().ravel(),
                        family_tokens=layout.tile_tokens(), n_image=n_image)
    order = np.flatnonzero(np.asarray(keep, dtype=bool))
    tgh, tgw = layout.tile_grid
    (ph, pw), (th, tw) = layout.patch, layout.tile
    # every (run tile, local token) pair: the image token, its distance to the tile's centre
    tokens = layout.tile_tokens(order)
    dy = np.abs((np.arange(tgh) + 0.5) * ph - th / 2)
    dx = np.abs((np.arange(tgw) + 0.5) * pw - tw / 2)
    distance = np.broadcast_to((dy[:, None] + dx[None, :]).ravel(), tokens.shape)
    rank = np.broadcast_to(np.arange(order.size)[:, None], tokens.shape)
    # per image token the nearest centre; on a tie the first tile (C order), as in _owners
    pairs = np.lexsort((rank.ravel(), distance.ravel(), tokens.ravel()))
    flat = tokens.ravel()[pairs]
    first = np.ones(flat.size, dtype=bool)
    first[1:] = flat[1:] != flat[:-1]
    winner = pairs[first]
    tested = flat[first]
    family, local = np.divmod(winner, tgh * tgw)
    return RunTiles(order=order, tested=tested, family=family, local=local,
                    family_tokens=np.searchsorted(tested, tokens), n_image=n_image)


def make_layout(shape: tuple[int, int], *, tile: tuple[int, int], patch: tuple[int, int],
                overlap: int = 0) -> TileLayout:
    """Tiles of size ``tile`` covering an image of ``shape`` (multiples of ``patch``).

    Parameters
    ----------
    shape : (int, int)
        Image size in pixels, each a multiple of the patch size.
    tile : (int, int)
        Tile size (the model's input size), multiples of the patch size.
    patch : (int, int)
    overlap : int
        Pixels shared by neighbouring tiles, a multiple of the patch size and smaller than
        the tile; the last tile of a row/column is placed flush with the image edge.
    """
    ph, pw = patch
    if shape[0] % ph or shape[1] % pw or tile[0] % ph or tile[1] % pw:
        raise ValueError(f"image {shape} and tile {tile} must be multiples of the patch {patch}.")
    if not isinstance(overlap, (int, np.integer)) or overlap < 0 or overlap % ph or overlap % pw:
        raise ValueError(f"tile_overlap must be a non-negative multiple of the patch size {patch}, "
                         f"got {overlap!r}; e.g. tile_overlap={2 * ph}.")
    size = (min(tile[0], shape[0]), min(tile[1], shape[1]))
    if overlap >= min(tile):
        raise ValueError(f"tile_overlap ({overlap}) must be smaller than the tile {tile}.")
    starts = tuple(_axis_starts(shape[a], size[a], overlap) for a in range(2))
    return TileLayout(shape=(int(shape[0]), int(shape[1])), tile=size, patch=(ph, pw),
                      starts=starts)  # type: ignore[arg-type]


#: Position draws of a ``patch`` null tile before one outside the tissue mask is taken anyway.
MAX_REDRAWS = 64


class ImageNull:
    """Null tiles whose generator statistics come from the whole image (one null per image).

    ``normal``: per-channel (or global) mean and std of the whole image; ``uniform``: its
    min and max; ``pixel``: pixel vectors drawn from the whole image; ``patch``: a tile at a
    random position, its blocks permuted. For an image that is exactly one tile the draws
    equal :func:`~napari_attnreg.core.run.nulls.null_images` (same seeds, same order).

    Parameters
    ----------
    source : torch.Tensor
        ``(c, H, W)`` image in its own channels, in [0, 1].
    config : NullConfig
    tile : (int, int)
        Size of the null tiles.
    patch_size : int
        Default block size of ``patch``.
    reader, shape : optional
        For an image that stays on disk: ``source`` is a strided sample of it (for the
        statistics and the pixel pool), ``reader(y, x, h, w)`` reads the random tiles of
        ``patch`` from the full image of size ``shape``.
    accept : callable, optional
        ``accept(y, x)``: whether a ``patch`` null may take the tile at this origin (a tissue
        mask: glass is not what the image's tiles are); positions are drawn again, from the
        same stream, until one is accepted (at most :data:`MAX_REDRAWS` times).
    tissue : np.ndarray, optional
        A boolean mask over the whole image (any resolution): ``normal``, ``uniform`` and
        ``pixel`` take their statistics and pixels from the tissue alone. Glass is not what
        the tested tiles are: on a slide that is 70 % glass its brightness set the null's
        mean and spread, and the tissue's tiles were tested against glass.
    """

    def __init__(self, source: torch.Tensor, config: NullConfig, tile: tuple[int, int],
                 patch_size: int, *, reader: Callable[[int, int, int, int], torch.Tensor] | None = None,
                 shape: tuple[int, int] | None = None,
                 accept: Callable[[int, int], bool] | None = None,
                 tissue: np.ndarray | None = None) -> None:
        self.source = source.float()
        self.reader = reader
        self.accept = accept
        self.shape = tuple(shape) if shape is not None else tuple(source.shape[1:])
        self.config = config
        self.tile = (int(tile[0]), int(tile[1]))
        self.patch_size = patch_size
        self.pool = self.source  # the pixels ``pixel`` draws from
        x = self.source
        c = x.shape[0]
        if tissue is not None and config.method != "patch":
            x = self.pool = _tissue_pixels(self.source, tissue)
        # the statistics are taken once per run, not once per chunk: a large image is costly
        if config.method == "normal":
            dims = (1, 2) if config.per_channel else (0, 1, 2)
            self.mean = x.mean(dim=dims, keepdim=True)
            self.std = x.std(dim=dims, keepdim=True, unbiased=False) * config.std_factor
        elif config.method == "uniform":
            flat = x.reshape(c, -1) if config.per_channel else x.reshape(1, -1)
            self.low = flat.min(dim=1).values.view(-1, 1, 1)
            self.span = flat.max(dim=1).values.view(-1, 1, 1) - self.low

    def draw(self, indices: Sequence[int], *, seed: int) -> torch.Tensor:
        """Null tiles number ``indices``: ``(len(indices), c, th, tw)``."""
        x, cfg = self.source, self.config
        c = x.shape[0]
        th, tw = self.tile
        if cfg.method == "patch":
            return self._patch_tiles(indices, seed)
        if cfg.method == "normal":
            return normal_draws(seed, indices, (c, th, tw), x.device).mul_(self.std).add_(self.mean)
        if cfg.method == "uniform":
            return uniform_draws(seed, indices, (c, th, tw), x.device).mul_(self.span).add_(self.low)
        return resampled_pixels(self.pool, seed, indices, (th, tw))

    def _patch_tiles(self, indices: Sequence[int], seed: int) -> torch.Tensor:
        x = self.source
        h, w = self.shape
        th, tw = self.tile
        out = []
        gen = torch.Generator(device="cpu")
        for index in indices:
            # the position has its own stream, so the block permutation is null_images' own
            gen.manual_seed(image_seed(seed, index) ^ 0x5A5A5A5A)
            for _ in range(MAX_REDRAWS if self.accept is not None else 1):
                y = int(torch.randint(0, h - th + 1, (1,), generator=gen))
                x0 = int(torch.randint(0, w - tw + 1, (1,), generator=gen))
                if self.accept is None or self.accept(y, x0):
                    break
            crop = (x[:, y:y + th, x0:x0 + tw] if self.reader is None
                    else self.reader(y, x0, th, tw).to(x.device))
            out.append(crop)
        return shuffled_blocks(torch.stack(out), seed, indices,
                               self.config.block_size or self.patch_size)


#: Most pixels of the tissue sample the ``normal``, ``uniform`` and ``pixel`` nulls of a masked
#: run read (a strided sample beyond it, as for an image read on demand).
TISSUE_SAMPLE_PIXELS = 1 << 24


def _tissue_pixels(source: torch.Tensor, tissue: np.ndarray) -> torch.Tensor:
    """``(c, 1, n)``: the pixels of ``source`` (``(c, H, W)``) that ``tissue`` (a mask of the
    same extent, any resolution) marks, nearest sampled, from a strided sample of at most
    :data:`TISSUE_SAMPLE_PIXELS` pixels; all of them where the mask marks none."""
    c, h, w = source.shape
    step = max(1, math.ceil(math.sqrt(h * w / TISSUE_SAMPLE_PIXELS)))
    sample = source[:, ::step, ::step]
    from napari_attnreg.core.run.mask_file import bool_rows

    mask = bool_rows(tissue)  # a packed full-resolution mask: the sampled pixels alone
    rows = np.minimum(((np.arange(sample.shape[1]) * step + 0.5) * mask.shape[0] / h)
                      .astype(np.int64), mask.shape[0] - 1)
    cols = np.minimum(((np.arange(sample.shape[2]) * step + 0.5) * mask.shape[1] / w)
                      .astype(np.int64), mask.shape[1] - 1)
    keep = torch.from_numpy(np.ascontiguousarray(mask[np.ix_(rows, cols)])).to(source.device)
    if not bool(keep.any()):
        return sample.reshape(c, 1, -1)
    return sample[:, keep].reshape(c, 1, -1)


def work_shape(image_shape: tuple[int, int], patch: tuple[int, int],
               tile_scale: float) -> tuple[int, int]:
    """Pixel size of the tiled image: the original divided by ``tile_scale``, rounded to
    whole patches (at least one patch per axis)."""
    if not (isinstance(tile_scale, (int, float)) and math.isfinite(tile_scale) and tile_scale > 0):
        raise ValueError(f"tile_scale must be a positive number (1 = native pixels, 2 = half "
                         f"size), got {tile_scale!r}.")
    ph, pw = patch
    return (max(ph, round(image_shape[0] / tile_scale / ph) * ph),
            max(pw, round(image_shape[1] / tile_scale / pw) * pw))
