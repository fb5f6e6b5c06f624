"""One tissue mask per input: ``--tissue-mask FOLDER`` in a batch.

An analyst who outlined the tissue of each slide in QuPath exports one GeoJSON per image,
named after it (``case 12.geojson`` for ``case 12.svs``), or keeps painted masks the same
way. Given a folder, each input of the batch takes the mask named after it: the input's own
name or its name without the ending, with a mask file's ending, in the folder that mirrors
the input's place among the inputs (``masks/a/x.geojson`` for ``data/a/x.svs``) or at the
top of the folder. An input with no mask there, or two, fails its own row, saying which
names were looked for; the rest of the batch runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from napari_attnreg.batch.items import BatchItem

#: Endings of the files a folder of masks may hold: QuPath's GeoJSON outlines and the mask
#: images (> 0 = tissue) and NumPy arrays a tissue mask file may be.
MASK_SUFFIXES = (".geojson", ".png", ".tif", ".tiff", ".npy", ".bmp")


def is_mask_folder(value: Any) -> bool:
    """Whether a ``tissue_mask`` option names a folder (one mask per input)."""
    return isinstance(value, (str, Path)) and str(value).strip() != "" and Path(
        str(value).strip()).is_dir()


def check_mask_folder(folder: str | Path) -> None:
    """Refuse a folder of masks that holds no mask file at all (a wrong folder), before any
    image is read.

    Raises
    ------
    ValueError
        Naming the folder and the endings looked for.
    """
    folder = Path(str(folder).strip())
    if not any(p.is_file() and p.suffix.lower() in MASK_SUFFIXES for p in folder.rglob("*")):
        raise ValueError(f"tissue_mask: the folder {folder} holds no mask file "
                         f"({', '.join(MASK_SUFFIXES)}); a folder of masks holds one per "
                         "input, named after it (QuPath: 'case 12.geojson' for 'case 12.svs').")


def mask_for_item(folder: str | Path, item: BatchItem) -> Path:
    """The mask file of ``item`` in ``folder`` (see the module's rule).

    Raises
    ------
    ValueError
        No mask, or more than one, is named after the input; the message names the files
        looked for and those found.
    """
    folder = Path(str(folder).strip())
    relative = Path(item.relative)
    names = list(dict.fromkeys([relative.name, Path(relative.name).stem]))
    places = list(dict.fromkeys([folder / relative.parent, folder]))
    for place in places:
        found = sorted({p for name in names for p in _named(place, name)})
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise ValueError(f"tissue_mask: {len(found)} masks in {place} are named after "
                             f"{relative.name} ({', '.join(p.name for p in found)}); keep one.")
    looked = " or ".join(f"{name}{{{','.join(MASK_SUFFIXES)}}}" for name in names)
    where = " or ".join(str(p) for p in places)
    raise ValueError(f"tissue_mask: no mask for {relative.name} in {where} (looked for "
                     f"{looked}); add one named after the input, or run this input with "
                     "--tissue-mask auto or none.")


def _named(place: Path, name: str) -> list[Path]:
    if not place.is_dir():
        return []
    lowered = {f"{name}{suffix}".lower() for suffix in MASK_SUFFIXES}
    return [p for p in place.iterdir() if p.is_file() and p.name.lower() in lowered]
