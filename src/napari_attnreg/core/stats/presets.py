"""Presets: which statistical procedure a run uses, and the defaults that go with it.

``"stepdown"`` (the default) asks "does this image's attention concentrate on anything
more than null images made of its own half-patch blocks do, and on which patches?": share
step-down p-values, the step-down adjusted p as evidence, ForwardStop at α = 0.1
(:mod:`.stepdown`). Attention is a softmax share and maps differ in concentration, so each
step re-normalizes the shares of the patches not yet taken before comparing them with the
null maps' largest share on the same patches.
``"directional"`` asks "is this token's attention *higher* than noise input gives?" (one-sided
``p⁺``, ``q⁺``, Grenander ``lfdr⁺``, significance at ``q⁺ ≤ 0.1``) with π0 = 1
(Benjamini–Hochberg q-values). The tokens of one attention map share a random
normalisation (the softmax), so on a noise image its p-values move together: with the demo
model on 32 grey noise images, Storey's smoother (R qvalue's default) called 29 % of the
patches significant on average (all of them in some images), Storey at λ = 0.5 2.5 % (78 % in
one image), π0 = 1 0.07 % (never more than one patch).
``"paper"`` is the published procedure of Chung & Laletin (AISTATS 2026)
unchanged: two-sided pooled p-values, the reference π0, Efron/Lindsey local fdr on z and the
lfdr rule at 0.3. A preset only fills options the caller left unset; explicit options win.
"""

from __future__ import annotations

import math
from typing import Any

PRESETS = ("stepdown", "directional", "paper")
DEFAULT_PRESET = "stepdown"

#: Options whose default depends on the preset (``None`` in a RunConfig means "from preset").
PRESET_DEFAULTS: dict[str, dict[str, Any]] = {
    "stepdown": {
        "p_method": None, "alternative": None, "pi0_method": None, "null": None,
        "null_pool": None, "method": "patch", "null_resolution": "source",
        "rule": "forwardstop", "z_th": None, "p_th": 0.05, "l_th": 0.2, "q_th": 0.1,
    },
    "paper": {
        "method": "normal", "null_resolution": "model",
        "p_method": "pooled", "alternative": "two-sided", "pi0_method": "reference",
        "null": "theoretical", "null_pool": "pooled",
        "rule": "lfdr", "z_th": 0.0, "p_th": 0.3, "l_th": 0.3, "q_th": 0.1,
    },
    "directional": {
        "method": "normal", "null_resolution": "model",
        "p_method": "null", "alternative": "greater", "pi0_method": "bh",
        "null": "theoretical", "null_pool": "pooled",
        "rule": "q", "z_th": None, "p_th": 0.05, "l_th": 0.2, "q_th": 0.1,
    },
}
#: Directional options that are fixed by construction (the value the preset needs).
_DIRECTIONAL_FIXED = {"p_method": "null", "alternative": "greater", "null": "theoretical"}
#: Options of the pooled-null procedures that the step-down preset does not use.
_STEPDOWN_UNUSED = ("p_method", "alternative", "pi0_method", "null", "null_pool")
#: Threshold keys every result carries.
THRESHOLD_KEYS = ("rule", "z_th", "p_th", "l_th", "q_th")
#: The significance rules each preset offers (the step-down rules need its step p-values).
RULES_BY_PRESET: dict[str, tuple[str, ...]] = {
    "stepdown": ("forwardstop", "fwer", "soft"),
    "directional": ("q", "p", "lfdr", "pi0", "soft", "base"),
    "paper": ("q", "p", "lfdr", "pi0", "soft", "base"),
}


def check_preset(preset: str) -> str:
    """Return ``preset`` if known, else raise a ValueError that lists the choices."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not supported; use one of {PRESETS} "
                         f"('{DEFAULT_PRESET}' is the default).")
    return preset


def resolve_options(preset: str, options: dict[str, Any]) -> dict[str, Any]:
    """Fill the preset-dependent options that are ``None`` (or absent) from the preset.

    Raises
    ------
    ValueError
        For an explicit option the preset cannot honour (e.g. a two-sided p-value under
        ``"directional"``, or the position null under ``"paper"``).
    """
    check_preset(preset)
    if preset == "stepdown":
        given = [k for k in _STEPDOWN_UNUSED if options.get(k) is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)} belong(s) to the pooled-null procedures; the step-down "
                "preset compares re-normalized shares step by step and has no such option. "
                "Pass preset='directional' or preset='paper' to use them.")
    resolved = dict(options)
    for key, default in PRESET_DEFAULTS[preset].items():
        if resolved.get(key) is None:
            resolved[key] = default
    rule = resolved.get("rule")
    if rule is not None and rule not in RULES_BY_PRESET[preset]:
        raise ValueError(f"rule={rule!r} is not available under preset={preset!r}; use one of "
                         f"{', '.join(RULES_BY_PRESET[preset])}.")
    if preset == "directional":
        for key, needed in _DIRECTIONAL_FIXED.items():
            if resolved[key] != needed:
                raise ValueError(
                    f"{key}={resolved[key]!r} belongs to the paper's two-sided procedure; the "
                    f"directional preset is one-sided by construction. Pass preset='paper' to "
                    f"use {key}={resolved[key]!r}.")
    elif preset == "paper" and resolved["null_pool"] != "pooled":
        raise ValueError("null_pool='position' is part of the directional inference; use "
                         "preset='directional' with it (the paper pools every null token).")
    z_th = resolved.get("z_th")
    if z_th is not None and not (isinstance(z_th, (int, float)) and not math.isnan(z_th)):
        raise ValueError(f"z_th must be a number or None (no z mask), got {z_th!r}.")
    return resolved


def rules_for(preset: str) -> tuple[str, ...]:
    """The significance rules a result of ``preset`` offers (front ends list only these)."""
    return RULES_BY_PRESET[check_preset(preset)]


def default_thresholds(preset: str) -> dict[str, Any]:
    """The rule and thresholds a preset starts with."""
    return {k: PRESET_DEFAULTS[check_preset(preset)][k] for k in THRESHOLD_KEYS}
