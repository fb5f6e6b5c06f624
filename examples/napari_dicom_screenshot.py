"""Screenshot: a CT series opened from DICOM in millimetres, with the output layers in mm.

    python examples/napari_dicom_screenshot.py            # → docs/images/napari_dicom_mm.png
    python examples/napari_dicom_screenshot.py --preset stepdown --show pvalue --out shot.png

Writes a small CT series (the bundled phantom abdomen, 0.78 mm pixels, 2.5 mm slices) as
DICOM with pydicom, opens it with the plugin's reader (scale and units in mm), runs the dock
on the middle slice and takes the picture (scale bar in mm: the outputs carry the CT's units).
Then it saves the results, closes the viewer, reopens the CT and the saved folder in a new
one and prints how far the reopened maps moved (0 mm). Without a display it re-runs itself
under ``xvfb-run``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from screenshot_common import ROOT, ensure_display, run_and_wait

PIXEL_MM, SLICE_MM, SLICES = 0.78, 2.5, 5


def write_ct_series(folder: Path) -> Path:
    """The phantom slice (stored values HU + 1024) as a DICOM CT series of SLICES slices."""
    import numpy as np
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    from napari_attnreg.testing.phantoms import phantom_sample

    stored = phantom_sample().image
    folder.mkdir(parents=True, exist_ok=True)
    series, study = generate_uid(), generate_uid()
    for k in range(SLICES):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"  # CT Image Storage
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        path = folder / f"ct_{k:03d}.dcm"
        ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID = meta.MediaStorageSOPClassUID
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.Modality, ds.SeriesInstanceUID, ds.StudyInstanceUID = "CT", series, study
        ds.SeriesDescription, ds.SeriesNumber, ds.InstanceNumber = "phantom abdomen", 1, k + 1
        ds.ImagePositionPatient = [-200.0, -200.0, SLICE_MM * k]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.PixelSpacing = [PIXEL_MM, PIXEL_MM]
        ds.SliceThickness = SLICE_MM
        ds.RescaleSlope, ds.RescaleIntercept = 1, -1024
        ds.WindowCenter, ds.WindowWidth = 40, 400  # soft-tissue window
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = stored.shape
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.PixelData = np.ascontiguousarray(stored, dtype=np.uint16).tobytes()
        ds.save_as(path, enforce_file_format=True)
    return folder


def _corners(layer, plane):
    """World coordinates (mm) of the first and last token-grid cell corners of one plane."""
    rows, cols = layer.data.shape[-2:]
    return [layer.data_to_world((*plane, r, c)) for r, c in ((-0.5, -0.5),
                                                             (rows - 0.5, cols - 0.5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "napari_dicom_mm.png"))
    parser.add_argument("--model", default="phantom", choices=("phantom", "demo"),
                        help="bundled model (phantom: trained on these CT-like slices)")
    parser.add_argument("--n-boot", type=int, default=50)
    parser.add_argument("--show", default="attention", choices=("attention", "pvalue",
                                                                  "posterior", "regularized"),
                        help="the map shown under the significant outline")
    parser.add_argument("--preset", default="directional",
                        choices=("stepdown", "directional", "paper"), help="statistics preset")
    parser.add_argument("--size", default="1280x800", help="window size WxH")
    args = parser.parse_args()
    ensure_display("1280x800")

    import numpy as np
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    from napari_attnreg.core.models.backbones import load_backbone

    backbone = load_backbone(args.model)  # before the viewer's OpenGL context (_napari/_compat)

    import napari
    from qtpy.QtWidgets import QApplication

    from napari_attnreg._napari.layers import KINDS, layer_name
    from napari_attnreg._napari.results_io import save_results

    work = Path(tempfile.mkdtemp(prefix="attnreg_dicom_"))
    folder = write_ct_series(work / "ct")
    viewer = napari.Viewer(title="napari-attnreg · DICOM in mm")
    width, height = (int(v) for v in args.size.split("x"))
    viewer.window._qt_window.resize(width, height)
    ct, = viewer.open(str(folder), plugin="napari-attnreg")
    dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg",
                                                        "Attention Regularization")
    widget.set_model(backbone, name=args.model)
    widget.options.controls["n_boot"].setValue(args.n_boot)
    presets = widget.options.controls["preset"]
    presets.setCurrentIndex(presets.findData(args.preset))
    widget.set_layer(ct)
    viewer.dims.set_point(0, ct.data_to_world((SLICES // 2, 0, 0))[0])

    run_and_wait(widget)
    record = widget.current_record()
    names = {kind: layer_name(ct.name, kind, record.preset) for kind in KINDS}

    for kind in ("attention", "pvalue", "posterior", "regularized"):
        viewer.layers[names[kind]].visible = kind == args.show
    viewer.layers.selection.active = viewer.layers[names[args.show]]
    viewer.scale_bar.visible = True
    viewer.scale_bar.box = True
    viewer.scene.overlays.axes.visible = True
    viewer.reset_view()
    from napari._qt.dialogs.qt_notification import NapariQtNotification

    app = QApplication.instance()
    for _ in range(30):  # let the canvas and the dock settle
        app.processEvents()
        time.sleep(0.02)
    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()  # start-up notices are not part of the picture
    app.processEvents()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = viewer.screenshot(canvas_only=False, flash=False)
    from skimage.io import imsave

    imsave(out, shot, check_contrast=False)
    units = {str(u) for layer in viewer.layers for u in layer.units}
    print(f"wrote {out} ({shot.shape[1]}x{shot.shape[0]}); units in the viewer: {units}")

    # save, close, reopen the saved folder in a new viewer: the maps lie where they were
    plane = (SLICES // 2,)
    corners = {name: _corners(viewer.layers[name], plane) for name in names.values()}
    written = save_results(viewer, record, [], work / "saved" / "ct_attnreg.ome.tif")
    viewer.close()
    again = napari.Viewer(title="napari-attnreg · reopened")
    again.open(str(folder), plugin="napari-attnreg")
    reopened = again.open(str(Path(written[0]).parent), plugin="napari-attnreg")
    worst = max(float(np.abs(np.subtract(_corners(layer, plane), corners[layer.name])).max())
                for layer in reopened if layer.name in corners)  # the maps, not the image
    print(f"reopened {len(reopened)} layers ({', '.join(type(x).__name__ for x in reopened)}); "
          f"largest corner shift {worst:.3g} mm")
    again.close()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
