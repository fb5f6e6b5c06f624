"""Sample data contributions (npe2 ``sample_data``): scikit-image images and the demo image.

Each function returns napari ``LayerData`` tuples; the arrays come from
:mod:`napari_attnreg.samples`, shared with the notebook and command line. Like the layers of
the plugin's reader, each image states where it came from in ``metadata["source_path"]``,
which saved results quote as their source image.
"""

from __future__ import annotations

from typing import Any

from napari_attnreg.samples import DATA_DIR, DEMO_IMAGE, demo_image, demo_mask, skimage_sample

LayerData = tuple[Any, dict[str, Any], str]


def _skimage(name: str, **kwargs: Any) -> list[LayerData]:
    meta = {"source_path": f"skimage.data.{name}"}
    return [(skimage_sample(name), {"name": name, "metadata": meta, **kwargs}, "image")]


def cell_sample() -> list[LayerData]:
    """Phase-contrast microscopy: scikit-image ``cell``."""
    return _skimage("cell")


def immunohistochemistry_sample() -> list[LayerData]:
    """Pathology (IHC, RGB): scikit-image ``immunohistochemistry``."""
    return _skimage("immunohistochemistry", rgb=True)


def retina_sample() -> list[LayerData]:
    """Fundus photograph (RGB): scikit-image ``retina``."""
    return _skimage("retina", rgb=True)


def demo_cells_sample() -> list[LayerData]:
    """The demo model's synthetic fluorescence field, and its decisive objects as Labels ROIs."""
    image = demo_image()
    meta = {"source_path": str(DATA_DIR / DEMO_IMAGE)}
    layers: list[LayerData] = [(image, {"name": "demo cells", "colormap": "gray",
                                        "metadata": meta}, "image")]
    try:
        mask = demo_mask()
    except (OSError, ValueError):  # the mask is optional; the image alone is still a sample
        return layers
    from skimage.measure import label

    layers.append((label(mask), {"name": "demo cells · decisive objects", "opacity": 0.4}, "labels"))
    return layers
