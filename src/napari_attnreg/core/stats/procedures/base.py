"""The protocol every statistical procedure follows.

A procedure turns one observed attention map and its null maps into token statistics and
says how to read them: its option defaults, the options it refuses, its significance rules,
how to build a rule's mask, the maps a result of it stores with their titles and legends,
and what "significant" means under it. It takes plain arrays and keywords only (never a
run configuration or a result object), so the layers above can ask it questions without
an import circle, and it imports its computation (and torch) only when it computes, so the
option metadata and ``attnreg --help`` can ask it questions without loading torch.
Subclass :class:`Procedure`, fill its class attributes, implement
:meth:`Procedure.statistics`, and :func:`~.registry.register` an instance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

#: Threshold keys every result carries.
THRESHOLD_KEYS = ("rule", "z_th", "p_th", "l_th", "q_th")
#: The options a procedure may fill from its defaults (``None`` means "from the procedure").
STATISTICS_KEYS = ("p_method", "alternative", "pi0_method", "null", "null_pool", "method",
                   "null_resolution", *THRESHOLD_KEYS)


@dataclass(frozen=True)
class MapText:
    """How one stored map is named and read under a procedure.

    Attributes
    ----------
    title : str
        Short name (layer suffix, panel title).
    legend : str
        One sentence that says how to read the colours.
    colorbar : str
        What a colour bar measures.
    """

    title: str
    legend: str
    colorbar: str


class Procedure:
    """Base class of the statistical procedures (one module each, see the registry).

    Class attributes say what the procedure is; methods compute with plain arrays.
    """

    #: The preset name users pass (``preset=...``).
    name: ClassVar[str] = ""
    #: Its name in sentences ("the step-down preset").
    title: ClassVar[str] = ""
    #: Its label in a front end's choice list.
    label: ClassVar[str] = ""
    #: What it answers (tooltips of the preset controls).
    help: ClassVar[str] = ""
    #: Every option of :data:`STATISTICS_KEYS` with this procedure's default.
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: The significance rules its results offer.
    rules: ClassVar[tuple[str, ...]] = ()
    #: Options of other procedures that it reads (front ends grey out the rest).
    reads: ClassVar[tuple[str, ...]] = ()
    #: Options it has no use for; giving one explicitly is an error with this message.
    refused: ClassVar[tuple[str, ...]] = ()
    refused_message: ClassVar[str] = ""
    #: Options it fixes: name → (the value it needs, the message when another is given;
    #: ``{key}`` and ``{value}`` are filled in).
    fixed: ClassVar[Mapping[str, tuple[Any, str]]] = {}
    #: Its significance is decided on step p-values (the rules need the stored steps).
    uses_step_p: ClassVar[bool] = False
    #: It tests attention *above* the null only (False: two-sided).
    one_sided: ClassVar[bool] = True
    #: Null images are clamped to [0, 1] as the observed image is (False: the paper's nulls).
    clamps_nulls: ClassVar[bool] = True
    #: Its patch null shuffles half-patch blocks by default (else whole patches).
    half_patch_blocks: ClassVar[bool] = False
    #: It can fit a tail to the null (the ``tail`` option applies).
    offers_tail: ClassVar[bool] = False
    #: The π0 rule takes its percentile on the upsampled pixel grid (the paper's way).
    pi0_on_pixel_grid: ClassVar[bool] = False
    #: How a caption names its side of the test ("above the null", ...).
    side: ClassVar[str] = ""
    #: The header of the ROI table's soft-map column.
    evidence_header: ClassVar[str] = "Mean posterior"
    #: Titles and legends of the maps a front end shows from the statistics.
    map_texts: ClassVar[Mapping[str, MapText]] = {}
    #: The token maps a result of it holds, by their own names (the names a result's
    #: ``maps``, its file and its readers use) → the field of :meth:`statistics`' output
    #: (``z``, ``p``, ``q``, ``lfdr``, ``posterior``) each is taken from. A result holds
    #: these maps and no others.
    stored_maps: ClassVar[Mapping[str, str]] = {
        "z": "z", "p": "p", "q": "q", "lfdr": "lfdr", "posterior": "posterior"}
    #: The stored map in [0, 1] that the soft rule weighs attention by and that a front
    #: end's evidence ("posterior") layer shows.
    evidence_map: ClassVar[str] = "posterior"

    # ---- options ------------------------------------------------------------------------
    def default_thresholds(self) -> dict[str, Any]:
        """The rule and thresholds a result of this procedure starts with."""
        return {k: self.defaults[k] for k in THRESHOLD_KEYS}

    def resolve(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Fill the options that are ``None`` (or absent) from the defaults; check the rest.

        Raises
        ------
        ValueError
            For an explicit option this procedure cannot honour.
        """
        given = [k for k in self.refused if options.get(k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} {self.refused_message}")
        resolved = dict(options)
        for key, default in self.defaults.items():
            if resolved.get(key) is None:
                resolved[key] = default
        rule = resolved.get("rule")
        if rule is not None and rule not in self.rules:
            raise ValueError(f"rule={rule!r} is not available under preset={self.name!r}; use "
                             f"one of {', '.join(self.rules)}.")
        for key, (needed, message) in self.fixed.items():
            if resolved[key] != needed:
                raise ValueError(message.format(key=key, value=repr(resolved[key])))
        z_th = resolved.get("z_th")
        if z_th is not None and not (isinstance(z_th, (int, float)) and not math.isnan(z_th)):
            raise ValueError(f"z_th must be a number or None (no z mask), got {z_th!r}.")
        return resolved

    def applies(self, option: str) -> bool:
        """Whether an option of the pooled-null or step-down families changes this procedure."""
        return option in self.reads

    # ---- statistics ---------------------------------------------------------------------
    def statistics(self, observed: Any, null_scores: Any, options: Mapping[str, Any], *,
                   positions: np.ndarray | None = None, families: Any = None,
                   owner: tuple[np.ndarray, np.ndarray] | None = None,
                   family_tokens: np.ndarray | None = None) -> Any:
        """Token statistics of ``observed`` (T,) against ``null_scores`` (B, T).

        ``options`` holds the resolved option values (plain keywords); the keywords after
        it describe the tokens: ``positions`` (a tiled image's tokens against a pool of null
        tiles), and ``families`` ``(F, K)`` with ``owner`` (each image token's family and
        index there) and ``family_tokens`` (the image token under each family token) where
        tokens are tested in families: the tiles of a tiled step-down run, the heads of
        ``map="heads"``, or one map with its attention sinks left out (every preset).
        """
        raise NotImplementedError

    def pooled_statistics(self, test: Callable[..., Any], observed: Any, null_scores: Any,
                          options: Mapping[str, Any], *, positions: np.ndarray | None,
                          families: Any, owner: tuple[np.ndarray, np.ndarray] | None,
                          family_tokens: np.ndarray | None) -> Any:
        """A pooled-null procedure's statistics: of one map, or of families (heads, or a map
        with its attention sinks left out), each tested alone against its own null columns
        and combined as :mod:`~napari_attnreg.core.stats.pooled_families` says.

        ``test(observed, null_scores, positions=...)`` is the procedure on one map. Tiles
        are never families here: a tiled image's tokens are pooled over every tile
        (``positions``), so the two keywords together are refused.
        """
        if families is None:
            return test(observed, null_scores, positions=positions)
        if positions is not None or owner is None or family_tokens is None:
            raise ValueError(f"The {self.title} preset tests families (heads, sinks left out) "
                             "of one untiled map: pass families with owner and family_tokens "
                             "and without positions.")
        from napari_attnreg.core.stats.pooled_families import family_statistics

        return family_statistics(lambda o, n: test(o, n, positions=None), observed,
                                 null_scores, families=families, owner=owner,
                                 family_tokens=family_tokens, pi0_method=options["pi0_method"])

    def store(self, statistics: Any) -> dict[str, Any]:
        """The maps a result of this procedure holds, by name, from ``statistics`` (the
        output of :meth:`statistics`, or anything with its fields as attributes)."""
        return {name: getattr(statistics, where) for name, where in self.stored_maps.items()}

    def map_named(self, maps: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        """Stored map ``name`` of ``maps``; a clear error naming the maps this procedure
        stores when it has none of that name (e.g. ``lfdr`` under step-down)."""
        try:
            return maps[name]
        except KeyError:
            raise ValueError(self.no_map_message(name)) from None

    def no_map_message(self, name: str) -> str:
        """The sentence that says a result of this procedure has no map ``name``."""
        return (f"a {self.title} result has no {name!r} map; its maps are "
                f"{', '.join(self.stored_maps)}.")

    def probability_maps(self) -> tuple[str, ...]:
        """The stored maps that are probabilities in [0, 1] (every one but ``z``)."""
        return tuple(name for name, where in self.stored_maps.items() if where != "z")

    def mask(self, rule: str, thresholds: Mapping[str, Any], *,
             maps: Mapping[str, np.ndarray], pi0: float, null_summary: Mapping[str, Any],
             grid_shape: tuple[int, ...], pixels_per_token: int = 1) -> np.ndarray:
        """Boolean token map kept by ``rule`` at ``thresholds``, read from the stored
        ``maps`` (by this procedure's names).

        A step rule is read from the steps in ``null_summary`` (a clear error when the result
        has none); the soft rule from the evidence map; the pooled rules from ``p``, ``q`` and
        ``lfdr`` (a clear error naming the stored maps when the procedure has none of them).
        """
        from napari_attnreg.core.stats.rules import significance_mask
        from napari_attnreg.core.stats.stepdown import RULE_LEVEL, STEPDOWN_RULES
        from napari_attnreg.core.stats.stepdown_maps import stepdown_mask

        t = thresholds
        z = self.map_named(maps, "z")
        z_mask = z >= t["z_th"] if t["z_th"] is not None else np.ones(z.shape, dtype=bool)
        if rule in STEPDOWN_RULES:
            # the steps name every token a family tested; one reported as not measured after
            # the test (glass of a tissue tile: NaN evidence) is never kept
            measured = ~np.isnan(np.asarray(maps[self.evidence_map], dtype=np.float64))
            return (stepdown_mask(dict(null_summary), rule, t[RULE_LEVEL[rule]], grid_shape)
                    & z_mask & measured)
        if rule == "soft":
            return z_mask & (np.asarray(maps[self.evidence_map], dtype=np.float64) >= 0.5)
        p, lfdr, q = (self.map_named(maps, k) for k in ("p", "lfdr", "q"))
        return significance_mask(rule, z, p, lfdr, pi0, q=q, z_th=t["z_th"], p_th=t["p_th"],
                                 l_th=t["l_th"], q_th=t["q_th"],
                                 pixels_per_token=pixels_per_token)

    def pixels_per_token(self, patch_size: tuple[int, int]) -> int:
        """Repeat of each token on the grid where the π0 rule takes its percentile."""
        return int(patch_size[0] * patch_size[1]) if self.pi0_on_pixel_grid else 1

    def neg_log10_p(self, maps: Mapping[str, np.ndarray], n_null: int) -> np.ndarray:
        """``−log10`` of the p a significance layer shows, floored at the pool's resolution."""
        p = self.map_named(maps, "p")
        floor = 1.0 / ((1 + n_null) * p.size)
        return -np.log10(np.maximum(p, floor))

    def smallest_p(self, null_summary: Mapping[str, Any],
                   options: Mapping[str, Any]) -> float | None:
        """The smallest p the test can give, where that is worth a diagnostic (else None)."""
        return None

    # ---- words ---------------------------------------------------------------------------
    def map_text(self, key: str) -> MapText:
        """Title, legend and colour-bar title of stored map ``key`` (``pvalue``, ...)."""
        try:
            return self.map_texts[key]
        except KeyError:
            raise ValueError(f"preset={self.name!r} stores no map {key!r}; it stores "
                             f"{', '.join(self.map_texts)}.") from None

    def significance_meaning(self) -> str:
        """What "significant" means under this procedure, in plain words."""
        return self.side

    def compared_with(self, nulls: str, count: str, what: str = "attention") -> str:
        """The claim a significant patch makes against ``nulls`` (the run's null images in
        words; ``count`` says how many) about the tested map ``what``, e.g. "attention higher
        here than ..."."""
        return f"{what} {self.side} here, against {nulls}{count}"

    def __repr__(self) -> str:
        return f"<procedure {self.name!r}>"
