"""Bundled and scikit-image sample images (no GUI imports: napari and notebooks both use it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
DEMO_IMAGE = "demo_cells.tif"
DEMO_MASK = "demo_cells_mask.tif"

SKIMAGE_SAMPLES = {
    "cell": "phase-contrast microscopy (scikit-image `cell`)",
    "immunohistochemistry": "IHC pathology (scikit-image `immunohistochemistry`)",
    "retina": "fundus photograph (scikit-image `retina`)",
}


def demo_image_path() -> Path:
    """Path of the bundled synthetic microscopy image the demo model was made for."""
    path = DATA_DIR / DEMO_IMAGE
    if not path.is_file():
        raise ValueError(f"The bundled sample image is missing ({path}); reinstall napari-attnreg.")
    return path


def demo_image() -> np.ndarray:
    """The bundled synthetic 16-bit fluorescence image (an 'abnormal' field)."""
    import tifffile

    return tifffile.imread(demo_image_path())


def demo_mask() -> np.ndarray:
    """Ground-truth mask of the decisive objects in :func:`demo_image`."""
    import tifffile

    path = DATA_DIR / DEMO_MASK
    if not path.is_file():
        raise ValueError(f"The bundled sample mask is missing ({path}); reinstall napari-attnreg.")
    return tifffile.imread(path) > 0


def skimage_sample(name: str) -> np.ndarray:
    """One of scikit-image's bundled images listed in ``SKIMAGE_SAMPLES``."""
    if name not in SKIMAGE_SAMPLES:
        raise ValueError(f"Unknown sample {name!r}; choose one of {sorted(SKIMAGE_SAMPLES)}.")
    from skimage import data

    try:
        return getattr(data, name)()
    except (OSError, ImportError) as err:  # not bundled: pooch fetches it once, online
        raise ValueError(f"scikit-image's sample {name!r} could not be loaded ({err}); it is "
                         "downloaded once on first use: connect to the internet once, or use "
                         "the bundled demo image.") from None
