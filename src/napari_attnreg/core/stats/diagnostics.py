"""Plain-sentence warnings every front end shows next to a result.

A significance map from an untrained model, an off-domain model or a degenerate fit looks
as confident as a good one; these checks say so in words (status line, notification, figure
title, result summary), not only as a Python warning.

The off-domain rule (:func:`off_domain`) compares the model's declared domain with the kind
of image it ran on. A run states the image's kind in its metadata (``RunConfig.extra``:
``{"image_kind": "radiology", "image_kind_source": "DICOM Modality CT"}``), and
:func:`from_metadata` adds the finding to every result whose metadata says so, so each front
end only has to pass the kind.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Normalised entropy H(A)/log T at or above which attention counts as nearly uniform.
UNIFORM_ENTROPY = 0.98
#: Fewer tokens than this make π0 and the density fits poorly determined.
MIN_TOKENS_FOR_FIT = 64
#: Share of patches with posterior ≥ 0.5 above which a map-wide posterior is worth a word.
BROAD_POSTERIOR = 0.5
_PRIMARY_FITS = ("lindsey-deg7", "grenander", "stepdown")
#: Observed / null spread of log attention outside this range: the null images do not look
#: like the image to the model (their maps are much more or less concentrated).
CONCENTRATION_RANGE = (0.7, 1.4)


@dataclass(frozen=True)
class Diagnostic:
    """One finding about a run.

    Attributes
    ----------
    code : str
        Stable identifier (``uniform_attention``, ``random_init``, ``model_domain``,
        ``off_domain``, ``flat_map``, ``pi0_zero``, ``pi0_one``, ``fit_fallback``,
        ``few_tokens``, ``broad_posterior``, ``p_resolution``, ``statistics_warning``).
    severity : {"warning", "info"}
    message : str
        One sentence for the analyst.
    """

    code: str
    severity: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def normalized_entropy(attention: np.ndarray) -> float:
    """``H(A)/log T`` of an attention map (1 = perfectly uniform)."""
    # in place on one float64 copy: a whole slide's grid is tens of millions of tokens, and
    # each temporary of the plain formula would be another 300 MB (the same values, bit for bit)
    a = np.array(attention, dtype=np.float64).reshape(-1)
    if a.size < 2:
        return 1.0
    size = a.size
    total = a.sum()
    if not total > 0:  # all zero (a class map with no evidence): flat, if anything
        return 1.0 if np.ptp(a) == 0 else float("nan")
    a /= total
    nz = a[a > 0]
    del a
    terms = np.log(nz)
    terms *= nz
    return float(-terms.sum() / math.log(size))


def diagnose(
    attention: np.ndarray,
    *,
    pi0: float,
    lfdr_fit: str,
    pi0_estimated: bool = True,
    z_sd: float | None = None,
    posterior: np.ndarray | None = None,
    smallest_p: float | None = None,
    q_th: float | None = None,
    concentration: float | None = None,
    step_level: tuple[float, ...] | None = None,
    tail_fit: dict[str, Any] | None = None,
    family: str = "tile",
    random_init: bool,
    model_name: str,
    domain: str | None = None,
    domain_note: str | None = None,
    warnings_seen: list[str] | tuple[str, ...] = (),
) -> list[Diagnostic]:
    """Everything an analyst should be told about one result.

    Parameters
    ----------
    attention : array
        The observed token attention.
    pi0, lfdr_fit : float, str
        From the statistics (``lfdr_fit`` names the density fit that was used).
    pi0_estimated : bool
        π0 came from the data (not fixed), so a value at its cap is worth a word.
    z_sd : float, optional
        Standard deviation of the observed z-scores (the pooled null's is 1).
    posterior : array, optional
        The posterior map; when most of it is ≥ 0.5 the cause is named.
    smallest_p, q_th : float, optional
        The smallest p-value the null pool can give and the q rule's threshold: when even a
        lone token at that p cannot reach ``q ≤ q_th`` over all tokens, B is too small.
    concentration : float, optional
        sd of log attention, observed over null (step-down); outside
        :data:`CONCENTRATION_RANGE` it is worth a word.
    step_level : (float, float, int[, bool]), optional
        Step-down: the smallest step p the run can give, the largest first-step p its rule
        can reject, the number of families (tiles) and whether the tail fit is on; when the
        first is larger, nothing can ever be significant.
    family : str
        What one family is, in the words said: ``"tile"``, or ``"head"`` for ``map="heads"``.
    tail_fit : dict, optional
        Step-down: what the tail approximation did (:class:`~.tail.TailFit` as a dict); a
        first-step fit its goodness-of-fit test rejected is worth a word.
    random_init : bool
        The backbone has no trained weights.
    model_name, domain, domain_note : str
        The model and the domain it declares (e.g. "pathology"), with a short note.
    warnings_seen : sequence of str
        Messages of statistics warnings raised during the run.

    Returns
    -------
    list of Diagnostic, warnings first.
    """
    found: list[Diagnostic] = []
    if random_init:
        found.append(Diagnostic(
            "random_init", "warning",
            f"{model_name} has random weights (nothing pretrained was loaded): its attention "
            "means nothing; load trained weights."))
    flat = _flat_value(attention)
    if flat is not None:
        # every statistic of a flat map is degenerate: say why once, not through its symptoms
        found.append(Diagnostic(
            "flat_map", "warning",
            f"The map has the same value ({flat:.3g}) on every patch: nothing in it stands "
            "out, and its statistics say nothing about where to look. Attention is flat when "
            "the weights are untrained or unsuited to this image; a class map (Grad-CAM, "
            "CDAM) when the model finds no evidence of the chosen class in it: choose another "
            "class or map."))
        posterior, concentration = None, None  # their findings would be symptoms of it
    entropy = normalized_entropy(attention)
    if flat is None and entropy >= UNIFORM_ENTROPY:
        found.append(Diagnostic(
            "uniform_attention", "warning",
            f"The attention is nearly uniform (normalised entropy {entropy:.3f}): the weights "
            "may be untrained or unsuited to this image."))
    n_tokens = int(np.asarray(attention).size)
    if n_tokens < MIN_TOKENS_FOR_FIT:
        found.append(Diagnostic(
            "few_tokens", "warning",
            f"Only {n_tokens} tokens: π0 and the local fdr are poorly determined; use a larger "
            "target size or a model with smaller patches."))
    if flat is None:
        found += _pi0_findings(pi0, pi0_estimated)
    # the share of the patches tested: NaN marks one never tested (glass a tissue mask left
    # out, an attention sink left out), which would dilute it
    tested = None if posterior is None else np.asarray(posterior, dtype=np.float64)
    tested = None if tested is None else tested[~np.isnan(tested)]
    broad = float(np.mean(tested >= 0.5)) if tested is not None and tested.size else None
    if broad is not None and broad > BROAD_POSTERIOR:
        spread = f" (sd of z {z_sd:.2f}; the null's is 1)" if z_sd is not None else ""
        found.append(Diagnostic(
            "broad_posterior", "warning",
            f"The posterior is ≥ 0.5 on {100 * broad:.0f} % of the patches: this map is less "
            f"dispersed than the noise maps{spread}, so most patches sit above a noise map's "
            "typical patch, and an outline over most of it locates nothing. Prefer the default "
            "step-down statistics, or the patch null (method 'patch'), whose null maps look "
            "like image maps."))
    # the best a lone token can reach is q = T · p_min (π0 ≤ 1, rank 1)
    if smallest_p is not None and q_th is not None and smallest_p * n_tokens > q_th:
        found.append(Diagnostic(
            "p_resolution", "warning",
            f"With this many patches ({n_tokens}) and null values ({round(1 / smallest_p - 1)}), "
            f"the smallest possible p ({smallest_p:.2g}) cannot reach q ≤ {q_th:g} for a lone "
            f"patch: raise the number of null images (B) about "
            f"{smallest_p * n_tokens / q_th:.0f}-fold, or use the p or lfdr rule."))
    found += _stepdown_findings(concentration, step_level, family)
    found += _tail_findings(tail_fit)
    if lfdr_fit not in _PRIMARY_FITS:
        found.append(Diagnostic(
            "fit_fallback", "warning",
            f"The density fit for the local fdr fell back to '{lfdr_fit}'; the posterior is "
            "approximate."))
    for message in dict.fromkeys(warnings_seen):  # unique, in order
        found.append(Diagnostic("statistics_warning", "warning", message))
    if domain:
        note = f" ({domain_note.rstrip('.')})" if domain_note else ""
        found.append(Diagnostic("model_domain", "info", f"Model domain: {domain}{note}."))
    return sorted(found, key=lambda d: d.severity != "warning")


def _pi0_findings(pi0: float, estimated: bool) -> list[Diagnostic]:
    if pi0 <= 0.0:
        return [Diagnostic(
            "pi0_zero", "warning",
            "π0 was estimated as 0 (every token non-null), a degenerate estimate: do not trust "
            "the local fdr or posterior; use the directional preset or a fixed pi0.")]
    if pi0 >= 1.0 and estimated:
        return [Diagnostic(
            "pi0_one", "info",
            "π0 = 1 (at its cap): most patches look like the null, so only patches far above "
            "it can be significant.")]
    return []


def _flat_value(attention: np.ndarray) -> float | None:
    """The one value of a map that has no other (all zero, say), else None."""
    a = np.asarray(attention, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size < 2 or a.max() != a.min():
        return None
    return float(a[0])


def _stepdown_findings(concentration: float | None, step_level: tuple[float, ...] | None,
                       family: str = "tile") -> list[Diagnostic]:
    found = []
    low, high = CONCENTRATION_RANGE
    if concentration is not None and np.isfinite(concentration) and \
            not low <= concentration <= high:
        shape = "more even" if concentration < low else "more concentrated"
        found.append(Diagnostic(
            # info, not a warning: on real fields with half-patch block nulls the ratio is often
            # near 0.55 while the significant patches sit on the right objects (docs/validation.md)
            "concentration", "info",
            f"This attention map is {shape} than the null images' maps (spread of log "
            f"attention {concentration:.2f}× theirs; noise inputs give {low}–{high}). If the "
            "result looks wrong, another null method or block size may suit this image better."))
    if step_level is not None and step_level[0] > step_level[1]:
        smallest, needed, n_fam, *tail = step_level
        n_fam = int(n_fam)
        # with the tail fit on, its floor 1/(100(B+1)) is the limit: only B helps
        advice = " or use tail='gpd'." if n_fam > 1 and not (tail and tail[0]) else "."
        if n_fam == 1:
            message = (f"The smallest p this run can give ({smallest:.2g}) is above what the "
                       f"rule needs to call anything significant ({needed:.2g})")
        else:
            # Benjamini–Hochberg selects k tiles that share a p ≤ α·k/n: tiles at the
            # smallest p can still be selected, but only in a crowd of at least this many
            crowd = math.ceil(smallest / needed - 1e-9)
            message = (f"The smallest p this run can give ({smallest:.2g}) is above what a "
                       f"lone {family} needs to be significant over {n_fam} {family}s "
                       f"({needed:.2g}): {family}s are found only when at least {crowd} of "
                       f"them reach that p together, so a few {family}s with an object can "
                       "be missed")
        found.append(Diagnostic("p_resolution", "warning",
                                message + "; raise the number of null images (B)" + advice))
    return found


def _tail_findings(tail_fit: dict[str, Any] | None) -> list[Diagnostic]:
    rejected = int((tail_fit or {}).get("first_rejected", 0))
    if not rejected:
        return []
    wanted, n_boot = int(tail_fit["first_wanted"]), int(tail_fit["null_maps"])
    which = ("the map's p-value" if wanted == 1 else
             f"{rejected} of the {wanted} tiles whose p-value needed it")
    whose = "its p-value is" if rejected == 1 else "their p-values are"
    return [Diagnostic(
        # info: a count is a valid p-value, only a coarser one
        "tail_rejected", "info",
        f"The tail approximation was refused for {which}: the largest null values did not "
        f"follow its generalized Pareto tail closely enough (goodness-of-fit test at 0.05), "
        f"so {whose} the plain count, no smaller than 1/(B + 1) = {1 / (n_boot + 1):.2g}. "
        "That is valid, only coarser; more null images (B) give finer counts and a new fit.")]


#: Kinds of image a run can state (``--image-kind``, DICOM Modality, OME metadata).
IMAGE_KINDS = ("radiology", "pathology", "microscopy", "natural")
#: Model domains (``Backbone.domain``, the catalogue's) that suit each kind of image: a
#: pathology slide is microscopy too, so those two domains suit each other's images.
SUITED_DOMAINS = {"radiology": ("radiology",), "pathology": ("pathology", "microscopy"),
                  "microscopy": ("microscopy", "pathology"), "natural": ("natural",)}
#: DICOM Modality (0008,0060) → image kind. SM is slide microscopy (whole-slide pathology),
#: GM general microscopy; the rest are radiology and nuclear medicine.
MODALITY_KINDS = {
    **dict.fromkeys(("CT", "MR", "CR", "DX", "MG", "PT", "NM", "US", "XA", "RF", "IO", "PX",
                     "RG", "DR"), "radiology"),
    "SM": "pathology", "GM": "microscopy",
}


def kind_of_modality(modality: Any) -> str | None:
    """The image kind of a DICOM Modality (``"CT"`` → ``"radiology"``), None when unknown."""
    return MODALITY_KINDS.get(str(modality or "").strip().upper())


def off_domain(image_kind: Any, model_domain: Any, *, model_name: str = "the model",
               source: str | None = None) -> Diagnostic | None:
    """Whether a model's declared domain suits the kind of image it ran on.

    Parameters
    ----------
    image_kind : str or None
        One of :data:`IMAGE_KINDS`; anything else (unknown) gives None.
    model_domain : str or None
        The model's declared domain (catalogue ``domain``: pathology, radiology, microscopy,
        natural, demo); None (a timm name, a weights file) gives None.
    model_name : str
        Named in the message.
    source : str, optional
        Where the kind came from (``"DICOM Modality CT"``, ``"--image-kind"``), named too.

    Returns
    -------
    Diagnostic or None
        ``off_domain``: a warning for a bundled test article (domain ``demo``) or another
        specialist domain on this image, an info for a general-purpose (``natural``) model
        on a specialist image; None when the domain suits the image or either is unknown.

    Examples
    --------
    >>> off_domain("radiology", "pathology", model_name="uni").severity
    'warning'
    >>> off_domain("pathology", "microscopy") is None
    True
    """
    if not isinstance(image_kind, str) or image_kind not in SUITED_DOMAINS \
            or not isinstance(model_domain, str) or not model_domain:
        return None
    if model_domain in SUITED_DOMAINS[image_kind]:
        return None
    seen = f"a {image_kind} image" + (f" ({source})" if source else "")
    if model_domain == "demo":
        return Diagnostic(
            "off_domain", "warning",
            f"{model_name} is a bundled test article trained on synthetic images, not a "
            f"{image_kind} model: its attention on {seen} says nothing about real "
            f"{image_kind} images; choose a {image_kind} model.")
    if model_domain == "natural":
        return Diagnostic(
            "off_domain", "info",
            f"{model_name} is a general-purpose model trained on natural photographs; on "
            f"{seen} its attention follows generic structure (edges, contrast), not "
            f"{image_kind} features.")
    return Diagnostic(
        "off_domain", "warning",
        f"{model_name} is a {model_domain} model, but this is {seen}: off its domain, its "
        f"attention may follow artefacts rather than {image_kind} features; choose a "
        f"{image_kind} model, or state the image's kind if it is wrong.")


def from_metadata(metadata: dict[str, Any]) -> list[Diagnostic]:
    """The diagnostics stored in a result's metadata, warnings first.

    Where the metadata states the image's kind (``image_kind``, from the run's ``extra``)
    and no off-domain finding was stored, :func:`off_domain` of that kind and the stored
    ``model_domain`` is added: a front end only passes the kind to get the warning.
    """
    found = [Diagnostic(**d) for d in metadata.get("diagnostics", [])]
    if not any(d.code == "off_domain" for d in found):
        source = metadata.get("image_kind_source")
        extra = off_domain(metadata.get("image_kind"), metadata.get("model_domain"),
                           model_name=str(metadata.get("model") or "the model"),
                           source=source if isinstance(source, str) and source else None)
        if extra is not None:
            found = sorted([*found, extra], key=lambda d: d.severity != "warning")
    return found
