"""Opening a slide stored as one large level in napari: time and peak memory.

    PYTHONPATH=src xvfb-run -a -s "-screen 0 1280x800x24" \
        python benchmarks/bench_napari_single_level.py --size 20000 --out OUT [--kind ome]

Writes (once, into ``OUT``) a single-level JPEG file of ``size``² RGB (tiles 256², 0.25 µm;
stained blobs on glass): an Aperio SVS (``--kind svs``), an OME-TIFF (``ome``, its pixel
size in the OME-XML) or a plain tiled TIFF without slide metadata (``tiff``, as tifffile,
QuPath or libvips export one); opens it as napari does (the plugin's reader where it takes
the file, else napari's own) in a 1280×800 viewer,
shows it whole, then zooms to one screen pixel per file pixel, taking a screenshot of each.
Peak resident memory is sampled every 20 ms (psutil). Prints one JSON line: seconds to open
and to show it whole, peak RSS in MB, whether the layer is multiscale and the level drawn.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

TILE = 256


KINDS = {"svs": ".svs", "ome": ".ome.tif", "tiff": ".tif"}


def write_slide(path: Path, n: int, kind: str = "svs") -> None:
    """A single-level JPEG file of ``n``² RGB (``kind``: a :data:`KINDS` key), written tile
    by tile."""
    import tifffile

    rng = np.random.default_rng(1)
    g = -(-n // TILE)
    yy, xx = np.mgrid[0:g, 0:g] / g
    tissue = np.zeros((g, g))
    for _ in range(6):
        cy, cx, r = rng.random(), rng.random(), 0.1 + 0.15 * rng.random()
        tissue = np.maximum(tissue, np.clip(1 - np.hypot(yy - cy, xx - cx) / r, 0, 1))
    glass, stain = np.array([236, 234, 238.0]), np.array([170, 70, 150.0])
    y, x = np.mgrid[0:TILE, 0:TILE]

    def tiles():
        for ty in range(g):
            for tx in range(g):
                t = tissue[ty, tx]
                pattern = 25 * np.sin((y + ty * TILE) / 9.0) * np.cos((x + tx * TILE) / 13.0)
                img = (glass * (1 - t) + stain * t)[None, None] + (t * pattern)[..., None] \
                    + rng.normal(0, 6 * t + 2, (TILE, TILE, 3))
                yield np.clip(img, 0, 255).astype(np.uint8)

    said: dict[str, object] = {"metadata": None}  # a plain TIFF: no description at all
    if kind == "svs":
        said["description"] = (f"Aperio Image Library v10.0.50\n{n}x{n} [0,0 {n}x{n}] "
                               f"({TILE}x{TILE}) JPEG/RGB Q=70|AppMag = 40|MPP = 0.25")
    elif kind == "ome":
        said["metadata"] = {"axes": "YXS", "PhysicalSizeX": 0.25, "PhysicalSizeY": 0.25}
    with tifffile.TiffWriter(path, bigtiff=True, ome=kind == "ome") as tif:
        tif.write(tiles(), shape=(n, n, 3), dtype=np.uint8, tile=(TILE, TILE),
                  compression="jpeg", compressionargs={"level": 80}, photometric="rgb",
                  **said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=20000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kind", choices=sorted(KINDS), default="svs",
                        help="the file written: Aperio SVS, OME-TIFF or plain tiled TIFF")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"single{args.size}" + ("" if args.kind == "svs" else f"_{args.kind}")
    path = args.out / f"{stem}{KINDS[args.kind]}"
    if not path.exists():
        write_slide(path, args.size, args.kind)

    import napari
    import psutil
    import timm  # noqa: F401  (torch before Qt, as the plugin's tests load it)
    from qtpy.QtWidgets import QApplication

    process, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    def settle(n: int = 20) -> None:
        for _ in range(n):
            QApplication.processEvents()
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1280, 800)
    settle(10)
    marks: dict[str, object] = {"start_mb": round(process.memory_info().rss / 2**20)}
    from napari_attnreg._napari.io import get_reader

    ours = get_reader(str(path)) is not None  # else napari's own TIFF reader, as a user gets
    t0 = time.time()
    [layer] = viewer.open(str(path), plugin="napari-attnreg" if ours else "napari")
    marks["reader"] = "napari-attnreg" if ours else "napari"
    marks["open_s"] = round(time.time() - t0, 2)
    viewer.reset_view()
    settle()
    marks["whole_s"] = round(time.time() - t0, 2)
    viewer.screenshot(str(args.out / f"{stem}_whole.png"), canvas_only=False)
    h, w = (layer.data[0] if layer.multiscale else layer.data).shape[:2]
    s = layer.scale[-1]
    viewer.scene.camera.center = (0.47 * h * s, 0.15 * w * s)
    viewer.scene.camera.zoom = 1.0 / s
    settle()
    viewer.screenshot(str(args.out / f"{stem}_fullres.png"), canvas_only=False)
    stop.set()
    marks.update(peak_mb=round(peak[0] / 2**20), multiscale=bool(layer.multiscale),
                 levels=len(layer.data) if layer.multiscale else 1,
                 level_drawn=getattr(layer, "data_level", None))
    print(json.dumps(marks))
    viewer.close()


if __name__ == "__main__":
    main()
