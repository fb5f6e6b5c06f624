"""Reading microscopy/radiology files and saving results, without any GUI toolkit.

- :func:`read_stack`, :func:`read_image`: any image file (TIFF, OME-Zarr, DICOM, PNG, ...)
  as a :class:`~napari_attnreg.core.run.planes.PlaneStack` or its pixels, with the layout
  the file states; what the batch and the command line read.
- :func:`read_dicom`: a DICOM series (folder, file or multi-frame) as one volume with its
  spacing and stored window/level; needs the ``[dicom]`` extra (pydicom, imported on use).
- :func:`read_ome_tiff`: an OME-TIFF with its physical pixel size and channel axis;
  :func:`read_ome_tiff_layers` also says the layer type, and gives a layer this package saved
  back as it was (Labels stay Labels; name, scale, translate and units as saved).
- :func:`save_outputs`: output maps as OME-TIFF with their placement (physical size in the
  layer's unit, and the napari placement in the OME-XML) plus ``provenance.json`` and the ROI
  table; :func:`provenance`, the record every exported table and file carries, and
  :func:`saved_provenance`, the one a save states for its layers.

Example
-------
>>> from napari_attnreg.io import provenance, read_dicom             # doctest: +SKIP
>>> (volume, kwargs), = read_dicom("CT_head/")                      # doctest: +SKIP
"""

from napari_attnreg.io.dicom import read_dicom
from napari_attnreg.io.export import (
    provenance,
    save_layer,
    save_outputs,
    saved_provenance,
    write_table_csv,
)
from napari_attnreg.io.ometiff import read_ome_tiff, read_ome_tiff_layers
from napari_attnreg.io.readers import read_image, read_stack

__all__ = ["provenance", "read_dicom", "read_image", "read_ome_tiff", "read_ome_tiff_layers",
           "read_stack", "save_layer", "save_outputs", "saved_provenance", "write_table_csv"]
