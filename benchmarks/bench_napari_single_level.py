"""Opening a slide stored as one large level in napari: time, peak memory, main-thread stalls.

    PYTHONPATH=src xvfb-run -a -s "-screen 0 1280x800x24" \
        python benchmarks/bench_napari_single_level.py --size 20000 --out OUT [--kind ome]

Writes (once, into ``OUT``) a single-level JPEG file of ``size``² RGB (tiles 256², 0.25 µm;
stained blobs on glass): an Aperio SVS (``--kind svs``), an OME-TIFF (``ome``, its pixel
size in the OME-XML) or a plain tiled TIFF without slide metadata (``tiff``, as tifffile,
QuPath or libvips export one); opens it as napari does (the plugin's reader where it takes
the file, else napari's own) in a 1280×800 viewer, shows it whole, waits until the whole
view's level is complete (the overview: every block of the level drawn read), then zooms to
one screen pixel per file pixel, taking a screenshot while the overview fills, once it is
complete and at full resolution. Peak resident memory is sampled every 20 ms (psutil); a
10 ms ``QTimer`` on napari's main thread records its longest stall (the longest gap between
two ticks: the viewer answers nothing in between). Prints one JSON line: seconds until
``viewer.open`` returns (``open_s``), until the whole view was first drawn (``shown_s``) and
until its overview is complete (``overview_s``), the longest main-thread stall in ms
(``max_stall_ms``, and ``fill_stall_ms`` while the overview fills), peak RSS in MB, whether
the layer is multiscale and the level drawn. napari's one-time set-up of its first image layer
(its units registry) is done before the clock starts.

With ``--no-viewer`` no napari is started: the slide is opened as the reader opens it and
every block of its coarsest display level is computed by a fill's worker threads, as for
the overview in a viewer; prints the seconds (``fill_s``), peak RSS in MB and a checksum of
the level. ``--through-store`` reads the blocks' pixels through the zarr store, as before
the tiles were decoded directly (for a before/after on the same machine).
"""

from __future__ import annotations

import argparse
import json
import math
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


def fill_without_viewer(path: Path, through_store: bool) -> dict[str, object]:
    """Compute every block of the coarsest display level of ``path`` off the main thread."""
    import resource

    from napari_attnreg._napari.slide_pyramid import BackgroundFill, display_levels
    from napari_attnreg.io.ometiff import image_view
    from napari_attnreg.io.slides import open_slide

    # as napari's reader reads it: an OME-TIFF's image view, a slide's level
    source = image_view(path) if path.name.endswith(".ome.tif") else open_slide(str(path)).array
    levels = display_levels(source)
    for level in levels:
        if through_store:
            level.tiles = None
    coarse = levels[-1]
    keys = [(by, bx) for by in range(-(-coarse.shape[0] // coarse.block))
            for bx in range(-(-coarse.shape[1] // coarse.block))]
    fill = BackgroundFill(path.name)
    t0 = time.perf_counter()
    fill.request(coarse, keys)
    while fill.busy:
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    fill.stop(5.0)
    _, _, errors = fill.news()
    whole = coarse.read(...)
    return {"read": "through the zarr store" if through_store else
            "tiles" if coarse.tiles is not None else "through the array",
            "blocks": len(keys), "factor": coarse.factor, "fill_s": round(seconds, 2),
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "checksum": int(whole.sum(dtype=np.int64)), "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=20000)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kind", choices=sorted(KINDS), default="svs",
                        help="the file written: Aperio SVS, OME-TIFF or plain tiled TIFF")
    parser.add_argument("--no-viewer", action="store_true",
                        help="only compute the coarsest display level, without napari")
    parser.add_argument("--through-store", action="store_true",
                        help="with --no-viewer: read the pixels through the zarr store")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"single{args.size}" + ("" if args.kind == "svs" else f"_{args.kind}")
    path = args.out / f"{stem}{KINDS[args.kind]}"
    if not path.exists():
        write_slide(path, args.size, args.kind)
    if args.no_viewer:
        print(json.dumps(fill_without_viewer(path, args.through_store)))
        return

    import napari
    import psutil
    import timm  # noqa: F401  (torch before Qt, as the plugin's tests load it)
    from qtpy.QtCore import QEventLoop, QTimer

    process, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    def settle(ms: int = 1000) -> None:
        # the event loop runs (the heartbeat ticks) while we wait, as in a user's session
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec_()

    ticks: list[float] = []
    heartbeat = QTimer()
    heartbeat.setInterval(10)
    heartbeat.timeout.connect(lambda: ticks.append(time.perf_counter()))

    def longest_stall(t0: float, t1: float) -> float:
        # gaps between ticks, counting from t0 and to t1 (a stall at either end counts)
        during = [t0, *(t for t in ticks if t0 <= t <= t1), t1]
        return round(1000 * max(np.diff(during)), 1)

    threading.Thread(target=sample, daemon=True).start()
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1280, 800)
    heartbeat.start()
    settle(500)
    marks: dict[str, object] = {"start_mb": round(process.memory_info().rss / 2**20)}
    from napari_attnreg._napari.io import get_reader

    ours = get_reader(str(path)) is not None  # else napari's own TIFF reader, as a user gets
    # napari's first image layer in micrometres loads its units registry and layer modules
    # (1-2 s on the main thread, whatever the file): paid here so the numbers are the slide's
    warm = viewer.add_image(np.zeros((2, 2, 3), np.uint8), rgb=True, scale=(0.25, 0.25),
                            units=("µm", "µm"))
    viewer.layers.remove(warm)
    settle(200)
    t0 = time.perf_counter()
    [layer] = viewer.open(str(path), plugin="napari-attnreg" if ours else "napari")
    marks["reader"] = "napari-attnreg" if ours else "napari"
    marks["open_s"] = round(time.perf_counter() - t0, 2)
    viewer.reset_view()
    settle(50)
    marks["shown_s"] = round(time.perf_counter() - t0, 2)
    settle(450)  # what the analyst sees half a second in
    viewer.screenshot(str(args.out / f"{stem}_filling.png"), canvas_only=False)
    t_fill = time.perf_counter()
    level = layer.data[layer.data_level] if layer.multiscale else None
    wanted = math.prod(-(-n // b) for n, b in zip(level.shape[:2], level.chunks[:2],
                                                   strict=False)) \
        if hasattr(level, "blocks_held") else 0
    while wanted and level.blocks_held < wanted and time.perf_counter() - t0 < 600:
        settle(20)
    settle(200)  # the last refresh drawn
    marks["overview_s"] = round(time.perf_counter() - t0, 2)
    marks["fill_stall_ms"] = longest_stall(t_fill, time.perf_counter())
    viewer.screenshot(str(args.out / f"{stem}_whole.png"), canvas_only=False)
    h, w = (layer.data[0] if layer.multiscale else layer.data).shape[:2]
    s = layer.scale[-1]
    viewer.scene.camera.center = (0.47 * h * s, 0.15 * w * s)
    viewer.scene.camera.zoom = 1.0 / s
    settle()
    viewer.screenshot(str(args.out / f"{stem}_fullres.png"), canvas_only=False)
    stop.set()
    marks["max_stall_ms"] = longest_stall(t0, time.perf_counter())
    marks.update(peak_mb=round(peak[0] / 2**20), multiscale=bool(layer.multiscale),
                 levels=len(layer.data) if layer.multiscale else 1,
                 level_drawn=getattr(layer, "data_level", None))
    print(json.dumps(marks))
    heartbeat.stop()
    viewer.close()


if __name__ == "__main__":
    main()
