"""napari front end: dock widget, output layers, ROI table and sample data.

Nothing here is imported by :mod:`napari_attnreg.core`; the manifest (``napari.yaml``)
points straight at the modules, so importing this package pulls in no Qt by itself.
"""
