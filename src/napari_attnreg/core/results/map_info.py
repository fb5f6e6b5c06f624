"""Which map a result tests, as its metadata records it: the words every display uses.

:class:`MapInfo` is read from a result (or its metadata): the map's name and label, whether
it is signed, the side of a signed map the statistics test, and a class map's target. Titles,
legends, layer names, ROI headers and the patch report of every front end say the map in
these words (:mod:`.display`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The default map (head-mean CLS attention); other maps are named in every title.
DEFAULT_MAP = "attention"


@dataclass(frozen=True)
class MapInfo:
    """Which map a result tests, as its metadata records it (the default: attention).

    Attributes
    ----------
    name : str
        ``attention``, ``heads``, ``rollout``, ``cdam`` or ``gradcam``.
    label : str
        How the map is called (``"CDAM"``, ``"attention rollout"``).
    signed : bool
        The raw map takes both signs (CDAM).
    sign : str
        ``"for"`` or ``"against"``: the part of a signed map the statistics test.
    target : str, int or None
        ``"predicted"``, a class index or ``"concept"`` (class maps); None otherwise.
    """

    name: str = DEFAULT_MAP
    label: str = DEFAULT_MAP
    signed: bool = False
    sign: str = "for"
    target: Any = None

    @classmethod
    def of(cls, result: Any) -> MapInfo:
        """The map of ``result`` (an ``AttentionResult``, or a result's metadata)."""
        md: Mapping[str, Any] = result if isinstance(result, Mapping) else result.metadata
        name = str(md.get("map") or DEFAULT_MAP)
        return cls(name=name, label=str(md.get("map_label") or name),
                   signed=bool(md.get("map_signed", False)), sign=str(md.get("sign") or "for"),
                   target=md.get("target") if name in ("cdam", "gradcam") else None)

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_MAP

    @property
    def target_text(self) -> str:
        """``"concept"``, ``"class 3"``, ``"predicted class"`` ('' for maps without one)."""
        if self.target is None:
            return ""
        if self.target == "predicted":
            return "predicted class"
        return "concept" if self.target == "concept" else f"class {self.target}"

    def caption(self) -> str:
        """``"CDAM for concept"``, ``"CDAM against class 3"``, ``"attention rollout"``: the map
        and, for a class map, the side of its target the statistics test."""
        if self.target is None:
            return self.label
        side = self.sign if self.signed else "for"
        return f"{self.label} {side} {self.target_text}"

    def raw_title(self) -> str:
        """Title of the raw map (colour bars): ``"CDAM, concept (signed)"``."""
        if self.is_default:
            return "attention"
        what = f"{self.label}, {self.target_text}" if self.target is not None else self.label
        return f"{what} ({'signed' if self.signed else 'raw'})"

    def raw_legend(self) -> str:
        """How to read the raw map's colours."""
        if self.signed:
            tested = "the red (for) side" if self.sign == "for" else "the blue (against) side"
            return (f"{self.label}: how much each patch moves the {self.target_text} score — red "
                    f"for it, blue against it, white neither (raw values, centred at 0). The "
                    f"statistics test {tested}.")
        if self.target is not None:
            return (f"{self.label} for the {self.target_text}: raw values, never rescaled per "
                    "image (bright = the patch supports it; 0 = no support).")
        return _RAW_LEGENDS.get(self.name, f"{self.label} of each patch.")


_RAW_LEGENDS = {
    DEFAULT_MAP: "CLS attention of each patch (bright = the model looks here).",
    "heads": "CLS attention, mean of the heads (each head was tested on its own).",
    "rollout": "Attention rolled out through every block (bright = the CLS token draws on "
               "this patch through the whole network).",
}
