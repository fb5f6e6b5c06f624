"""Write the patch-inspector and ROI-features screenshots of the docs.

    python examples/napari_analyst_screenshots.py          # → docs/images/napari_patch_inspector.png
                                                            #   docs/images/napari_roi_features.png

The bundled demo model on its synthetic cells sample, whose object mask serves as the ROI
Labels layer. (a) A significant patch pinned in the dock's patch inspector, marked on the
canvas; (b) the ROI statistics in napari's own features table (Layers ▸ features table) next
to the dock's ROI table, one ROI selected in both. Without a display it re-runs itself under
``xvfb-run``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from screenshot_common import ROOT, ensure_display, run_and_wait


def _settle(app, rounds: int = 40) -> None:
    for _ in range(rounds):
        app.processEvents()
        time.sleep(0.02)


def _save(viewer, path: Path) -> None:
    from skimage.io import imsave

    path.parent.mkdir(parents=True, exist_ok=True)
    shot = viewer.screenshot(canvas_only=False, flash=False)
    imsave(path, shot, check_contrast=False)
    print(f"wrote {path} ({shot.shape[1]}x{shot.shape[0]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=str(ROOT / "docs" / "images"))
    parser.add_argument("--n-boot", type=int, default=200)
    args = parser.parse_args()
    ensure_display("1280x800")

    import numpy as np
    import torch

    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    from napari_attnreg.core.models.backbones import load_backbone

    load_backbone("demo")  # before the viewer's OpenGL context (see _napari/_compat.py)

    import napari
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QApplication, QScrollArea, QTableView

    viewer = napari.Viewer(title="napari-attnreg")
    viewer.window._qt_window.resize(1280, 800)
    image, objects = viewer.open_sample("napari-attnreg", "demo_cells")[:2]
    dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg",
                                                        "Attention Regularization")
    widget.options.controls["n_boot"].setValue(args.n_boot)
    widget.set_layer(image)
    run_and_wait(widget)
    from napari._qt.dialogs.qt_notification import NapariQtNotification

    app = QApplication.instance()
    record = widget.current_record()
    result = record.shown(())
    outputs = record.outputs
    objects.visible = False
    outputs["regularized"].visible = False
    outputs["pvalue"].visible = True  # the evidence map, titled colorbar, outline on top

    # (a) the patch inspector: the most evident significant patch, pinned and marked
    score = np.where(result.significant(), result.posterior, -1.0)
    i, j = np.unravel_index(np.argmax(score), score.shape)
    ty, tx = result.token_translate
    sy, sx = result.token_scale
    centre = image.data_to_world((ty + i * sy, tx + j * sx))
    widget.inspector.pin(centre)
    marker = viewer.add_points([centre], name="inspected patch", symbol="square",
                               size=max(sy, sx), face_color="transparent",
                               border_color="yellow", border_width=0.12)
    viewer.layers.selection.active = outputs["pvalue"]
    viewer.reset_view()
    scroll = widget.findChild(QScrollArea)
    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()
    _settle(app)
    widget.result_tabs.setCurrentWidget(widget.inspector)
    scroll.ensureWidgetVisible(widget.result_tabs, 0, 0)
    _settle(app)
    out = Path(args.out_dir)
    _save(viewer, out / "napari_patch_inspector.png")

    # (b) ROI statistics in the layer's features: napari's features table beside the dock's
    viewer.layers.remove(marker)
    objects.visible = True
    widget.roi_panel.set_layer(objects)
    _settle(app, 10)
    widget.result_tabs.setCurrentWidget(widget.roi_panel)  # the ROI table's tab
    table_dock, _table = viewer.window.add_plugin_dock_widget("napari", "Features table widget")
    qt_window = viewer.window._qt_window
    qt_window.removeDockWidget(table_dock)
    qt_window.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, table_dock)
    table_dock.show()
    viewer.layers.selection.active = objects
    widget.roi_panel.table.selectRow(widget.roi_panel.table.rowCount() - 1)
    _settle(app, 10)
    # napari's layer controls keep ~360 px of the left column, so the table gets ~180 px:
    # scrolled to its end, it shows the ROI rows rather than the background's row 0
    qt_window.resizeDocks([table_dock], [230], Qt.Orientation.Vertical)
    for view in _table.findChildren(QTableView):
        view.scrollToBottom()
    _settle(app, 10)
    scroll.ensureWidgetVisible(widget.result_tabs, 0, 0)
    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()
    _settle(app)
    _save(viewer, out / "napari_roi_features.png")
    viewer.close()


if __name__ == "__main__":
    main()
