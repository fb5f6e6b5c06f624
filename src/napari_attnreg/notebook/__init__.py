"""Jupyter front end: :class:`AttentionExplorer`, the notebook twin of the napari widget.

Needs the ``notebook`` extra (ipywidgets; ipympl for drawing ROIs with the mouse).
``core`` never imports this package.
"""

from __future__ import annotations

from napari_attnreg.notebook.explorer import AttentionExplorer

__all__ = ["AttentionExplorer"]
