"""Model picker for the notebook explorer: the catalogue grouped by domain, or any other name."""

from __future__ import annotations

import html

import ipywidgets as W
import traitlets as t

from napari_attnreg.core.models.catalogue import by_domain, find
from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES

OTHER = "__other__"


def catalogue_options() -> list[tuple[str, str]]:
    """Dropdown options ``(label, value)``: each domain's models under its name, then 'other'."""
    options = [(f"{domain} · {e.name}{' (gated)' if e.gated else ''}", e.id)
               for domain, entries in by_domain().items() for e in entries]
    return options + [("other: timm name, hf:id or weights file …", OTHER)]


class ModelPicker(W.VBox):
    """``value`` is a catalogue id or whatever the analyst typed under 'other'.

    The line below the dropdown gives the chosen model's domain, licence and hub gating.
    """

    value = t.Unicode("demo")
    disabled = t.Bool(False)

    def __init__(self, description: str = "model", layout: W.Layout | None = None,
                 style: dict | None = None) -> None:
        super().__init__()
        self.dropdown = W.Dropdown(options=catalogue_options(), description=description,
                                   layout=layout or W.Layout(), style=style or {},
                                   tooltip="The Vision Transformer to analyse with: a model of "
                                           "the catalogue (grouped by domain), or 'other' to "
                                           "type a timm name, hf:org/name or a weights file.")
        # its own Layout: hiding the text box must not hide the drop-down sharing the caller's
        self.other = W.Text(placeholder="timm name, hf:org/name, or weights file",
                            layout=W.Layout(width=layout.width if layout else None),
                            style=style or {},
                            description=" ", continuous_update=False,
                            tooltip="A timm model name, a Hugging Face id (hf:org/name) or the "
                                    f"path of a weights file ({', '.join(WEIGHT_SUFFIXES)}).")
        self.access = W.HTML().add_class("attnreg-model-access")
        self._typed = False  # the value came from the text box: keep it open
        self.dropdown.observe(self._from_controls, "value")
        self.other.observe(self._from_controls, "value")
        self._show(self.value)

    def _from_controls(self, _change: dict) -> None:
        self._typed = self.dropdown.value == OTHER
        try:
            self.value = self.other.value.strip() if self._typed else self.dropdown.value
        finally:
            self._typed = False

    @t.observe("value")
    def _value_changed(self, change: dict) -> None:
        self._show(change["new"])

    @t.observe("disabled")
    def _disabled_changed(self, change: dict) -> None:
        self.dropdown.disabled = self.other.disabled = change["new"]

    def _show(self, value: str) -> None:
        entry = find(value) if value else None
        listed = entry is not None and not self._typed
        if listed and entry.id != self.dropdown.value:
            self.dropdown.value = entry.id
        elif not listed:
            self.dropdown.value = OTHER
            if self.other.value.strip() != value:
                self.other.value = value
        self.other.layout.display = "none" if listed else None
        if entry is None:
            self.access.value = ""
            self.children = (self.dropdown, self.other, self.access)
            return
        gate = (f"gated: <a href='{entry.page}' target='_blank'>request access</a>, then log in "
                "or set HF_TOKEN" if entry.gated else "open download")
        self.access.value = (f"<small><b>{entry.domain}</b> · {html.escape(entry.description)}<br>"
                             f"{html.escape(entry.licence)} · {gate}</small>")
        self.children = (self.dropdown, self.other, self.access)
