"""Write the README screenshot: the viewer with the dock widget, overlays and the ROI table.

    python examples/napari_screenshot.py                    # → docs/images/napari_widget.png
    python examples/napari_screenshot.py --out shot.png --n-boot 200

Uses the bundled demo model and its synthetic sample (with the decisive objects as Labels
ROIs). If the demo model is not installed it says so and falls back to scikit-image's
``cell`` with a small random-init ViT, which shows the layout but not meaningful attention.
Without a display it re-runs itself under ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from screenshot_common import ROOT, ensure_display, run_and_wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "napari_widget.png"))
    parser.add_argument("--n-boot", type=int, default=None, help="default: the widget's default")
    parser.add_argument("--size", default="1280x800", help="window size WxH")
    args = parser.parse_args()
    ensure_display()

    import numpy as np
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    # load the model before the viewer opens its OpenGL context (see _napari/_compat.py)
    from napari_attnreg.core.models.backbones import BackboneError, load_backbone

    try:
        backbone = load_backbone("demo")
        demo = True
    except BackboneError as err:
        print(f"demo model unavailable ({err}); falling back to a random-init ViT", file=sys.stderr)
        import timm

        torch.manual_seed(0)
        vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=4)
        backbone = load_backbone(vit)
        demo = False

    import napari
    from qtpy.QtWidgets import QApplication, QScrollArea

    viewer = napari.Viewer(title="napari-attnreg")
    width, height = (int(v) for v in args.size.split("x"))
    viewer.window._qt_window.resize(width, height)
    if demo:
        layers = viewer.open_sample("napari-attnreg", "demo_cells")
        image = layers[0]
        roi = layers[1] if len(layers) > 1 else None
    else:
        image = viewer.open_sample("napari-attnreg", "cell")[0]
        roi = viewer.add_shapes(
            [np.array([[150, 120], [330, 300]]), np.array([[420, 330], [600, 520]])],
            shape_type="rectangle", name="ROIs", edge_color="cyan", face_color="transparent",
            edge_width=4)
    dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg",
                                                        "Attention Regularization")
    if not demo:
        widget.set_model(backbone, name="random ViT (demo model missing)")
    widget.options.controls["device"].setCurrentText("auto")
    if args.n_boot:
        widget.options.controls["n_boot"].setValue(args.n_boot)
    widget.set_layer(image)

    run_and_wait(widget)
    from napari_attnreg._napari.layers import layer_name

    name, preset = image.name, widget.current_record().preset
    viewer.layers[layer_name(name, "attention", preset)].visible = False
    # the evidence map (−log10 p, above the null under the default preset) with its colorbar,
    # and the significant patches outlined on top of it
    viewer.layers[layer_name(name, "regularized", preset)].visible = False
    evidence = viewer.layers[layer_name(name, "pvalue", preset)]
    evidence.visible = True
    if roi is not None:
        widget.roi_panel.set_layer(roi)
        roi.visible = True
        if hasattr(roi, "contour"):  # ground-truth objects: a gold outline, apart from the cyan one
            from napari.utils.colormaps import DirectLabelColormap

            roi.colormap = DirectLabelColormap(color_dict={None: "gold", 0: "transparent"})
            roi.contour = 2
            roi.opacity = 0.9
    viewer.layers.selection.active = evidence
    viewer.reset_view()
    from napari._qt.dialogs.qt_notification import NapariQtNotification

    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()  # start-up notices (e.g. about the Qt backend) are not part of the picture
    app = QApplication.instance()
    for _ in range(30):  # let the canvas and the dock settle
        app.processEvents()
        time.sleep(0.02)
    # the whole status (count, what "significant" means, diagnostics) in view in the dock
    widget.findChild(QScrollArea).ensureWidgetVisible(widget.run_panel.status_label, 0, 0)
    for _ in range(5):
        app.processEvents()
        time.sleep(0.02)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = viewer.screenshot(canvas_only=False, flash=False)
    from skimage.io import imsave

    imsave(out, shot, check_contrast=False)
    print(f"wrote {out} ({shot.shape[1]}x{shot.shape[0]}); {widget.run_panel.status_label.text()}")
    viewer.close()


if __name__ == "__main__":
    main()
