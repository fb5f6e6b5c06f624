"""Peak memory and time of a whole-slide run, as a user runs it (``attnreg run --tiled``).

    PYTHONPATH=src python benchmarks/bench_slide_memory.py --size 50000 --n-boot 100
    PYTHONPATH=src python benchmarks/bench_slide_memory.py --size 20000 --json out.json
    PYTHONPATH=src python benchmarks/bench_slide_memory.py --size 12000 --levels 2 -- --mpp 16
    PYTHONPATH=src python benchmarks/bench_slide_memory.py --size 50000 --user-mask

Writes a synthetic pyramidal TIFF to a temporary folder (``--tmp``, default the system's):
``size``² RGB, JPEG tiles of 512², levels 1, 1/2, 1/4, … down to about 2048², its pixel size
in the resolution tags; white glass with a few stained blobs (``--tissue`` of the area). Then
runs ``attnreg run FILE --tiled`` (demo model, the automatic tissue mask, the CLI's default
outputs; ``--user-mask``: a mask file of the blobs at full resolution instead) in a child
process and reports:

* the child's peak RSS, from ``getrusage`` and from sampling it every 0.1 s (aim ≤ 4 GB),
* wall time of the command, and the run's own timings (prepare, observed tiles with their
  reading overlapped, nulls, statistics) with the rest (start-up, saving, the figure),
* the time to read and decode the tissue tiles alone (the reading share, measured apart:
  in the run it overlaps the model in a reader thread).

The slide is written tile by tile from a function of the pixel position, so writing it never
holds more than one tile row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

TILE = 512
#: (centre y, centre x, radius) of the blobs as fractions of the side; scaled to ``--tissue``.
BLOBS = ((0.25, 0.3, 1.0), (0.6, 0.7, 0.8), (0.75, 0.2, 0.6), (0.35, 0.8, 0.5))
GLASS = 236


def blob_radii(tissue: float) -> np.ndarray:
    """Radii (fractions of the side) giving about ``tissue`` of the area to the blobs."""
    rel = np.array([b[2] for b in BLOBS])
    scale = math.sqrt(tissue / (math.pi * float(np.sum(rel**2))))
    return rel * scale


def tile_inside(ty: int, tx: int, side: int, radii: np.ndarray) -> np.ndarray:
    """``(512, 512)`` bool: the blobs' pixels of the tile at ``(ty, tx)`` of a level ``side``
    pixels wide (the slide's tissue; the user's mask of ``--user-mask``)."""
    y0, x0 = ty * TILE, tx * TILE
    yy = (y0 + np.arange(TILE, dtype=np.float32)[:, None]) / side
    xx = (x0 + np.arange(TILE, dtype=np.float32)[None, :]) / side
    inside = np.zeros((TILE, TILE), dtype=bool)
    for (cy, cx, _), r in zip(BLOBS, radii, strict=True):
        reach_max = 1.15 * r + 2 * TILE / side
        if abs(y0 / side + TILE / side / 2 - cy) > reach_max or \
                abs(x0 / side + TILE / side / 2 - cx) > reach_max:
            continue  # far from this blob: glass (most tiles of a slide)
        # a lobed outline, so the mask's edge cuts tiles at every angle
        angle = np.arctan2(yy - cy, xx - cx)
        reach = r * (1 + 0.15 * np.sin(5 * angle))
        inside |= (yy - cy) ** 2 + (xx - cx) ** 2 <= reach**2
    return inside


def tile_pixels(ty: int, tx: int, side: int, radii: np.ndarray, rng: np.random.Generator,
                ) -> np.ndarray:
    """One 512² RGB tile at tile position ``(ty, tx)`` of a level ``side`` pixels wide."""
    y0, x0 = ty * TILE, tx * TILE
    inside = tile_inside(ty, tx, side, radii)
    out = np.full((TILE, TILE, 3), GLASS, np.uint8)
    if inside.any():
        n = int(inside.sum())
        stain = rng.random((n, 3), dtype=np.float32) * 90 + np.array([130, 40, 120], np.float32)
        # dark nuclei-like dots (a coarse random field), so the model sees structure
        dots = rng.random(n, dtype=np.float32) < 0.04
        stain[dots] *= 0.45
        out[inside] = stain.clip(0, 255).astype(np.uint8)
    if y0 + TILE > side or x0 + TILE > side:  # padding beyond the level's edge
        out[max(0, side - y0):, :] = 0
        out[:, max(0, side - x0):] = 0
    return out


def write_user_mask(path: Path, size: int, tissue: float) -> None:
    """The blobs as a user's tissue mask at the slide's full resolution: a ``size``² uint8
    TIFF (255 tissue), 512² deflate tiles, as a pathologist's tool exports one."""
    import tifffile

    radii = blob_radii(tissue)
    n = -(-size // TILE)
    tiles = (tile_inside(ty, tx, size, radii).astype(np.uint8) * 255
             for ty in range(n) for tx in range(n))
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        tif.write(tiles, shape=(size, size), dtype=np.uint8, tile=(TILE, TILE),
                  compression="zlib", metadata=None)


def level_tiles(side: int, radii: np.ndarray, seed: int):
    rng = np.random.default_rng(seed)
    n = -(-side // TILE)
    for ty in range(n):
        for tx in range(n):
            yield tile_pixels(ty, tx, side, radii, rng)


def write_slide(path: Path, size: int, tissue: float, mpp: float = 0.5,
                levels: int | None = None) -> list[int]:
    """The pyramidal TIFF (``levels`` levels, default down to about 2048²); returns the
    level sides."""
    import tifffile

    radii = blob_radii(tissue)
    sides = [size]
    while sides[-1] > 2048 if levels is None else len(sides) < levels:
        sides.append(sides[-1] // 2)
    per_cm = 1e4 / mpp
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for k, side in enumerate(sides):
            factor = size / side
            options = dict(shape=(side, side, 3), dtype=np.uint8, tile=(TILE, TILE),
                           photometric="rgb", compression="jpeg", metadata=None,
                           resolution=(per_cm / factor, per_cm / factor),
                           resolutionunit="CENTIMETER")
            if k == 0:
                options["subifds"] = len(sides) - 1
            else:
                options["subfiletype"] = 1
            tif.write(level_tiles(side, radii, seed=k), **options)
    return sides


class RssSampler:
    """The largest RSS of a process seen every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        import psutil

        self.process, self.interval, self.peak = psutil.Process(pid), interval, 0
        self.trace: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                rss = self.process.memory_info().rss
            except Exception:  # noqa: BLE001 - the child has ended
                return
            self.peak = max(self.peak, rss)
            self.trace.append((time.perf_counter() - t0, rss))
            time.sleep(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def read_share(path: Path, n_boot: int, mask: Path | None = None) -> dict:
    """Seconds to read and decode the tissue tiles the run reads (no model)."""
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.tiled_engine import prepare_tiled
    from napari_attnreg.io.slides import open_slide

    backbone = load_backbone("demo")
    t0 = time.perf_counter()
    config = RunConfig(tiled=True, n_boot=n_boot,
                       **({} if mask is None else {"tissue_mask": str(mask)}))
    tiled = prepare_tiled(open_slide(path), backbone, config)
    prepare = time.perf_counter() - t0
    order = np.flatnonzero(tiled.tissue.tiles)
    t0 = time.perf_counter()
    for index in order:
        tiled.read_raw(int(index))
    return {"prepare_s": prepare, "read_tissue_tiles_s": time.perf_counter() - t0,
            "n_tissue_tiles": int(order.size), "n_tiles_total": int(tiled.layout.n_tiles)}


def run_cli(path: Path, out: Path, n_boot: int, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "napari_attnreg.cli", "run", str(path), "--tiled",
               "--n-boot", str(n_boot), "--device", "cpu", "--quiet", "--out", str(out), *extra]
    t0 = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = RssSampler(child.pid)
    text, _ = child.communicate()
    wall = time.perf_counter() - t0
    sampler.stop()
    if child.returncode:
        raise RuntimeError(f"attnreg run failed ({child.returncode}):\n{text}")
    peak_t = max(sampler.trace, key=lambda s: s[1])[0] if sampler.trace else float("nan")
    return {"command": " ".join(command[1:]), "wall_s": wall,
            "peak_rss_gb_getrusage": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            / 1024**2, "peak_rss_gb_sampled": sampler.peak / 1024**3,
            "peak_at_s": peak_t, "rss_trace": sampler.trace[:: max(1, len(sampler.trace) // 200)]}


def saved_metadata(npz: Path) -> dict:
    """The metadata of a saved result, read from its own member (not the whole result)."""
    with np.load(npz, allow_pickle=False) as archive:
        return json.loads(archive["metadata_json"].tobytes().decode())["metadata"]


def saved_members(npz: Path) -> dict[str, float]:
    """MB of each array in the saved result, uncompressed (what loading it holds)."""
    import zipfile

    with zipfile.ZipFile(npz) as archive:
        return {i.filename: round(i.file_size / 1e6, 1) for i in archive.infolist()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=50000)
    ap.add_argument("--tissue", type=float, default=0.03, help="tissue share of the slide")
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--tmp", default=None, help="folder for the slide and the outputs")
    ap.add_argument("--keep", action="store_true", help="keep the slide (reused when present)")
    ap.add_argument("--levels", type=int, default=None,
                    help="pyramid levels (at least 2; default down to about 2048²): few levels "
                         "and a coarse --mpp make each tile read a large region")
    ap.add_argument("--user-mask", action="store_true",
                    help="run with a user's tissue mask file at full resolution (size² uint8 "
                         "TIFF) instead of the automatic mask")
    ap.add_argument("--json", default=None)
    ap.add_argument("cli_args", nargs="*", help="more `attnreg run` options (after --)")
    args = ap.parse_args(argv)

    tmp = Path(args.tmp or tempfile.gettempdir()) / f"attnreg_slide_{args.size}"
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"slide_{args.size}_{args.tissue:g}_{args.levels or 'all'}.tif"
    out: dict = {"size": args.size, "tissue": args.tissue, "n_boot": args.n_boot,
                 "cpus": os.cpu_count()}
    if not path.exists():
        t0 = time.perf_counter()
        out["levels"] = write_slide(path, args.size, args.tissue, levels=args.levels)
        out["write_s"] = time.perf_counter() - t0
        print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB, levels {out['levels']}) "
              f"in {out['write_s']:.0f} s", flush=True)
    mask = tmp / f"mask_{args.size}_{args.tissue:g}.tif" if args.user_mask else None
    if mask is not None and not mask.exists():
        t0 = time.perf_counter()
        write_user_mask(mask, args.size, args.tissue)
        print(f"wrote the mask {mask} ({mask.stat().st_size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    extra = [*args.cli_args, *(["--tissue-mask", str(mask)] if mask is not None else [])]
    out["user_mask"] = None if mask is None else mask.name
    try:
        out.update(read_share(path, args.n_boot, mask))
        print(f"{out['n_tissue_tiles']} of {out['n_tiles_total']} tiles are tissue; reading "
              f"them alone: {out['read_tissue_tiles_s']:.1f} s", flush=True)
        result_dir = tmp / "out"
        out.update(run_cli(path, result_dir, args.n_boot, extra))
        print(f"attnreg run: {out['wall_s']:.1f} s, peak RSS {out['peak_rss_gb_sampled']:.2f} GB "
              "sampled", flush=True)
        md = saved_metadata(next(result_dir.glob("*.attnreg.npz")))
        out["timings"] = md["timings"]
        out["saved_members_mb"] = saved_members(next(result_dir.glob("*.attnreg.npz")))
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
            if mask is not None:
                mask.unlink(missing_ok=True)
    t = out["timings"]
    inside = sum(t.get(k, 0.0) for k in ("prepare_s", "observed_s", "nulls_s", "statistics_s"))
    print(f"attnreg run --tiled, {args.size}² slide, {out['n_tissue_tiles']} tissue tiles, "
          f"B = {args.n_boot}: {out['wall_s']:.1f} s")
    print(f"  prepare (mask, layout) {t.get('prepare_s', 0):.1f} s, observed tiles (reading "
          f"overlapped) {t.get('observed_s', 0):.1f} s, nulls {t.get('nulls_s', 0):.1f} s, "
          f"statistics {t.get('statistics_s', 0):.1f} s, outside the run (start-up, saving, "
          f"figure) {out['wall_s'] - inside:.1f} s")
    print(f"  run timings {json.dumps({k: round(v, 2) for k, v in t.items()})}")
    print(f"  reading the tissue tiles alone {out['read_tissue_tiles_s']:.1f} s")
    print(f"  peak RSS {out['peak_rss_gb_getrusage']:.2f} GB (getrusage), "
          f"{out['peak_rss_gb_sampled']:.2f} GB sampled, at {out['peak_at_s']:.0f} s "
          f"(aim <= 4 GB)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
