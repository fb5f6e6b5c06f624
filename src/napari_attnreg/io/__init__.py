"""Reading microscopy/radiology files and saving results, without any GUI toolkit.

- :mod:`.dicom`: a DICOM series (folder, file or multi-frame) as one volume with its spacing
  and stored window/level; needs the ``[dicom]`` extra (pydicom).
- :mod:`.ometiff`: an OME-TIFF with its physical pixel size and channel axis.
- :mod:`.export`: output maps as OME-TIFF plus ``provenance.json`` and the ROI table, and
  :func:`~.export.provenance`, the record every exported table and file carries.
"""
