"""Regenerate the napari screenshots of the docs at 1280x800 → docs/images/napari_*.png.

Runs each screenshot script of ``examples/`` (the bundled demo model and its samples, a
synthetic CT series, a synthetic slide) in its own process on a 1280x800 virtual display,
with napari's settings in a scratch file so the user's saved window layout plays no part,
then compresses every PNG (lossless; a 256-colour palette only where a picture would
exceed 400 KB).

Usage::

    python docs/make_napari_screenshots.py                  # all of them
    python docs/make_napari_screenshots.py napari_widget napari_tiled

Needs napari with PyQt, the demo model (package data) and, without a display, ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
SCREEN = "1280x800"
#: The script writing each picture (and the pictures it writes).
SCRIPTS: dict[str, tuple[str, ...]] = {
    "napari_screenshot.py": ("napari_widget",),
    "napari_analyst_screenshots.py": ("napari_patch_inspector", "napari_roi_features"),
    "napari_dicom_screenshot.py": ("napari_dicom_mm",),
    "napari_large_image.py": ("napari_tiled",),
    "napari_slide_screenshot.py": ("napari_slide_tissue",),
}
#: Largest file size wanted for one picture.
MAX_BYTES = 400_000


def shrink_png(path: Path) -> int:
    """Rewrite ``path`` compressed as tightly as lossless PNG allows; only a picture still
    over :data:`MAX_BYTES` gets a 256-colour palette (dithered, so colour bars do not band).
    Returns the new size in bytes."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    rgb.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        rgb.quantize(colors=256, method=Image.Quantize.FASTOCTREE,
                     dither=Image.Dither.FLOYDSTEINBERG).save(path, optimize=True)
    return path.stat().st_size


def run_script(script: str) -> None:
    """Run ``examples/<script>`` on a 1280x800 display with scratch napari settings."""
    env = {**os.environ, "NAPARI_CONFIG": str(Path(tempfile.mkdtemp()) / "settings.yaml")}
    command = [sys.executable, str(ROOT / "examples" / script)]
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        if shutil.which("xvfb-run") is None:
            raise SystemExit("No display and no xvfb-run: install xvfb or run on a desktop.")
        command = ["xvfb-run", "-a", "-s", f"-screen 0 {SCREEN}x24", *command]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=env, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="pictures to make (default: all), e.g. "
                        "napari_widget")
    args = parser.parse_args()
    known = {name for names in SCRIPTS.values() for name in names}
    unknown = set(args.names) - known
    if unknown:
        raise SystemExit(f"Unknown picture(s) {sorted(unknown)}; choose from {sorted(known)}.")
    for script, names in SCRIPTS.items():
        if args.names and not set(names) & set(args.names):
            continue
        run_script(script)
        for name in names:
            size = shrink_png(IMAGES / f"{name}.png")
            note = "" if size <= MAX_BYTES else f" (over {MAX_BYTES // 1000} KB)"
            print(f"{name}.png: {size // 1000} KB{note}")


if __name__ == "__main__":
    main()
