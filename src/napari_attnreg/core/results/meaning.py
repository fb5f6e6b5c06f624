"""What "significant" means, in the terms of the procedure that produced a result.

Analysts read "significant" as "nucleus" or "abnormal"; every front end that shows the
significant patches (status lines, legends, tooltips, figure keys, the notebook summary)
says instead what a patch was compared with. One sentence per procedure, built from the
run's own null images (their method, number and block size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: How each null-image method draws its images, for the sentence.
_NULL_WORDS = {
    "patch": "this image's own {block} blocks shuffled",
    "pixel": "this image's own pixels shuffled",
    "normal": "Gaussian noise images (white noise with this image's mean and spread)",
    "uniform": "uniform noise images (white noise between this image's min and max)",
}


def null_words(method: str | None, block_size: int | None = None) -> str:
    """``"this image's own half-patch blocks shuffled"`` etc.: what the null images were."""
    block = f"{block_size}-px" if block_size else "half-patch"
    return _NULL_WORDS.get(method or "", "null images").format(block=block)


#: Provenance's ``null`` for runs whose procedure has no z null model: the null images.
_NULL_RECORD = {
    "pixel": "pixels shuffled",
    "normal": "Gaussian noise images (image mean and spread)",
    "uniform": "uniform noise images (image min to max)",
}


def null_record(metadata: Mapping[str, Any]) -> str | None:
    """What the null was, for provenance's ``null`` field of a run that names no z null model
    (the step-down): ``"patch blocks of 8 px shuffled"`` (model pixels), ``"pixels shuffled"``,
    ...; None when the run does not say which null images it drew."""
    method = metadata.get("method")
    if method == "patch":
        block = metadata.get("patch_block_size") or metadata.get("block_size")
        return f"patch blocks of {block} px shuffled" if block else "patch blocks shuffled"
    return _NULL_RECORD.get(method or "")


def significance_meaning(preset: str, n_boot: int | None = None, method: str | None = None,
                         block_size: int | None = None, what: str = "attention") -> str:
    """One sentence: what a significant patch of a ``preset`` run is significant against.

    Examples
    --------
    >>> significance_meaning("stepdown", 100, "patch")
    "Significant = attention more concentrated here than on this image's own half-patch \
blocks shuffled (B = 100 null images); not a detection of an object or an abnormality."
    """
    from napari_attnreg.core.stats.procedures import get_procedure

    nulls = null_words(method, block_size)
    count = f" (B = {n_boot} null images)" if n_boot else ""
    claim = get_procedure(preset).compared_with(nulls, count, what)
    return f"Significant = {claim}; not a detection of an object or an abnormality."


def result_meaning(preset: str, metadata: Mapping[str, Any]) -> str:
    """:func:`significance_meaning` of a result from its run metadata (``n_boot``, ``method``,
    ``block_size`` as the run recorded them), after the tested map when it is not attention."""
    from napari_attnreg.core.results.map_info import MapInfo

    info = MapInfo.of(metadata)
    # the claim is about the tested map (a CDAM patch is not "attention more concentrated")
    text = significance_meaning(preset, metadata.get("n_boot"), metadata.get("method"),
                                metadata.get("block_size"),
                                what="attention" if info.is_default else info.caption())
    return text if info.is_default else f"Tested map: {info.caption()}. {text}"


#: Share of the patches above which an outline under a pooled-null preset gets a warning.
BROAD_OUTLINE_SHARE = 0.5


def broad_outline_warning(preset: str, significant_share: float) -> str | None:
    """What an outline covering most of the image means under the directional and paper
    presets, and when to prefer the default; None when it covers less or under the default.

    Those presets compare each patch with the model's attention on white-noise images: an
    image the model attends to more evenly than to noise (a smooth gradient, a flat field)
    is "above noise" almost everywhere, so such an outline locates nothing.
    """
    from napari_attnreg.core.stats.procedures import get_procedure

    if get_procedure(preset).uses_step_p or significant_share <= BROAD_OUTLINE_SHARE:
        return None
    return (f"The significant outline covers {100 * significant_share:.0f} % of the patches. "
            f"Under the {preset} preset it marks attention above what the model gives to "
            "white-noise images, which an evenly attended image (a smooth gradient, a flat "
            "field) exceeds almost everywhere: it does not locate anything here. Prefer the "
            "default step-down preset, which compares the attention with this image's own "
            "blocks shuffled.")
