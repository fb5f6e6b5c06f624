"""Screenshots of the real DINOv2 test article on a real photo → docs/images/real_<map>.png.

napari at 1280×800 with the dock, on scikit-image's ``coins`` photo (24 real coins), for
``map=attention``, ``rollout`` and ``cdam``; CDAM scores a concept built with 'Concept from
ROI' from two coins outlined in a Shapes layer, so its map shows which patches make the image
look like those coins (red for, blue against, white neither). Each picture shows the map's
raw values with its colour bar and the significant patches outlined. Then the notebook
explorer's canvas of the same CDAM run, rendered to PNG without a browser
(docs/images/real_notebook_cdam.png).

Usage::

    python docs/make_real_model_screenshots.py [--n-boot 50] [--out docs/images]

Needs the real test article (``python -m napari_attnreg.testing.real_article`` builds it) and
runs on the CPU in a few minutes at B = 50. Without a display it re-runs itself under
``xvfb-run``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from screenshot_common import ensure_display, run_and_wait  # noqa: E402

MAPS = ("attention", "rollout", "cdam")
#: Two coins of skimage.data.coins() (row0, col0, row1, col1; their bounding boxes after an
#: Otsu threshold): the concept's examples.
COINS = ((107, 84, 145, 122), (105, 185, 144, 227))
MODEL_NAME = "DINOv2 ViT-S/14 (real test article)"


def _settle(app, rounds: int = 40) -> None:
    for _ in range(rounds):  # let the canvas and the dock repaint
        app.processEvents()
        time.sleep(0.02)


def _wait_concept(widget, app, timeout_s: float = 600.0):
    """Press 'Concept from ROI' and wait for the concept (the dock builds it off the GUI
    thread)."""
    from qtpy.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    made = []
    widget.concept.built.connect(lambda vector: (made.append(vector), loop.quit()))
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    widget.concept.button.click()
    if not made:
        loop.exec_()
    if not made or made[0] is None:
        raise SystemExit(f"no concept: {widget.concept.label.text()}")
    return made[0]


def _show_map(viewer, widget, rois) -> None:
    """The raw map with its colour bar and the significant outline; the rest hidden."""
    record = widget.current_record()
    for kind, layer in record.outputs.items():  # the significant labels: by their outline
        layer.visible = kind == "attention"
    rois.visible = True
    viewer.layers.selection.active = record.outputs["attention"]


def napari_shots(backbone, image, out: Path, n_boot: int) -> None:
    import napari
    from napari._qt.dialogs.qt_notification import NapariQtNotification
    from qtpy.QtCore import Qt
    from qtpy.QtWidgets import QApplication
    from skimage.io import imsave

    viewer = napari.Viewer(title="napari-attnreg · real model")
    viewer.window._qt_window.resize(1280, 800)
    layer = viewer.add_image(image, name="coins")
    rois = viewer.add_shapes([[(r0, c0), (r1, c1)] for r0, c0, r1, c1 in COINS],
                             shape_type="rectangle", name="coin examples", edge_color="gold",
                             face_color="transparent", edge_width=2)
    dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg",
                                                        "Attention Regularization")
    app = QApplication.instance()
    # a narrower layer column than napari's default: the canvas gets the width (and the
    # colour bar's title fits)
    qt = viewer.window._qt_viewer
    for left in (qt.dockLayerList, qt.dockLayerControls):
        left.setMaximumWidth(270)
    viewer.window._qt_window.resizeDocks([dock], [440], Qt.Orientation.Horizontal)
    widget.set_model(backbone, name=MODEL_NAME)
    widget.options.controls["device"].setCurrentText("cpu")
    widget.options.controls["n_boot"].setValue(n_boot)
    widget.set_layer(layer)
    for name in MAPS:
        widget.options.set("map", name)
        if name == "cdam":
            viewer.layers.selection.active = rois
            _wait_concept(widget, app)
            widget.options.advanced.expand(animate=False)  # Map, Target and the concept
        run_and_wait(widget)
        _show_map(viewer, widget, rois)
        viewer.reset_view()
        if name == "cdam":  # the dock scrolled to the concept it scores
            _scroll_to(widget, widget.concept.label)
        for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
            toast.close()
        _settle(app)
        shot = viewer.screenshot(canvas_only=False, flash=False)
        path = out / f"real_{name}.png"
        imsave(path, shot, check_contrast=False)
        print(f"wrote {path} ({shot.shape[1]}x{shot.shape[0]}): "
              f"{widget.run_panel.status_label.text()[:200]}")
    viewer.close()


def _scroll_to(widget, target) -> None:
    from qtpy.QtWidgets import QScrollArea

    for area in widget.findChildren(QScrollArea):
        area.ensureWidgetVisible(target, 0, 12)


def notebook_shot(backbone, image, out: Path, n_boot: int) -> None:
    """The explorer's canvas of a CDAM run on the concept, with its colour bar, as PNG."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    from napari_attnreg.notebook import AttentionExplorer, render

    explorer = AttentionExplorer(image, backbone, n_boot=n_boot, device="cpu", view="image",
                                 map="cdam", overlay="attention", opacity=0.8,
                                 name="skimage coins")
    for r0, c0, r1, c1 in COINS:
        explorer.add_roi(rectangle=(r0, c0, r1, c1))
    if explorer.concept_panel.build() is None:
        raise SystemExit(f"no concept: {explorer.concept_panel.status.value}")
    if explorer.run(wait=True) is None:
        raise SystemExit(f"notebook run failed: {explorer.status}")
    canvas = np.repeat(np.repeat(explorer.rendered, 2, axis=0), 2, axis=1)  # a readable size
    panel = explorer.display_panel
    lut = panel.lut(explorer.result)
    bar = render.colorbar(lut, width=canvas.shape[1] // 2, height=14)
    strip = np.full((44, canvas.shape[1], 3), 255, np.uint8)
    left = (canvas.shape[1] - bar.shape[1]) // 2
    strip[6:20, left:left + bar.shape[1]] = bar
    picture = Image.fromarray(np.concatenate([canvas, strip]))
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=13)
    top = canvas.shape[0]
    draw.text((left - 8, top + 5), panel.colorbar_lo.value, fill="black", anchor="ra", font=font)
    draw.text((left + bar.shape[1] + 8, top + 5), panel.colorbar_hi.value, fill="black",
              font=font)
    draw.text((canvas.shape[1] // 2, top + 24), f"{panel.colorbar_label.value} · "
              f"{explorer.concept_panel.status.value}", fill="black", anchor="ma", font=font)
    path = out / "real_notebook_cdam.png"
    picture.save(path)
    print(f"wrote {path} ({picture.width}x{picture.height}): {explorer.status}")
    explorer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    parser.add_argument("--n-boot", type=int, default=50)
    parser.add_argument("--skip-napari", action="store_true", help="the notebook render only")
    parser.add_argument("--skip-notebook", action="store_true", help="the napari ones only")
    args = parser.parse_args()
    ensure_display()

    import torch
    from skimage import data

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    torch.manual_seed(0)
    # the model before the viewer opens its OpenGL context (see _napari/_compat.py)
    from napari_attnreg.testing import real_article

    backbone = real_article.load(device="cpu")
    image = data.coins()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.skip_napari:
        napari_shots(backbone, image, out, args.n_boot)
    if not args.skip_notebook:
        notebook_shot(backbone, image, out, args.n_boot)


if __name__ == "__main__":
    main()
