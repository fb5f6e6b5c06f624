"""Write the slide screenshot of the docs: a tiled run of a whole-slide image with its tissue mask.

    python examples/napari_slide_screenshot.py          # → docs/images/napari_slide_tissue.png

A synthetic Aperio-style slide (2048² at 0.25 µm, two coarser levels, 70 % glass) is written
to a temporary folder and opened in napari through the plugin's reader, in micrometres. The
dock runs it tiled (the bundled demo model), reading the slide from its file with its
automatic tissue mask (a slide's default): only the tiles on tissue are run and tested, and
the mask is shown as a Labels layer over the slide. Without a
display it re-runs itself under ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from screenshot_common import ROOT, ensure_display, run_and_wait, tidy_for_picture


def write_slide(path: Path, size: int = 2048) -> Path:
    """An Aperio-style SVS: tissue (stained, textured) in one region, glass elsewhere."""
    import tifffile
    from skimage.data import immunohistochemistry
    from skimage.transform import resize

    rng = np.random.default_rng(0)
    img = np.full((size, size, 3), 236, np.uint8)
    tissue = resize(immunohistochemistry(), (size, size), preserve_range=True).astype(np.uint8)
    yy, xx = np.mgrid[0:size, 0:size] / size
    # an irregular section: a blob covering about 30 % of the glass
    inside = ((yy - 0.38) ** 2 / 0.09 + (xx - 0.42) ** 2 / 0.12
              + 0.15 * np.sin(9 * xx) * np.cos(7 * yy)) < 1
    img[inside] = tissue[inside]
    img = np.clip(img.astype(int) + rng.integers(-3, 4, img.shape), 0, 255).astype(np.uint8)

    def description(w: int, h: int) -> str:
        return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
                "|AppMag = 40|MPP = 0.25")

    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=description(size, size),
                  photometric="rgb", metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(256, 256),
                      description=description(size // k, size // k), photometric="rgb",
                      metadata=None)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-boot", type=int, default=100)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "napari_slide_tissue.png"))
    args = parser.parse_args()
    ensure_display()

    import napari
    import timm  # noqa: F401  # before the viewer: Triton must load before Mesa's libLLVM
    from qtpy.QtWidgets import QApplication

    from napari_attnreg._napari.widget import AttentionWidget

    folder = Path(tempfile.mkdtemp())
    slide = write_slide(folder / "biopsy.svs")
    viewer = napari.Viewer(show=True)
    viewer.window.resize(1280, 800)
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    widget.options.controls["device"].setCurrentText("cpu")
    widget.options.controls["n_boot"].setValue(args.n_boot)
    widget.options.controls["tiled"].setChecked(True)  # a slide's mask is automatic
    t0 = time.perf_counter()
    run_and_wait(widget)
    result = widget.current_record().results[()]
    md = result.metadata
    print(f"slide {layer.data.shape} at {layer.scale[0]} µm; {time.perf_counter() - t0:.1f} s; "
          f"tissue tiles {md['n_tissue_tiles']} of {md['n_tiles_total']} ({md['tissue_mask']})")
    # the dock added the mask as a Labels layer, filled at 35 % opacity over the slide
    for other in viewer.layers:  # the slide, its attention on tissue and the mask
        if other.name.endswith("attention"):
            other.visible, other.opacity, other.blending = True, 0.6, "additive"
        elif other.name.endswith("regularized"):
            other.visible = False  # one map and its colour bar, not two bars side by side
    viewer.layers.selection.active = viewer.layers[f"{layer.name} tissue"]
    viewer.reset_view()
    for _ in range(30):
        QApplication.processEvents()
        time.sleep(0.05)
    tidy_for_picture(viewer, widget)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    viewer.window.screenshot(args.out, canvas_only=False)
    print(f"screenshot: {args.out}")
    viewer.close()


if __name__ == "__main__":
    main()
