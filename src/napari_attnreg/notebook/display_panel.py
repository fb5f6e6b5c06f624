"""How the result is shown: which map, its colormap and opacity, outlines, colour bar, legend."""

from __future__ import annotations

import html

import ipywidgets as W
import numpy as np

from napari_attnreg.core.results.display import map_display
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.notebook import render
from napari_attnreg.notebook.option_controls import labelled
from napari_attnreg.notebook.options_panel import link_all
from napari_attnreg.notebook.state import ExplorerState, overlay_options

#: "auto": each map in its own colormap (core.display), as napari and the CLI show it.
COLORMAPS = ("auto", "magma", "inferno", "viridis", "turbo", "hot", "gray", "magma_r", "viridis_r")


def tissue_legend(result: AttentionResult) -> str:
    """The legend's words for the tissue mask's edge (empty for a run without a mask)."""
    md = result.metadata
    if result.null_summary.get("tissue_mask") is None or md.get("n_tissue_tiles") is None:
        return ""
    source = html.escape(str(md.get("tissue_mask") or "tissue mask"), quote=False)
    return (f"<br><span style='color:{render.hex_color(render.TISSUE_COLOR)}'>■</span> "
            f"edge of the tissue mask ({source}): {md['n_tissue_tiles']} of "
            f"{md.get('n_tiles_total', '?')} tiles tested; glass outside them was never run "
            "(not measured), so no map is drawn there.")


class DisplayPanel(W.VBox):
    """Overlay choice and look (side panel), plus the colour bar and legend under the image."""

    def __init__(self, state: ExplorerState) -> None:
        super().__init__()
        self.state = state
        self.controls: dict[str, W.Widget] = {
            "overlay": labelled(W.Dropdown, "overlay", "Which map is drawn over the image.",
                                options=overlay_options(state.shown_preset)),
            "colormap": labelled(W.Dropdown, "colormap",
                                 "auto: each map in its own colormap, as napari shows it.",
                                 options=[*COLORMAPS, *{state.colormap} - set(COLORMAPS)]),
            "opacity": labelled(W.FloatSlider, "opacity", "Opacity of the overlay.",
                                min=0, max=1, step=0.05),
            "outline": W.Checkbox(description="outline significant", indent=False,
                                  tooltip="Outline the patches kept by the rule."),
        }
        link_all(state, self.controls, {k: k for k in self.controls})
        state.observe(lambda _c: self._name_overlays(), names=["shown_preset", "shown_map"])
        self.children = tuple(self.controls.values())
        self.colorbar = W.Image(format="png", layout=W.Layout(width="200px", height="12px"))
        self.colorbar_lo, self.colorbar_hi, self.colorbar_label = W.Label(), W.Label(), W.Label()
        self.colorbar_box = W.HBox([self.colorbar_lo, self.colorbar, self.colorbar_hi,
                                    self.colorbar_label], layout=W.Layout(align_items="center"))
        self.legend = W.HTML(layout=W.Layout(max_width="560px")).add_class("attnreg-legend")
        self.under_image = W.VBox([self.colorbar_box, self.legend])

    def _name_overlays(self) -> None:
        """Name the overlay choices as the shown result's preset computes them."""
        dropdown, value = self.controls["overlay"], self.state.overlay
        options = overlay_options(self.state.shown_preset, self.state.shown_map)
        if list(dropdown.options) != options:
            dropdown.options = options
            dropdown.value = value  # new options reset the selection; the state's choice stays

    def lut(self, result: AttentionResult | None = None) -> np.ndarray:
        """The colormap lookup table of the chosen overlay (``result``'s map: a signed one is
        diverging)."""
        name = self.state.colormap
        if name == "auto":
            overlay = self.state.overlay
            name = map_display(overlay, result).colormap if overlay != "none" else "magma"
        return render.colormap_lut(name)

    def show_scale(self, lut: np.ndarray, vmin: float, vmax: float,
                   result: AttentionResult | None) -> None:
        """Colour scale, the map's title and its one-sentence legend (core.display); the
        title names the thresholds ``result`` applies."""
        shown = result is not None
        self.colorbar_box.layout.display = "flex" if shown else "none"
        self.legend.layout.display = "block" if shown else "none"
        if not shown:
            return
        view = map_display(self.state.overlay, result)
        self.colorbar.value = render.to_png(render.colorbar(lut))
        self.colorbar_lo.value = f"{vmin:.3g}"
        self.colorbar_hi.value = f"{vmax:.3g}"
        self.colorbar_label.value = view.title(result.preset, result.thresholds_used)
        outline = (f" <span style='color:{render.hex_color(render.SIGNIFICANT_COLOR)}'>■</span> "
                   "outline: significant patches." if self.state.outline else "")
        legend = html.escape(view.legend(result.preset), quote=False)
        self.legend.value = (f"<div style='font-size:90%;line-height:1.35'>{legend}{outline}"
                             f"{tissue_legend(result)}</div>")
