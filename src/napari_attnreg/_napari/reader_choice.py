"""'Open .dcm and saved results with Attention Regularization': napari's reader preference, set
in one click.

Without it ``viewer.open("x.dcm")`` goes to napari's built-in reader (no spacing, no mm) and
a saved ``significant.ome.tif`` comes back as an Image. napari remembers a reader per file
pattern (Preferences ▸ Plugins ▸ File extension readers); the button writes ours for the
patterns the plugin reads, and hides once they are all set.
"""

from __future__ import annotations

from qtpy.QtWidgets import QPushButton, QWidget

PLUGIN = "napari-attnreg"
#: File patterns whose napari reader preference the button sets.
PATTERNS = ("*.dcm", "*.dicom", "*.ome.tif", "*.ome.tiff", "*.attnreg.npz", "*.geojson")


def uses_our_reader() -> bool:
    """Whether napari's reader preference already names this plugin for every pattern."""
    from napari.settings import get_settings

    chosen = get_settings().plugins.extension2reader
    return all(chosen.get(p) == PLUGIN for p in PATTERNS)


def use_our_reader() -> None:
    """Set napari's reader preference to this plugin for :data:`PATTERNS` (saved settings)."""
    from napari.settings import get_settings

    plugins = get_settings().plugins
    plugins.extension2reader = {**plugins.extension2reader, **dict.fromkeys(PATTERNS, PLUGIN)}


class ReaderChoiceButton(QPushButton):
    """One click: open .dcm files and the plugin's saved files with this plugin's reader."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Use this plugin for .dcm and results", parent)
        self.setToolTip("Sets napari's reader preference (Preferences ▸ Plugins) for "
                        + ", ".join(PATTERNS) + ": DICOM then opens with its spacing in mm, "
                        "and saved results come back as the layers the dock made.")
        self.clicked.connect(self._on_clicked)
        self.setVisible(not uses_our_reader())

    def _on_clicked(self) -> None:
        from napari.utils.notifications import show_info

        use_our_reader()
        self.setVisible(False)
        show_info("napari now opens " + ", ".join(PATTERNS) + " with Attention Regularization "
                  "(Preferences ▸ Plugins to change it).")
