"""AttentionResult: every map of one run, its geometry, its metadata, save and load.

Maps are kept at token level (``(gh, gw)``); :meth:`AttentionResult.to_pixels` places them
on the original image grid using the exact per-axis scale of the resize the model needed.
Thresholds can be changed afterwards without recomputing anything.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.results.result_file import FORMAT_VERSION, read_result_file
from napari_attnreg.core.results.tissue_grid import tissue_token_grid
from napari_attnreg.core.stats.diagnostics import Diagnostic, from_metadata
from napari_attnreg.core.stats.procedures import THRESHOLD_KEYS, Procedure, get_procedure
from napari_attnreg.core.stats.rules import RULES

__all__ = ["FORMAT_VERSION", "AttentionResult", "StoredMaps"]
#: ``metadata`` key of the source image's pixel spacing, origin and units (:attr:`spatial`).
SPATIAL_KEY = "spatial"


class _MaskCache:
    """The significance masks of recently shown results, by their maps and thresholds.

    Entries hold weak references to the maps (a large tiled result is not kept alive by its
    masks) and are checked by identity, so a result with other maps never gets a stale mask.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._entries: OrderedDict[tuple, tuple[list[weakref.ref], np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, result: AttentionResult, t: dict[str, Any],
            compute: Callable[[], np.ndarray]) -> np.ndarray:
        arrays = list(result.maps.values())
        key = (*map(id, arrays), float(result.pi0), tuple(sorted(t.items(), key=str)))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and all(r() is a for r, a in zip(entry[0], arrays)):
                self._entries.move_to_end(key)
                return entry[1]
        mask = compute()
        mask.setflags(write=False)
        try:
            refs = [weakref.ref(a) for a in arrays]
        except TypeError:  # not weak-referenceable (e.g. a memory-mapped view): no caching
            return mask
        with self._lock:
            self._entries[key] = (refs, mask)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return mask


MASK_CACHE = _MaskCache()


class StoredMaps(Mapping[str, np.ndarray]):
    """A result's token maps by name, read-only (the arrays are the result's own).

    A plain mapping, not a view: a result can be copied, pickled and compared with its maps.
    """

    def __init__(self, maps: Mapping[str, np.ndarray]) -> None:
        self._maps = dict(maps)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._maps[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._maps)

    def __len__(self) -> int:
        return len(self._maps)

    def __repr__(self) -> str:
        return f"StoredMaps({', '.join(self._maps)})"


def scaling_caption(record: Any) -> str | None:
    """``"window C -600 W 1500 (lung)"`` for a result's ``intensity_scaling`` record; None
    for percentiles (every image's default) or no record."""
    if not isinstance(record, dict) or record.get("method") != "window":
        return None
    source = str(record.get("source"))
    if source.startswith("stored"):  # "the file's", "the file's 2nd: LUNG"
        number = source.split()[1] if " " in source else ""
        named = ": ".join(v for v in (f"no. {number}" if number else "",
                                      str(record.get("explanation") or "")) if v)
        source = "the file's" + (f" {named}" if named else "")
    return f"window C {record['centre']:g} W {record['width']:g} ({source})"


@dataclass
class AttentionResult:
    """Result of :func:`napari_attnreg.regularize` for one 2D image.

    Attributes
    ----------
    attention : np.ndarray
        ``(gh, gw)`` observed CLS attention (raw map).
    maps : mapping of str to np.ndarray
        ``(gh, gw)`` token statistics by the names the result's procedure declares
        (``procedure.stored_maps``): step-down ``z``, ``step_p``, ``adjusted_p``,
        ``evidence``; directional and paper ``z``, ``p``, ``q``, ``lfdr``, ``posterior``.
        Exactly those maps, kept read-only. ``z``, ``p``, ``q``, ``lfdr`` and ``posterior``
        are also attributes that read the procedure's map of that role (under step-down
        ``p`` is the step p, ``q`` the adjusted p, ``posterior`` the evidence, and there is
        no ``lfdr``). Every map but ``z`` is NaN at a token that was not tested: an
        attention sink left out (``exclude_sinks=True``) or glass a tiled run's tissue mask
        left out (never run; its ``attention`` and ``z`` hold 0 as a fill).
    pi0 : float
        Estimated proportion of null tokens.
    thresholds : dict
        ``rule``, ``z_th``, ``p_th``, ``l_th``, ``q_th`` used by :meth:`regularized` when not
        overridden (``z_th`` None: no z mask).
    image_shape : tuple of int
        ``(H0, W0)`` of the original image.
    model_shape : tuple of int
        ``(H, W)`` the model saw.
    patch_size : tuple of int
    head_attention : np.ndarray, optional
        ``(heads, gh, gw)`` per-head raw maps.
    null_summary : dict
        ``mu0``, ``sigma0`` and small summaries of the null scores.
    null_scores : np.ndarray, optional
        ``(B, gh, gw)`` null attention, only with ``keep_nulls=True``.
    metadata : dict
        Model, weights, method, n_boot, seed, device, timings, package version, ...
    """

    attention: np.ndarray
    maps: Mapping[str, np.ndarray]
    pi0: float
    thresholds: dict[str, Any]
    image_shape: tuple[int, int]
    model_shape: tuple[int, int]
    patch_size: tuple[int, int]
    head_attention: np.ndarray | None = None
    null_summary: dict[str, Any] = field(default_factory=dict)
    null_scores: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        declared = list(self.procedure.stored_maps)
        if sorted(self.maps) != sorted(declared):
            raise ValueError(f"a {self.procedure.title} result holds the maps "
                             f"{', '.join(declared)}; got {', '.join(self.maps) or 'none'}.")
        self.maps = StoredMaps({name: self.maps[name] for name in declared})

    # ---- the procedure's maps by the roles front ends ask for ----------------------------
    def _role(self, role: str) -> np.ndarray:
        """The stored map that the procedure's statistics field ``role`` fills."""
        for name, where in self.procedure.stored_maps.items():
            if where == role:
                return self.maps[name]
        # AttributeError: hasattr() and getattr(..., default) answer "no such map"
        raise AttributeError(self.procedure.no_map_message(role))

    @property
    def z(self) -> np.ndarray:
        """``(gh, gw)`` z map (the token's standardized attention)."""
        return self._role("z")

    @property
    def p(self) -> np.ndarray:
        """``(gh, gw)`` p-values: the step p under step-down, else the pooled p."""
        return self._role("p")

    @property
    def q(self) -> np.ndarray:
        """``(gh, gw)`` the step-down adjusted p under step-down, else the q-values."""
        return self._role("q")

    @property
    def lfdr(self) -> np.ndarray:
        """``(gh, gw)`` local fdr (paper, directional); a step-down result has none."""
        return self._role("lfdr")

    @property
    def posterior(self) -> np.ndarray:
        """``(gh, gw)`` 1 − lfdr, or the evidence 1 − adjusted p under step-down."""
        return self._role("posterior")

    @property
    def evidence(self) -> np.ndarray:
        """``(gh, gw)`` the map in [0, 1] the soft rule weighs attention by (the procedure's
        ``evidence_map``: ``posterior``, or ``evidence`` under step-down)."""
        return self.maps[self.procedure.evidence_map]

    # ---- geometry -------------------------------------------------------------------------
    @property
    def grid_shape(self) -> tuple[int, int]:
        return tuple(int(v) for v in self.attention.shape[-2:])  # type: ignore[return-value]

    @property
    def token_scale(self) -> tuple[float, float]:
        """Size of one token in original-image pixels (napari ``scale`` of a token-grid layer)."""
        return (
            self.patch_size[0] * self.image_shape[0] / self.model_shape[0],
            self.patch_size[1] * self.image_shape[1] / self.model_shape[1],
        )

    @property
    def token_translate(self) -> tuple[float, float]:
        """Offset of token (0, 0)'s centre from pixel (0, 0)'s centre, in original pixels.

        With pixel centres at integer coordinates, token ``i`` covers
        ``[i·s − 0.5, (i+1)·s − 0.5)``,
        so its centre sits at ``(s − 1) / 2 + i·s``.
        """
        sy, sx = self.token_scale
        return ((sy - 1) / 2, (sx - 1) / 2)

    @property
    def spatial(self) -> dict[str, tuple]:
        """Where the source image lay: its pixel ``scale``, the ``translate`` of pixel (0, 0)'s
        centre and the ``units`` of its two image axes.

        Read from ``metadata["spatial"]`` (``{"scale": [0.7, 0.5], "translate": [-120, -100],
        "units": ["mm", "mm"]}``, e.g. a DICOM's PixelSpacing), which a run records through
        ``RunConfig.extra``; pixels at the origin when it is absent or not usable, as for a
        plain array.
        """
        given = self.metadata.get(SPATIAL_KEY)
        given = given if isinstance(given, dict) else {}
        scale, translate, units = (given.get(k) for k in ("scale", "translate", "units"))
        if not (_pair_of(scale, float) and all(v > 0 for v in scale)):
            scale = (1.0, 1.0)
        translate = translate if _pair_of(translate, float) else (0.0, 0.0)
        units = units if _pair_of(units, str) else ("pixel", "pixel")
        return {"scale": tuple(float(v) for v in scale),
                "translate": tuple(float(v) for v in translate), "units": tuple(units)}

    def _pixel_token_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Token row/column of every original pixel (nearest, by pixel centre)."""
        gh, gw = self.grid_shape
        sy, sx = self.token_scale
        rows = np.minimum(((np.arange(self.image_shape[0]) + 0.5) / sy).astype(np.int64), gh - 1)
        cols = np.minimum(((np.arange(self.image_shape[1]) + 0.5) / sx).astype(np.int64), gw - 1)
        return rows, cols

    def to_pixels(self, token_map: np.ndarray) -> np.ndarray:
        """Nearest-neighbour upsampling of a ``(..., gh, gw)`` map to ``(..., H0, W0)``."""
        arr = np.asarray(token_map)
        if arr.shape[-2:] != self.grid_shape:
            raise ValueError(f"map shape {arr.shape} does not end with the token grid "
                             f"{self.grid_shape}")
        rows, cols = self._pixel_token_index()
        return arr[..., rows[:, None], cols[None, :]]

    def token_coverage(self, mask: np.ndarray) -> np.ndarray:
        """Fraction of each token's original-pixel footprint that lies inside a boolean mask."""
        m = np.asarray(mask, dtype=bool)
        if m.shape != tuple(self.image_shape):
            raise ValueError(f"mask shape {m.shape} does not match the image shape "
                             f"{self.image_shape}")
        rows, cols = self._pixel_token_index()
        gh, gw = self.grid_shape
        flat = (rows[:, None] * gw + cols[None, :]).ravel()
        inside = np.bincount(flat, weights=m.ravel().astype(np.float64), minlength=gh * gw)
        total = np.bincount(flat, minlength=gh * gw).astype(np.float64)
        return (inside / np.maximum(total, 1)).reshape(gh, gw)

    # ---- statistics context ---------------------------------------------------------------
    @property
    def preset(self) -> str:
        """``"stepdown"``, ``"directional"`` or ``"paper"``: which procedure made ``p``, ``q``, ..."""
        return str(self.metadata.get("preset", "paper"))  # files before presets were paper

    @property
    def procedure(self) -> Procedure:
        """The statistical procedure that made this result (ask it how to read the maps)."""
        return get_procedure(self.preset)

    @property
    def p_map(self) -> float | None:
        """Step-down: the map-level p ("does the attention concentrate on anything more than
        null images do?"), resolution ``1/(B + 1)``; None under the other presets."""
        value = self.null_summary.get("p_map")
        return None if value is None else float(value)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        """Plain-sentence findings about this run (untrained model, degenerate π0, ...)."""
        return from_metadata(self.metadata)

    @property
    def _pixels_per_token(self) -> int:
        # the paper takes the pi0 rule's percentile on the upsampled pixel grid
        return self.procedure.pixels_per_token(self.patch_size)

    # ---- thresholds -----------------------------------------------------------------------
    @property
    def thresholds_used(self) -> dict[str, Any]:
        """Every threshold :meth:`regularized` and :meth:`significant` apply when not overridden.

        ``thresholds`` may hold only some keys (a file from an older version, a partial
        override); this completes them with the preset's defaults. ``z_th`` None: no z mask.

        Examples
        --------
        >>> result.thresholds_used["rule"]             # doctest: +SKIP
        'forwardstop'
        """
        return self._thresholds()

    def _thresholds(self, rule: str | None = None, **overrides: float | None) -> dict[str, Any]:
        unknown = set(overrides) - set(THRESHOLD_KEYS)
        if unknown:
            raise ValueError(f"Unknown threshold names: {sorted(unknown)}; use {THRESHOLD_KEYS}.")
        t = {**self.procedure.default_thresholds(), **self.thresholds}
        for key, value in (("rule", rule), *overrides.items()):
            # an explicit z_th=None turns the z mask off; a None elsewhere keeps the default
            if value is not None or key == "z_th":
                t[key] = value
        if t["rule"] not in RULES:
            raise ValueError(f"Unknown rule {t['rule']!r}; choose one of {RULES}.")
        return t

    def _check_rule(self, rule: str | None) -> None:
        """Refuse a rule asked for by name that this result's procedure does not define."""
        rules = self.procedure.rules
        if rule is not None and rule in RULES and rule not in rules:
            raise ValueError(f"The {self.preset} preset does not define the {rule!r} rule; its "
                             f"rules are {', '.join(rules)} (a run with "
                             "preset='directional' or 'paper' offers q, p, lfdr, pi0, base).")

    def regularized_maps(self, **thresholds: float | None) -> dict[str, np.ndarray]:
        """The regularized map of every rule of the result's procedure."""
        return {rule: self.regularized(rule, **thresholds) for rule in self.procedure.rules}

    def regularized(self, rule: str | None = None, **thresholds: float | None) -> np.ndarray:
        """Regularized attention ``(gh, gw)`` by one rule, thresholds re-applied on the fly.

        Examples
        --------
        >>> sparse = result.regularized("q", q_th=0.05)   # doctest: +SKIP
        """
        self._check_rule(rule)
        t = self._thresholds(rule, **thresholds)
        if t["rule"] == "soft":
            if np.any(self.attention < 0):
                raise ValueError("attention contains negative values; the soft rule weighs "
                                 "a non-negative attention map.")
            # a token left out of the test (NaN evidence) gets no weight
            return self.attention * np.nan_to_num(np.clip(self.evidence, 0.0, 1.0), nan=0.0)
        return np.where(self._mask(t), self.attention, 0.0)

    def significant(self, rule: str | None = None, **thresholds: float | None) -> np.ndarray:
        """Boolean ``(gh, gw)`` mask of tokens that the rule keeps."""
        self._check_rule(rule)
        return self._mask(self._thresholds(rule, **thresholds)).copy()

    def _mask(self, t: dict[str, Any]) -> np.ndarray:
        # a slider move redraws several maps and a count from one mask: compute it once
        return MASK_CACHE.get(self, t, lambda: self._compute_mask(t))

    def _compute_mask(self, t: dict[str, Any]) -> np.ndarray:
        return self.procedure.mask(t["rule"], t, maps=self.maps, pi0=self.pi0,
                                   null_summary=self.null_summary, grid_shape=self.grid_shape,
                                   pixels_per_token=self._pixels_per_token)

    def with_thresholds(self, **thresholds: Any) -> AttentionResult:
        """A copy whose default thresholds are changed (the maps are shared, not recomputed)."""
        return replace(self, thresholds=self._thresholds(thresholds.pop("rule", None),
                                                         **thresholds))

    # ---- persistence ----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write one ``.npz`` file: every array plus the JSON metadata (no pickles).

        Returns the path written (``.npz`` is appended if missing).
        """
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        # each map under its procedure's name; the header says which procedure and maps
        arrays = {"attention": np.asarray(self.attention),
                  **{name: np.asarray(values) for name, values in self.maps.items()}}
        for name in ("head_attention", "null_scores"):
            if getattr(self, name) is not None:
                arrays[name] = np.asarray(getattr(self, name))
        summary_json: dict[str, Any] = {}
        for key, value in self.null_summary.items():
            if isinstance(value, np.ndarray):
                arrays[f"null_summary__{key}"] = value
            else:
                summary_json[key] = value
        header = {
            "format": "napari-attnreg result",
            "format_version": FORMAT_VERSION,
            "procedure": self.procedure.name,
            "maps": list(self.maps),
            "pi0": float(self.pi0),
            "thresholds": self.thresholds,
            "image_shape": list(self.image_shape),
            "model_shape": list(self.model_shape),
            "patch_size": list(self.patch_size),
            "null_summary": summary_json,
            "metadata": self.metadata,
        }
        text = json.dumps(header, default=_json_default)
        arrays["metadata_json"] = np.frombuffer(text.encode(), dtype=np.uint8)
        from napari_attnreg.core.files import atomic_write

        with atomic_write(path) as tmp:  # a crash or full disk never leaves a truncated result
            np.savez_compressed(tmp, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> AttentionResult:
        """Read a file written by :meth:`save`, checking it before trusting it.

        Only the members this class knows are read (an extra member, however large, is never
        touched); each array's shape is checked from its header before its data is read; the
        geometry and statistics must be consistent (maps on the ``model_shape // patch_size``
        token grid, an image of at least one patch, the procedure's probability maps and π0
        in [0, 1]). A file of format version 1 (maps under the paper's names ``z``, ``p``,
        ``q``, ``lfdr``, ``posterior`` whatever the preset) is read into its procedure's maps.

        Raises
        ------
        ValueError
            The file is missing, not a result file, damaged or inconsistent; the message
            names the file and the problem.
        """
        return cls(**read_result_file(Path(path)))

    def summary(self, *, diagnostics: bool = True) -> str:
        """One line for a status bar or a terminal, then one line per warning diagnostic."""
        sig = self.significant()
        md = self.metadata
        t = self._thresholds()
        # counted over the patches tested, as every front end counts them
        # (core.results.display.significance_caption): glass a tissue mask left out was
        # never run, and is no patch that failed the test
        tissue = tissue_token_grid(self.null_summary.get("tissue_tiles"), md,
                                   self.patch_size, self.grid_shape,
                                   self.null_summary.get("tissue_glass_tokens"))
        total, what = (sig.size, "patches") if tissue is None \
            else (int(tissue.sum()), "tissue patches")
        window = scaling_caption(md.get("intensity_scaling"))  # what the model saw of a CT
        line = (
            f"{md.get('model', '?')} · {self.preset} · {md.get('method', '?')} · "
            f"B={md.get('n_boot', '?')} · grid {self.grid_shape[0]}x{self.grid_shape[1]} · "
            f"{window + ' · ' if window else ''}{self._map_level_text()} · {int(sig.sum())}/{total} {what} significant "
            f"({t['rule']}) · "
            f"{md.get('timings', {}).get('total_s', float('nan')):.2f} s on {md.get('device', '?')}"
        )
        if not diagnostics:
            return line
        warnings_ = [d.message for d in self.diagnostics if d.severity == "warning"]
        return "\n".join([line, *(f"⚠ {m}" for m in warnings_)])

    def _map_level_text(self) -> str:
        if self.p_map is None:
            return f"π0={self.pi0:.3f}"
        return f"p_map={self.p_map:.3g} (resolution {self.null_summary.get('p_resolution', 0):.2g})"

    def __eq__(self, other: object) -> bool:  # arrays make the dataclass default ambiguous
        if not isinstance(other, AttentionResult):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "maps":
                # NaN marks a token left out of the test in both
                if list(a) != list(b) or not all(
                        np.array_equal(a[k], b[k], equal_nan=True) for k in a):
                    return False
            elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if a is None or b is None or not np.array_equal(a, b):
                    return False
            elif f.name != "null_summary" and a != b:
                return False
        return True


def slide_downsample(metadata: Mapping[str, Any]) -> float:
    """Full-resolution (level 0) pixels of a slide per pixel a run analysed: its record's
    ``slide_downsample`` (a level's downsample times any resampling); 1 when absent or not
    usable (other images, results saved before it was recorded)."""
    try:
        factor = float(metadata.get("slide_downsample"))
    except (TypeError, ValueError):
        return 1.0
    return factor if np.isfinite(factor) and factor > 0 else 1.0


def _pair_of(value: Any, kind: type) -> bool:
    """Two finite numbers (``kind`` float) or two short strings (``kind`` str)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return False
    if kind is str:
        return all(isinstance(v, str) and 0 < len(v) <= 32 for v in value)
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in value)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return str(obj)
