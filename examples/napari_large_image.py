"""A large field (8192² by default) analysed tiled at native resolution in the napari widget.

    python examples/napari_large_image.py                      # → docs/images/napari_tiled.png
    python examples/napari_large_image.py --size 4096 --n-boot 50

Builds a mosaic of synthetic fluorescence fields (the demo model's domain), ticks *Tiled*,
presses Run with the bundled demo model on the CPU, and reports the progress events seen,
the token grid, the layers' extent against the image's and the wall time; then writes a
screenshot. Without a display it re-runs itself under ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from screenshot_common import ROOT, ensure_display, tidy_for_picture  # xvfb-run if needed


def mosaic(size: int):
    """``size``² uint16 field tiled from 512² synthetic fields, a few with mitotic figures."""
    import numpy as np

    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    n = -(-size // 512)
    rows = []
    for i in range(n):
        row = [make_cell_image([3, i, j], size=512, scale=4 * TRAINING_SCALE,
                               abnormal=(i * n + j) % 7 == 0, hard_negatives=False).image
               for j in range(n)]
        rows.append(np.concatenate(row, axis=1))
    return np.concatenate(rows, axis=0)[:size, :size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "napari_tiled.png"))
    args = parser.parse_args()
    ensure_display()

    import napari
    import numpy as np
    import timm  # noqa: F401  # before the viewer: Triton must load before Mesa's libLLVM
    from qtpy.QtWidgets import QApplication

    from napari_attnreg._napari.widget import AttentionWidget

    image = mosaic(args.size)
    viewer = napari.Viewer(show=True)
    viewer.window.resize(1280, 800)
    layer = viewer.add_image(image, name="mosaic")
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    widget.options.controls["device"].setCurrentText("cpu")
    widget.options.controls["n_boot"].setValue(args.n_boot)
    widget.options.controls["tiled"].setChecked(True)

    events, outcome = [], {}
    widget.run_panel.progress_bar.valueChanged.connect(
        lambda v: events.append((time.perf_counter(), v)))
    widget.run_finished.connect(lambda o: outcome.setdefault("o", o))
    t0 = time.perf_counter()
    widget.run()
    while "o" not in outcome:
        QApplication.processEvents()
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    result = widget.current_record().results[()]
    md = result.metadata
    attention = next(lyr for lyr in viewer.layers if lyr.name.endswith("attention"))
    img_extent = layer.extent.world
    att_extent = attention.extent.world
    gaps = np.diff([t for t, _ in events]) if len(events) > 1 else np.array([0.0])
    tiling = {k: v for k, v in md.items()
              if ("tile" in k or "forward" in k) and "origins" not in k}
    print(f"image {image.shape}, grid {result.grid_shape}, {tiling}")
    print(f"wall {wall:.1f} s; progress updates {len(events)}, longest gap {gaps.max():.2f} s")
    print(f"image world extent {img_extent.tolist()}\nattention extent   {att_extent.tolist()}")
    print(f"status: {widget.run_panel.status_label.text()}")
    viewer.reset_view()
    for _ in range(20):
        QApplication.processEvents()
        time.sleep(0.05)
    tidy_for_picture(viewer, widget)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    viewer.window.screenshot(args.out, canvas_only=False)
    print(f"screenshot: {args.out}")
    viewer.close()


if __name__ == "__main__":
    main()
