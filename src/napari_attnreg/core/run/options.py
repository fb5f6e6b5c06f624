"""Every run option once: label, kind, choices, range, help, group, placement, and its validation.

The napari controls, the notebook controls and the command line's argparse are all built
from :data:`OPTIONS`: ``Option.advanced`` puts an option under *Advanced* in both GUIs (and
in an "advanced" section of ``--help``), :func:`applicable_options` says which options a run
with a given preset, null method and tiling reads (the GUIs grey out the rest), and
:func:`validate_options` is the one check every run goes through (``RunConfig.validate``
calls it), so a new option or rule is added here and nowhere else. This module imports no
torch, so ``attnreg --help`` stays fast.

Example
-------
>>> option("n_boot").label
'Bootstrap images (B)'
>>> validate_options({"n_boot": 50, "p_th": 0.05})
{'n_boot': 50, 'p_th': 0.05}
>>> "std_factor" in applicable_options({"preset": "paper", "method": "patch"})
False
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.stats.choices import (
    ALTERNATIVES,
    NULL_MODELS,
    NULL_POOLS,
    P_METHODS,
    PI0_METHODS,
    RULES,
    TAILS,
)
from napari_attnreg.core.stats.diagnostics import IMAGE_KINDS
from napari_attnreg.core.stats.presets import DEFAULT_PRESET, presets
from napari_attnreg.core.stats.procedures import get_procedure, procedure_names

#: Choice lists of the run options (the statistical ones live in ``core.stats.choices``).
NULL_METHODS = ("normal", "uniform", "pixel", "patch")
NULL_SCOPES = ("image", "tile")
NULL_RESOLUTIONS = ("source", "model")
PRECISIONS = ("auto", "float32", "bfloat16", "float16")
MERGES = ("mean", "max")
#: The registered maps (``core.models.scorers``; kept here as names so --help needs no torch).
MAPS = ("attention", "heads", "rollout", "cdam", "gradcam")
SIGNS = ("for", "against")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
#: Seeds are folded into 64-bit generator states; larger ones would silently alias.
MAX_SEED = 2**63 - 1
#: CT windows by name: (centre, width) in Hounsfield units, as radiology viewers preset them.
WINDOW_PRESETS = {"lung": (-600.0, 1500.0), "soft tissue": (40.0, 400.0),
                  "bone": (400.0, 1800.0), "brain": (40.0, 80.0)}
#: The named ways of scaling intensities besides the presets and an explicit window.
WINDOW_CHOICES = ("auto", "stored", "percentiles")
#: Section titles of the option groups, in the order the GUIs and ``--help`` show them.
GROUP_TITLES = {"bootstrap": "Null images", "statistics": "Statistics",
                "thresholds": "Thresholds", "model": "Model", "image": "Image",
                "tiling": "Tiling", "compute": "Compute"}


@dataclass(frozen=True)
class Option:
    """Metadata of one run option (a :class:`~napari_attnreg.core.run.engine.RunConfig` field).

    ``advanced`` places it under *Advanced* in every front end (what an analyst seldom
    changes); ``per_procedure``, ``methods`` and ``when_tiled`` say which runs read it.
    """

    name: str
    label: str
    kind: str  # "choice" | "int" | "float" | "bool" | "text"
    default: Any
    help: str
    group: str  # a key of GROUP_TITLES
    advanced: bool = False
    choices: tuple = ()
    choice_labels: Mapping[Any, str] = field(default_factory=dict)
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    decimals: int | None = None
    allow_none: bool = False
    preset_dependent: bool = False
    #: True: only the procedures that say they read it (others fix or ignore it)
    per_procedure: bool = False
    methods: tuple[str, ...] | None = None  # the null methods it applies to (None: all)
    when_tiled: bool | None = None  # True: tiled runs only; False: untiled runs only

    @property
    def cli_flag(self) -> str:
        """The command-line flag, e.g. ``--n-boot``."""
        return "--" + self.name.replace("_", "-")

    def label_of(self, choice: Any) -> str:
        """The text a front end shows for ``choice``."""
        return self.choice_labels.get(choice, str(choice))

    def applies(self, *, preset: str, method: str, tiled: bool) -> bool:
        """Whether this option changes a run with these settings (front ends grey out the rest)."""
        return ((not self.per_procedure or get_procedure(preset).applies(self.name))
                and (self.methods is None or method in self.methods)
                and (self.when_tiled is None or self.when_tiled == bool(tiled)))

    @property
    def unset(self) -> Any:
        """What a run is given when this option does not apply: None (the preset's) or the default."""
        return None if self.preset_dependent else self.default


def _threshold(name: str, label: str, what: str, per_procedure: bool = False) -> Option:
    return Option(name, label, "float", None, what, "thresholds", minimum=0.0, maximum=1.0,
                  step=0.01, decimals=3, preset_dependent=True, per_procedure=per_procedure)


def _presets_applying(opt: Option) -> tuple[str, ...]:
    """The registered presets an option applies to."""
    return tuple(p for p in presets()
                 if not opt.per_procedure or get_procedure(p).applies(opt.name))


_OPTIONS: tuple[Option, ...] = (
    Option("preset", "Statistics", "choice", DEFAULT_PRESET,
           "stepdown (default): does the attention concentrate on anything more than null "
           "images made of the image's own half-patch blocks, and on which patches? Step-down "
           "p-values on re-normalized shares, evidence = 1 − adjusted p, ForwardStop at 0.1. "
           "directional: is a patch's attention HIGHER than noise input gives? One-sided p, q "
           "and posterior, significant at q ≤ 0.1. paper: the published two-sided procedure "
           "(Chung & Laletin), unchanged; it also flags attention far below the null.",
           "statistics", choices=procedure_names(),
           choice_labels={name: get_procedure(name).label for name in procedure_names()}),
    Option("method", "Null images", "choice", None,
           "How the bootstrap null images are drawn from the image itself: patch (its blocks "
           "shuffled; the step-down default, blocks of half a patch), normal (Gaussian noise "
           "with the image's mean and std; the other presets' default), uniform (between its "
           "min and max) or pixel (shuffled pixels).", "bootstrap", choices=NULL_METHODS,
           preset_dependent=True),
    Option("null_resolution", "Null resolution", "choice", None,
           "normal/uniform/pixel nulls: draw them at the image's own size and resize them as "
           "the image was resized (source, the step-down default: a noise image that the "
           "preprocessing shrinks is then a true null), or at the model's input size (model, "
           "the other presets' default).", "bootstrap", advanced=True,
           choices=NULL_RESOLUTIONS, preset_dependent=True, methods=("normal", "uniform", "pixel")),
    Option("n_boot", "Bootstrap images (B)", "int", 200,
           "Number of null images. More gives finer p-values (the smallest is about "
           "1/(B·patches)) and takes proportionally longer.", "bootstrap", minimum=1,
           maximum=100_000, step=10),
    Option("seed", "Seed", "int", 0, "Random seed of the null images: the same seed gives the "
           "same result.", "bootstrap", advanced=True, minimum=0, maximum=MAX_SEED),
    Option("std_factor", "Noise std ×", "float", 1.0,
           "normal nulls only: scale of the noise relative to the image's standard deviation.",
           "bootstrap", advanced=True, minimum=1e-3, maximum=100.0, step=0.1, decimals=2,
           methods=("normal",)),
    Option("per_channel", "Per-channel moments", "bool", True,
           "normal/uniform nulls: match mean and spread per channel (on) or over the whole "
           "image (off).", "bootstrap", advanced=True, methods=("normal", "uniform")),
    Option("block_size", "Block size (px)", "int", None,
           "patch nulls only: side of the shuffled blocks in model pixels (empty = half the "
           "patch under step-down, the largest divisor of the patch size up to half of it; the "
           "patch size under the other presets).", "bootstrap", advanced=True, minimum=1, maximum=4096, allow_none=True,
           methods=("patch",)),
    _threshold("q_th", "α / q threshold", "Rule forwardstop: its level α (about this share of "
               "the kept patches may be noise). Rule q: keep patches with q ≤ this (false "
               "discovery rate)."),
    _threshold("p_th", "α FWER / p threshold", "Rule fwer: keep patches whose step-down "
               "adjusted p ≤ this (chance of any false patch). Rule p: keep patches with p ≤ "
               "this (no multiple-testing correction)."),
    _threshold("l_th", "lfdr threshold", "Rule lfdr: keep patches with local fdr ≤ this, i.e. "
               "posterior ≥ 1 − this.", per_procedure=True),
    Option("rule", "Significance rule", "choice", None,
           "Which statistic decides significance. Step-down: forwardstop (default, ForwardStop "
           "at α), fwer (adjusted p ≤ α) or soft (attention × evidence). Other presets: q "
           "(FDR), p, lfdr (posterior), pi0 (drop the π0 share of largest p), soft (attention "
           "× posterior) or base (z mask only).", "thresholds", choices=RULES,
           preset_dependent=True,
           choice_labels={"forwardstop": "ForwardStop at α (step-down)",
                          "fwer": "adjusted p ≤ α (step-down, FWER)",
                          "q": "q ≤ threshold (FDR)", "p": "p ≤ threshold",
                          "lfdr": "lfdr ≤ threshold (posterior)",
                          "pi0": "drop the π0 share of largest p",
                          "soft": "soft: attention × evidence",
                          "base": "z ≥ threshold only"}),
    Option("z_th", "z mask", "float", None,
           "Also require z ≥ this (standardised attention). Empty = no z mask (the directional "
           "default); the paper uses 0.", "thresholds", minimum=-10.0, maximum=10.0, step=0.1,
           decimals=2, allow_none=True, preset_dependent=True),
    Option("null_pool", "Null pool", "choice", None,
           "directional only: compare each patch with every null patch (pooled) or only with "
           "null patches at its own position (position: for models that attend to fixed "
           "positions whatever the image).", "statistics", advanced=True, choices=NULL_POOLS,
           preset_dependent=True, per_procedure=True),
    Option("pi0_method", "π0 estimate", "choice", None,
           "Share of patches that are pure noise: bh (π0 = 1, the directional default), "
           "reference (the paper's), storey, smoother or bootstrap; a number in [0, 1] fixes it.",
           "statistics", advanced=True, choices=PI0_METHODS, preset_dependent=True,
           per_procedure=True),
    Option("p_method", "p-value", "choice", None,
           "paper preset only: p-values against the pooled null z (pooled) or the null "
           "attention itself (null).", "statistics", advanced=True, choices=P_METHODS,
           preset_dependent=True, per_procedure=True),
    Option("alternative", "Alternative", "choice", None,
           "paper preset only: two-sided (the paper) or greater.", "statistics", advanced=True,
           choices=ALTERNATIVES, preset_dependent=True, per_procedure=True),
    Option("null", "lfdr null", "choice", None,
           "paper preset only: theoretical N(0, 1) or empirical null of the local fdr.",
           "statistics", advanced=True, choices=NULL_MODELS, preset_dependent=True,
           per_procedure=True),
    Option("layer", "Block", "int", -1, "Transformer block whose CLS attention is read "
           "(-1 = the last).", "model", advanced=True, minimum=-1000, maximum=1000),
    Option("head", "Head", "text", "mean", "Attention head: 'mean' over heads, or a head "
           "number (0 = first).", "model", advanced=True),
    Option("map", "Map", "choice", MAPS[0],
           "What is tested: attention (the CLS attention of the block, default), heads (every "
           "head on its own against its own nulls; a patch shows the head that attends to it "
           "most), rollout (attention rolled out through all "
           "blocks), cdam (class-discriminative attention: which patches speak for the target "
           "class or concept; signed) or gradcam (Grad-CAM, the raw map). cdam and gradcam "
           "need a classification head or a concept (target).", "model", advanced=True,
           choices=MAPS,
           choice_labels={"attention": "attention (default)", "heads": "per-head attention",
                          "rollout": "attention rollout", "cdam": "CDAM (class, signed)",
                          "gradcam": "Grad-CAM (class)"}),
    Option("target", "Target", "text", "predicted",
           "cdam and gradcam: 'predicted' (the image's top class; the same class for every "
           "null image), a class index, or a concept (a vector of the model's width, e.g. "
           "from concept_from; command line: --concept FILE).", "model", advanced=True),
    Option("sign", "Sign", "choice", SIGNS[0],
           "Signed maps (cdam): test the evidence for the target (for) or against it "
           "(against).", "model", advanced=True, choices=SIGNS),
    Option("exclude_sinks", "Leave out attention sinks", "bool", False,
           "Leave high-norm tokens that draw the CLS attention (attention sinks, not image "
           "content) out of the test, under every preset; they are reported as not tested.",
           "model",
           advanced=True, when_tiled=False),
    Option("target_size", "Model input", "text", "model",
           "Size the image is resized to: 'model' (the model's input size), 'native' (the "
           "image's own size, rounded to the patch) or a long side in pixels. Untiled runs "
           "only (tiles are the model's input size).", "image", advanced=True, when_tiled=False),
    Option("channel_axis", "Channel axis", "int", None, "Axis of channels in a multichannel "
           "image (empty = none or RGB).", "image", advanced=True, minimum=-32, maximum=32,
           allow_none=True),
    Option("channels", "Channels", "text", None, "Channels to use, up to 3 (e.g. 0,2); empty "
           "= all, or as many as the model takes.", "image", advanced=True, allow_none=True),
    Option("merge", "Merge channels", "choice", None, "Merge the channels into one grey image "
           "(mean or max) before the model.", "image", advanced=True, choices=MERGES,
           allow_none=True),
    Option("image_kind", "Image kind", "choice", None, "What the image is, to warn when the "
           "model's domain does not suit it (e.g. a microscopy model on a CT). Empty = read it "
           "from the file (DICOM Modality, OME metadata); a kind given here wins.", "image",
           advanced=True, choices=IMAGE_KINDS, allow_none=True),
    Option("intensity_window", "Intensity window", "text", "auto",
           "How pixel values become the model's 0-1 input; values outside the window clip. "
           "auto (default): the display window the file states (DICOM WindowCenter/"
           "WindowWidth), else percentiles; stored: the file's window (percentiles, with a "
           "note, when it states none; 'stored 2': its second, e.g. a lung window after a "
           "soft-tissue one); percentiles: the 0.5th-99.8th percentiles of each "
           "image or plane; a CT preset in Hounsfield units (lung -600/1500, soft tissue "
           "40/400, bone 400/1800, brain 40/80); or 'centre,width' in the image's own units "
           "(e.g. -600,1500).", "image", advanced=True),
    Option("tiled", "Tiled (native resolution)", "bool", False,
           "For images much larger than the model input: analyse the image at its own pixel "
           "size in model-sized tiles, with one bootstrap null for the whole image.", "tiling"),
    Option("tile_scale", "Downsample ×", "float", 1.0, "Tiled runs: divide the image's pixel "
           "size by this before tiling (1 = native pixels).", "tiling", advanced=True,
           minimum=1.0, maximum=64.0, step=0.5, decimals=1, when_tiled=True),
    Option("tile_overlap", "Tile overlap (px)", "int", None, "Tiled runs: pixels shared by "
           "neighbouring tiles (a multiple of the patch size; empty = a quarter of the tile, "
           "rounded down to whole patches).", "tiling", advanced=True,
           minimum=0, maximum=4096, step=8, allow_none=True, when_tiled=True),
    Option("level", "Slide level", "int", None, "Slides (SVS, NDPI, pyramidal TIFF): the "
           "pyramid level to read, 0 = full resolution (empty = 0, or the level --mpp "
           "chooses; in napari, the level the layer shows). An image of one resolution is "
           "refused with it (its row fails in a batch): leave it unset there.",
           "tiling", advanced=True, minimum=0, maximum=32, allow_none=True),
    Option("mpp", "Slide resolution (µm/px)", "float", None, "Slides: micrometres per pixel to "
           "analyse at; the coarsest level at least this fine is read and resampled (empty = "
           "the level's own). Give a level or a resolution, not both.", "tiling",
           advanced=True, minimum=0.01, maximum=1000.0, step=0.25, decimals=2,
           allow_none=True),
    Option("tissue_mask", "Tissue mask", "text", None, "Tiled runs: only tiles at least 10 % "
           "tissue are run and tested. 'auto' = Otsu on a thumbnail's chroma, pen ink and "
           "black left out (a grey or dark-field image's brightness; the default for "
           "slides), 'none' = every tile (the default "
           "for other images), a mask image file (> 0 = tissue) of the whole image at any "
           "resolution, a GeoJSON outline exported from QuPath (full-resolution pixels), "
           "for a batch a folder of masks named after the inputs ('case 12.geojson' for "
           "'case 12.svs'), or in napari the name of a Labels layer painted over the image "
           "or a Shapes layer outlining it.", "tiling",
           advanced=True, allow_none=True, when_tiled=True),
    Option("tail", "Tail approximation", "choice", None, "Step-down: fit a generalized Pareto "
           "tail to the null where fewer than 10 null images reach a step, so p-values can go "
           "below 1/(B+1) (gpd), or keep the counts (none). Empty = gpd for tiled runs, none "
           "otherwise.", "statistics", advanced=True, choices=TAILS, allow_none=True,
           per_procedure=True),
    Option("null_scope", "Null scope", "choice", None, "Tiled runs: one null for the whole "
           "image (image, default) or one per tile (tile).", "tiling", advanced=True,
           choices=NULL_SCOPES, allow_none=True, when_tiled=True),
    Option("device", "Device", "text", "auto", "auto (CUDA GPU, then Apple MPS, then CPU), "
           "cpu, cuda, cuda:N or mps.", "compute"),
    Option("precision", "Precision", "choice", "auto", "auto: bfloat16 on a GPU that supports "
           "it, float32 on the CPU.", "compute", advanced=True, choices=PRECISIONS),
    Option("chunk_size", "Chunk size", "int", None, "Null images per forward pass (empty = "
           "from free memory; it halves after an out-of-memory error).", "compute",
           advanced=True, minimum=1, maximum=100_000, allow_none=True),
    Option("memory_fraction", "Memory fraction", "float", 0.5, "Share of free device memory "
           "a chunk may use.", "compute", advanced=True, minimum=0.01, maximum=1.0, step=0.05,
           decimals=2),
    Option("keep_nulls", "Keep null maps", "bool", False, "Store every null attention map in "
           "the result (B × patches floats).", "compute", advanced=True),
)
OPTIONS: dict[str, Option] = {o.name: o for o in _OPTIONS}


def option(name: str) -> Option:
    """The metadata of option ``name``."""
    try:
        return OPTIONS[name]
    except KeyError:
        raise ValueError(f"Unknown option {name!r}; known options: {', '.join(OPTIONS)}.") from None


def options_in(group: str, *, advanced: bool | None = None) -> list[Option]:
    """The options of ``group`` in display order (only basic / advanced ones if asked)."""
    return [o for o in _OPTIONS if o.group == group and (advanced is None or o.advanced == advanced)]


def panel_options(*, advanced: bool | None = None, skip: Collection[str] = ()) -> list[Option]:
    """The options of a GUI's run panel, basic or advanced ones if asked, in display order.

    Parameters
    ----------
    advanced : bool, optional
        Only the options placed under *Advanced* (True) or above it (False).
    skip : collection of str
        Options the front end sets elsewhere (e.g. with the image's channels).

    Returns
    -------
    list of Option
        The thresholds group is left out: every front end sets it live in a panel of its own.
    """
    return [o for o in _OPTIONS if o.group != "thresholds" and o.name not in skip
            and (advanced is None or o.advanced == advanced)]


def _run_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Preset, null method and tiling of ``values`` (missing or None: the defaults)."""
    preset = values.get("preset") or DEFAULT_PRESET
    method = values.get("method") or default_for("method", preset)
    return {"preset": preset, "method": method, "tiled": bool(values.get("tiled", False))}


def applicable_options(values: Mapping[str, Any]) -> set[str]:
    """Names of the options a run with these settings reads; the others change nothing.

    Parameters
    ----------
    values : mapping
        The run's ``preset``, ``method`` and ``tiled`` (missing or None: the default preset,
        that preset's null method, untiled); other keys are ignored.

    Returns
    -------
    set of str
        E.g. the paper's two-sided options only under ``preset="paper"``, ``std_factor`` only
        for normal nulls, ``tile_overlap`` only for tiled runs, ``target_size`` only untiled.

    Examples
    --------
    >>> sorted(applicable_options({"preset": "paper", "method": "patch"}) - applicable_options({}))
    ['alternative', 'l_th', 'null', 'p_method', 'pi0_method']
    """
    settings = _run_settings(values)
    return {o.name for o in _OPTIONS if o.applies(**settings)}


def reset_inapplicable(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each option that does not apply to their run put back to unset.

    An option the preset fixes becomes None ("from the preset"), others their default, so a
    run's metadata never records a value nothing read (e.g. a tile overlap of an untiled run).
    Keys that are not options (``extra``) pass through.
    """
    applicable = applicable_options(values)
    return {name: value if name not in OPTIONS or name in applicable else OPTIONS[name].unset
            for name, value in values.items()}


def default_for(name: str, preset: str = DEFAULT_PRESET) -> Any:
    """The default of ``name`` under ``preset`` (preset-dependent options read the preset)."""
    opt = option(name)
    if opt.preset_dependent:
        return get_procedure(preset).defaults[name]
    return opt.default


def validate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Check every given option's type, range and choices; return them normalised.

    Parameters
    ----------
    options : mapping
        Option name → value (any subset of :data:`OPTIONS`; ``extra`` passes through).

    Returns
    -------
    dict
        The same options with numpy scalars turned into Python ones, ``head`` and
        ``target_size`` strings of digits into ints, ``channels`` "0,2" into ``[0, 2]``.

    Raises
    ------
    ValueError
        Naming the option, the value given and what to pass instead.
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name == "extra":
            out[name] = value
        elif name not in _CHECKED_NOW and _CHECKED.passed(name, value):
            out[name] = value
        else:
            checked = _check(option(name), value)
            out[name] = checked if name in _CHECKED_NOW else _CHECKED.record(name, checked)
    return out


class _CheckedValues:
    """The values validation produced, per option, so a run path checks each option once.

    A value is recognised by identity (the very object a check returned, kept alive here so
    its id is never reused) and, for a list, by a copy of its items (a list changed in place
    is checked again). The API, the CLI and every front end validate a config where they
    receive it, and the service and engines again where they are called directly; with this,
    the second and later checks of a config made of checked values do no work.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._values: OrderedDict[tuple[str, int], tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def passed(self, name: str, value: Any) -> bool:
        with self._lock:
            entry = self._values.get((name, id(value)))
        if entry is None or entry[0] is not value:
            return False
        return not isinstance(value, list) or entry[1] == tuple(value)

    def record(self, name: str, value: Any) -> Any:
        frozen = tuple(value) if isinstance(value, list) else None
        if isinstance(value, (dict, set)):  # no option takes one; never trust a mutable
            return value
        with self._lock:
            self._values[(name, id(value))] = (value, frozen)
            self._values.move_to_end((name, id(value)))
            while len(self._values) > self._size:
                self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every checked value (tests that count the checks start from here)."""
        with self._lock:
            self._values.clear()


_CHECKED = _CheckedValues()
#: Options whose check depends on more than the value (procedures registered since).
_CHECKED_NOW = frozenset({"preset"})
#: Forget the values already checked (the next validation checks every option again).
forget_checked_values = _CHECKED.clear


def _check(opt: Option, value: Any) -> Any:
    if value is None:
        if opt.allow_none or opt.preset_dependent:
            return None
        raise ValueError(f"{opt.name} must be set (got None); its default is {opt.default!r}.")
    special = _SPECIAL.get(opt.name)
    if special is not None:
        return special(opt, value)
    if opt.kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{opt.name} must be True or False, got {value!r}.")
        return bool(value)
    if opt.kind == "choice":
        if value not in opt.choices:
            raise ValueError(f"{opt.name}={value!r} is not supported; use one of "
                             f"{', '.join(map(repr, opt.choices))}.")
        return value
    if opt.kind == "int":
        return _integer(opt, value)
    if opt.kind == "float":
        return _real(opt, value)
    return value


def _range_text(opt: Option) -> str:
    lo, hi = (None if v is None else (int(v) if opt.kind == "int" else f"{v:g}")
              for v in (opt.minimum, opt.maximum))
    if lo is not None and hi is not None:
        return f"in [{lo}, {hi}]"
    return f"≥ {lo}" if lo is not None else f"≤ {hi}"


def _integer(opt: Option, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{opt.name} must be a whole number {_range_text(opt)}, got {value!r}"
                         f"{' (a bool)' if isinstance(value, (bool, np.bool_)) else ''}.")
    value = int(value)
    if (opt.minimum is not None and value < opt.minimum) or (
            opt.maximum is not None and value > opt.maximum):
        raise ValueError(f"{opt.name} must be a whole number {_range_text(opt)}, got {value}.")
    return value


def _real(opt: Option, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{opt.name} must be a number {_range_text(opt)}, got {value!r}.")
    value = float(value)
    if not math.isfinite(value) or (opt.minimum is not None and value < opt.minimum) or (
            opt.maximum is not None and value > opt.maximum):
        raise ValueError(f"{opt.name} must be a finite number {_range_text(opt)}, got {value}.")
    return value


def _pi0(opt: Option, value: Any) -> Any:
    if isinstance(value, str) and value in opt.choices:
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass  # reported below with the list of choices
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"pi0_method must be one of {', '.join(opt.choices)} or a number in "
                         f"[0, 1], got {value!r}.")
    return float(value)


_ASCII_INT = re.compile(r"[+-]?[0-9]+")


def ascii_int(text: str) -> int | None:
    """``text`` as an integer when it is one in ASCII digits, else None.

    ``str.isdigit`` is true for '²' or '٣', which ``int`` then rejects (or reads as another
    script's digit): an option typed as text accepts only 0-9, so a stray character reaches
    the option's own message instead of a raw ``int()`` error.
    """
    text = text.strip()
    return int(text) if _ASCII_INT.fullmatch(text) else None


def _head(opt: Option, value: Any) -> Any:
    if isinstance(value, str) and ascii_int(value) is not None:
        value = ascii_int(value)
    if value == "mean":
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"head must be 'mean' or a head number ≥ 0, got {value!r}.")
    return int(value)


#: The largest model input side ``target_size`` takes (a 8192-pixel ViT input at patch 16
#: is 262144 tokens); larger images run tiled.
MAX_TARGET_SIDE = 8192


def _target_size(opt: Option, value: Any) -> Any:
    if isinstance(value, str):
        if value in ("model", "native"):
            return value
        if ascii_int(value) is not None:
            value = ascii_int(value)
    sizes = value if isinstance(value, (tuple, list)) else (value,)
    ok = 1 <= len(sizes) <= 2 and all(
        isinstance(s, numbers.Integral) and not isinstance(s, bool) and s > 0 for s in sizes)
    if not ok:
        raise ValueError(f"target_size must be 'model', 'native', a long side in pixels or "
                         f"(height, width) in pixels, got {value!r}.")
    if max(sizes) > MAX_TARGET_SIDE:
        raise ValueError(f"target_size {value!r} is above the budget of {MAX_TARGET_SIDE} pixels "
                         "a side for one model input (every null image is made at that size, "
                         "and attention grows with the square of its patches); give a smaller "
                         "size, or use tiled mode (--tiled) for large images at native "
                         "resolution.")
    return int(value) if not isinstance(value, (tuple, list)) else tuple(int(s) for s in sizes)


def _device(opt: Option, value: Any) -> str:
    text = str(value)
    if not _DEVICE.fullmatch(text):  # match() let "cpu\n" through ($ matches before \n)
        raise ValueError(f"device={value!r} is not a compute device; use 'auto', 'cpu', 'cuda', "
                         f"'cuda:N' or 'mps'.")
    return text


def _channels(opt: Option, value: Any) -> list[int]:
    if isinstance(value, str):
        try:
            value = [int(c) for c in value.replace(" ", "").split(",") if c]
        except ValueError:
            raise ValueError(f"channels must be channel numbers separated by commas (e.g. "
                             f"'0,2'), got {value!r}.") from None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    try:
        chans = list(value)
    except TypeError:
        chans = [None]
    if not chans or not all(isinstance(c, numbers.Integral) and not isinstance(c, bool)
                            and c >= 0 for c in chans):
        raise ValueError(f"channels must be a list of channel numbers ≥ 0 (e.g. [0, 2]), got "
                         f"{value!r}.")
    return [int(c) for c in chans]


def _target(opt: Option, value: Any) -> Any:
    if isinstance(value, str):
        if value == "predicted":
            return value
        if ascii_int(value) is not None and ascii_int(value) >= 0:
            return ascii_int(value)
    elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        if value >= 0:
            return int(value)
    elif not isinstance(value, (bool, np.bool_, numbers.Number)):
        try:
            vector = np.asarray(value, dtype=np.float32)
        except (TypeError, ValueError):
            vector = None
        if vector is not None and vector.ndim == 1 and vector.size > 1 and bool(
                np.isfinite(vector).all()) and bool(vector.any()):
            return vector
    raise ValueError(f"target must be 'predicted', a class index ≥ 0, or a concept (a non-zero "
                     f"vector of the model's width), got {value!r}.")


def _tissue_mask(opt: Option, value: Any) -> Any:
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        if np.ndim(value) < 2:
            raise ValueError(f"tissue_mask as an array must be a 2D mask, got shape "
                             f"{np.shape(value)}.")
        return value  # an array: checked against the image when the run lays out its tiles
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"tissue_mask must be 'auto', 'none', a mask file or a 2D array, "
                         f"got {value!r}.")
    text = str(value).strip()
    if text.lower() in ("", "auto", "none"):
        return text.lower() or None
    if Path(text).is_dir():  # a batch's folder of masks, one per input (batch.masks)
        return text
    if not Path(text).is_file():
        raise ValueError(f"tissue_mask: no such mask file {text!r}; give 'auto', 'none' or "
                         "the path of a mask image.")
    return text


def _intensity_window(opt: Option, value: Any) -> Any:
    """``auto``/``stored``/``percentiles``, a preset's name, or ``(centre, width)`` floats."""
    given = value
    numbered = re.fullmatch(r"\s*stored\s*[:#]?\s*([0-9]+)\s*", value, re.IGNORECASE) \
        if isinstance(value, str) else None
    if numbered is not None and int(numbered.group(1)) >= 1:  # the file's n-th window
        return "stored" if int(numbered.group(1)) == 1 else f"stored {int(numbered.group(1))}"
    if isinstance(value, str):
        text = " ".join(value.strip().lower().replace("_", " ").replace("-", " ").split()) \
            if not any(c.isdigit() for c in value) else value.strip()
        if text in WINDOW_CHOICES or text in WINDOW_PRESETS:
            return text
        value = [v for v in re.split(r"[,/;\s]+", text) if v]
        try:
            value = [float(v) for v in value]
        except ValueError:
            value = None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in value):
        centre, width = (float(v) for v in value)
        if math.isfinite(centre) and math.isfinite(width) and width > 0:
            return (centre, width)
    raise ValueError(
        f"intensity_window={given!r} is not a window: give 'auto' (the file's stored window, "
        "else percentiles), 'stored' (or 'stored 2' for its second), 'percentiles', a CT preset "
        f"({', '.join(WINDOW_PRESETS)}) or a centre and a width > 0 in the image's units, "
        "e.g. '-600,1500' (command line: --intensity-window -600,1500; Python: "
        "intensity_window=(-600, 1500)).")


def _preset(opt: Option, value: Any) -> str:
    """A registered procedure's name (read from the registry when checked, not at import)."""
    return get_procedure(value).name


_SPECIAL = {"preset": _preset, "pi0_method": _pi0, "head": _head, "target": _target,
            "target_size": _target_size,
            "device": _device, "channels": _channels, "tissue_mask": _tissue_mask,
            "intensity_window": _intensity_window}


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a ``--flag`` for every option; values left unset stay out of the run's options.

    ``--help`` lists them in sections: the run options an analyst changes often, the
    thresholds, then the advanced ones by group (as the GUIs place them).
    """
    sections = {"basic": parser.add_argument_group("run options")}
    for group, title in GROUP_TITLES.items():
        if group == "thresholds":
            sections[group] = parser.add_argument_group("thresholds (the preset's if not given)")
        elif options_in(group, advanced=True):
            sections[group] = parser.add_argument_group(f"advanced: {title.lower()}")
    for opt in _OPTIONS:
        section = opt.group if opt.advanced or opt.group == "thresholds" else "basic"
        # SUPPRESS: a flag not given stays out of the namespace, so "--z-th none" (explicitly
        # no z mask) differs from leaving the preset's z mask in place
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": _cli_help(opt),
                                  "dest": opt.name}
        if opt.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif opt.kind == "choice" and opt.name != "pi0_method":
            kwargs["choices"] = opt.choices
        elif opt.kind == "int":
            kwargs["type"] = _cli_number(int, opt.allow_none)
            kwargs["metavar"] = "N"
        elif opt.kind == "float":
            kwargs["type"] = _cli_number(float, opt.allow_none)
            kwargs["metavar"] = "X"
        sections[section].add_argument(opt.cli_flag, **kwargs)


_NEGATIVE = re.compile(r"-[0-9.]")


def join_negative_values(argv: list[str]) -> list[str]:
    """``--intensity-window -600,1500`` as ``--intensity-window=-600,1500``.

    argparse reads a value that starts with ``-`` as a flag unless it is one plain number,
    so a CT window's negative centre gave "expected one argument"; a text option's value
    that starts with a minus and a digit is joined to its flag here.
    """
    flags = {o.cli_flag for o in _OPTIONS if o.kind == "text"}
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in flags and _NEGATIVE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _cli_number(kind: type, allow_none: bool) -> Any:
    def parse(text: str) -> Any:
        if allow_none and text.lower() == "none":
            return None
        return kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _cli_help(opt: Option) -> str:
    if opt.preset_dependent:
        default = "default: " + ", ".join(f"{get_procedure(p).defaults[opt.name]} ({p})"
                                          for p in _presets_applying(opt))
    else:
        default = f"default: {opt.default}"
    none = " ('none' = unset)" if opt.allow_none and opt.kind in ("int", "float") else ""
    return f"{opt.help} [{default}]{none}".replace("%", "%%")


def options_from_cli(namespace: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line (validated), as ``regularize`` keywords."""
    given = {name: value for name, value in vars(namespace).items() if name in OPTIONS}
    return validate_options(given)
