"""Save result and Export figure: a path box and a button each, beside the ROI table's Export.

The buttons act on the result on screen (the session's selected result, with its
thresholds), as Export CSV does; the explorer's :meth:`save` and :meth:`export_figure` are
what they call. A path typed in a box is completed as every export completes it
(:func:`output_path`: the right ending added, a default name inside a folder), and a button
never writes over a file that exists (:func:`new_file`): an earlier export, the image, or a
result saved before stay as they are, and the status line says to type another name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as W

#: The boxes' first values: files in the notebook's folder, as the CSV box's ``roi_table.csv``.
RESULT_NAME = "result.attnreg.npz"
FIGURE_NAME = "figure.png"
#: Wide enough for "Export figure" and its icon (at 120 px JupyterLab cut it to "Export fig…");
#: with a 200 px box, a row still fits the side panel's 360 px.
BUTTON_WIDTH = "140px"


def output_path(typed: str | Path, suffixes: Sequence[str], default: str, *,
                case_sensitive: bool = False) -> Path:
    """Where an export of ``typed`` goes: ``default`` inside a folder; ``suffixes[0]`` added
    to a name that ends in none of ``suffixes`` (``cells.tif`` → ``cells.tif.png``: the
    image is never the file written).

    Parameters
    ----------
    typed : str or Path
        The path box's text or a method's argument (``~`` is the home folder).
    suffixes : sequence of str
        Endings that are kept (``(".png",)``); the first is the one added.
    default : str
        The file's name inside a folder given.
    case_sensitive : bool
        Compare endings as written (:meth:`AttentionResult.save` adds ``.npz`` to
        ``x.NPZ``), else ignoring case.
    """
    path = Path(typed).expanduser()
    if path.is_dir():
        return path / default
    name = path.name if case_sensitive else path.name.lower()
    if not name.endswith(tuple(s if case_sensitive else s.lower() for s in suffixes)):
        path = path.with_name(path.name + suffixes[0])
    return path


def new_file(path: Path) -> Path:
    """``path`` when nothing is there yet (a button never replaces a file).

    Raises
    ------
    ValueError
        A file (or anything else) already exists at ``path``: naming it and what to do.
    """
    if path.exists() or path.is_symlink():
        raise ValueError(f"{path} already exists and is not overwritten: type another name "
                         "in the box (or move that file away first).")
    return path


class ExportPanel(W.VBox):
    """Two rows: a path box and Save result; a path box and Export figure.

    Parameters
    ----------
    on_save, on_figure : callable
        Called with the box's text (its default when empty) when the button is pressed.
    """

    def __init__(self, on_save: Callable[[str], Any], on_figure: Callable[[str], Any]) -> None:
        super().__init__()
        self.result_path = W.Text(value=RESULT_NAME, layout=W.Layout(width="200px"),
                                  tooltip="Where Save result writes the result (.npz).")
        self.save = W.Button(description="Save result", icon="save",
                             tooltip="Save the result on screen with its thresholds (.npz; "
                                     "explorer.open_result or napari reopen it). An existing "
                                     "file is never overwritten.",
                             layout=W.Layout(width=BUTTON_WIDTH))
        self.figure_path = W.Text(value=FIGURE_NAME, layout=W.Layout(width="200px"),
                                  tooltip="Where Export figure writes the figure (.png).")
        self.figure = W.Button(description="Export figure", icon="image",
                               tooltip="Write the publication figure of the result on screen: "
                                       "the map shown, at its thresholds (PNG, as napari's "
                                       "Export figure). An existing file is never "
                                       "overwritten.",
                               layout=W.Layout(width=BUTTON_WIDTH))
        self.save.on_click(lambda _b: on_save(self.result_path.value.strip() or RESULT_NAME))
        self.figure.on_click(
            lambda _b: on_figure(self.figure_path.value.strip() or FIGURE_NAME))
        self.children = (W.HBox([self.result_path, self.save]),
                         W.HBox([self.figure_path, self.figure]))
