"""DICOM whole-slide images (VL Whole Slide Microscopy, Modality SM) read as slides.

Before, the DICOM reader took a WSI level (one multi-frame file whose frames are 256² tiles)
as a volume: ``attnreg run`` analysed every tile as an image of its own (and ignored
``--level``), a slide's folder was refused as "several series", and napari showed a z-stack
of tiles. The files here are written with pydicom: two levels (TILED_FULL, partial edge
tiles), a label, uncompressed or JPEG baseline, and a TILED_SPARSE level.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom", minversion="3.0")
pytest.importorskip("tiffslide")

from PIL import Image  # noqa: E402
from pydicom.dataset import Dataset, FileMetaDataset  # noqa: E402
from pydicom.sequence import Sequence  # noqa: E402
from pydicom.uid import ExplicitVRLittleEndian, JPEGBaseline8Bit, generate_uid  # noqa: E402

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402
from napari_attnreg.core.run.lazy import LazyImage  # noqa: E402
from napari_attnreg.io.dicom import WSI_SOP_CLASS  # noqa: E402
from napari_attnreg.io.dicom_wsi import (  # noqa: E402
    DicomLevel,
    is_dicom_wsi,
    open_dicom_slide,
    wsi_pyramid,
)
from napari_attnreg.io.readers import open_for_run  # noqa: E402

H, W, TILE = 600, 900, 256  # level 0: 3x4 tiles, the last row and column partial


def _pixels(h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    """White glass with a stained block (a little over a quarter of the slide) of noise."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 236, np.uint8)
    th, tw = int(h * 0.55), int(w * 0.55)
    img[:th, :tw] = (rng.random((th, tw, 3)) * 90 + [130, 40, 120]).astype(np.uint8)
    return img


def _smooth(h: int = H, w: int = W) -> np.ndarray:
    """Smooth colours, which JPEG keeps within a few grey levels."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([120 + 100 * np.sin(yy / 60), 120 + 100 * np.cos(xx / 80),
                     128 + 0 * yy], -1).astype(np.uint8)


def write_level(path: Path, img: np.ndarray, mm: float, *, jpeg: bool = False,
                sparse: bool = False, image_type: str = "VOLUME", series: str = "",
                number: int = 1, drop: tuple[int, int] | None = None,
                encapsulation: str = "bot") -> Path:
    """One DICOM WSI instance of ``img`` in 256² frames (``drop``: a tile left out, sparse).
    JPEG frames are one fragment each after a basic offset table (``bot``), without one
    (``none``), two fragments each (``split``) or after an extended offset table
    (``extended``)."""
    h, w = img.shape[:2]
    frames, places = [], []
    for r in range(-(-h // TILE)):
        for c in range(-(-w // TILE)):
            if sparse and (r, c) == drop:
                continue
            tile = np.zeros((TILE, TILE, 3), np.uint8)  # edge tiles padded, as scanners do
            part = img[r * TILE:(r + 1) * TILE, c * TILE:(c + 1) * TILE]
            tile[:part.shape[0], :part.shape[1]] = part
            frames.append(tile)
            places.append((r * TILE + 1, c * TILE + 1))
    if sparse:  # not in row order: each frame says where it lies
        frames, places = frames[::-1], places[::-1]
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = WSI_SOP_CLASS
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = JPEGBaseline8Bit if jpeg else ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = WSI_SOP_CLASS, meta.MediaStorageSOPInstanceUID
    ds.Modality, ds.ImageType = "SM", ["ORIGINAL", "PRIMARY", image_type, "NONE"]
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), series or generate_uid()
    ds.SeriesNumber, ds.InstanceNumber = 1, number
    ds.Rows = ds.Columns = TILE
    ds.NumberOfFrames = len(frames)
    ds.TotalPixelMatrixRows, ds.TotalPixelMatrixColumns = h, w
    ds.SamplesPerPixel, ds.PlanarConfiguration = 3, 0
    ds.PhotometricInterpretation = "YBR_FULL_422" if jpeg else "RGB"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit, ds.PixelRepresentation = 7, 0
    ds.DimensionOrganizationType = "TILED_SPARSE" if sparse else "TILED_FULL"
    measures = Dataset()
    measures.PixelSpacing = [mm, mm]
    shared = Dataset()
    shared.PixelMeasuresSequence = Sequence([measures])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    if sparse:
        groups = []
        for r, c in places:
            place = Dataset()
            place.RowPositionInTotalImagePixelMatrix = r
            place.ColumnPositionInTotalImagePixelMatrix = c
            group = Dataset()
            group.PlanePositionSlideSequence = Sequence([place])
            groups.append(group)
        ds.PerFrameFunctionalGroupsSequence = Sequence(groups)
    if jpeg:
        encoded = []
        for tile in frames:
            buffer = io.BytesIO()
            Image.fromarray(tile).save(buffer, format="JPEG", quality=95)
            encoded.append(buffer.getvalue())
        if encapsulation == "extended":
            ds.PixelData, ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths = \
                pydicom.encaps.encapsulate_extended(encoded)
        else:
            ds.PixelData = pydicom.encaps.encapsulate(
                encoded, fragments_per_frame=2 if encapsulation == "split" else 1,
                has_bot=encapsulation != "none")
    else:
        ds.PixelData = np.stack(frames).tobytes()
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    return path


def write_slide(folder: Path, img: np.ndarray, *, jpeg: bool = False) -> Path:
    """A slide's folder: levels 0 and 1 at 0.25 and 0.5 µm, and its label."""
    folder.mkdir(parents=True)
    series = generate_uid()
    write_level(folder / "level0.dcm", img, 0.00025, jpeg=jpeg, series=series, number=1)
    write_level(folder / "level1.dcm", img[::2, ::2].copy(), 0.0005, jpeg=jpeg,
                series=series, number=2)
    write_level(folder / "label.dcm", _smooth(200, 300), 0.01, image_type="LABEL",
                series=series, number=3)
    return folder


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    return write_slide(tmp_path_factory.mktemp("wsi") / "slide", _pixels())


# -- the routes that read a WSI as a volume before ------------------------------------------

def test_a_wsi_file_is_opened_for_a_run_as_a_slide_level_not_a_stack_of_tiles(slide):
    # before: a PlaneStack of the file's 12 tiles as planes, and --level ignored
    image, info = open_for_run(slide / "level0.dcm", {"tiled": True, "level": 1})
    assert isinstance(image, LazyImage) and image.level == 1
    assert image.shape == (H // 2, W // 2) and image.mpp == pytest.approx(0.5)
    assert info.pixel_size == (0.5, 0.5) and info.unit == "µm" and info.kind == "pathology"
    # untiled: the level in memory, one image
    stack, _ = open_for_run(slide, {})
    assert stack.n_planes == 1 and stack.plane_shape == (H, W)
    np.testing.assert_array_equal(stack.read(stack.planes()[0])[0], _pixels())


def test_a_slides_folder_is_one_slide_not_several_series(slide):
    # before: refused as "3 DICOM series or volumes" (the levels and the label)
    image, info = open_for_run(slide, {"tiled": True})
    assert isinstance(image, LazyImage) and image.level == 0 and image.shape == (H, W)
    assert info.pixel_size == (0.25, 0.25)


def test_the_volume_reader_refuses_a_wsi_and_names_the_right_route(slide):
    from napari_attnreg.io.dicom import read_dicom

    with pytest.raises(ValueError, match=r"whole-slide image.*tiles.*--tiled"):
        read_dicom(slide / "level0.dcm")


def test_a_batch_takes_a_slides_folder_as_one_input_and_leaves_its_label_out(slide, tmp_path):
    from napari_attnreg.batch.items import collect_inputs

    [item] = collect_inputs([slide])
    assert item.source == slide and set(item.files) == set(slide.glob("*.dcm"))
    # a label alone is no slide to analyse
    write_level(tmp_path / "label.dcm", _smooth(100, 100), 0.01, image_type="LABEL")
    write_level(tmp_path / "level.dcm", _pixels(300, 300), 0.00025)
    assert [i.source.name for i in collect_inputs([tmp_path])] == ["level.dcm"]


# -- pixels ---------------------------------------------------------------------------------

def test_levels_mpp_and_the_label_left_out(slide):
    pyramid = wsi_pyramid(slide)
    assert pyramid.pyramid.dimensions == ((H, W), (H // 2, W // 2))
    assert pyramid.pyramid.downsamples == (1.0, 2.0) and pyramid.pyramid.mpp == 0.25
    assert [level.shape for level in pyramid.levels] == [(H, W, 3), (H // 2, W // 2, 3)]
    assert is_dicom_wsi(slide) and is_dicom_wsi(slide / "label.dcm")
    # a resolution between levels: the finer level, resampled, as for SVS
    image = open_dicom_slide(slide, mpp=0.4)
    assert image.level == 0 and image.scale == pytest.approx(1.6)
    assert image.analysed_shape == (round(H / 1.6), round(W / 1.6))
    with pytest.raises(ValueError, match=r"levels 0–1 \(0: 900x600 \(0.25 µm\), 1: 450x300"):
        open_dicom_slide(slide, level=2)
    with pytest.raises(ValueError, match="finer than the slide's full resolution"):
        open_dicom_slide(slide, mpp=0.1)
    with pytest.raises(ValueError, match="level must be a whole number"):
        open_dicom_slide(slide, level=1.5)
    # level 1 is the thumbnail a tissue mask of level 0 is computed from
    assert open_dicom_slide(slide).overview_array.shape == (H // 2, W // 2, 3)


def test_pixels_read_back_exactly_across_tile_borders_and_partial_edge_tiles(slide):
    img = _pixels()
    level = wsi_pyramid(slide).levels[0]
    np.testing.assert_array_equal(level[:, :], img)
    # a region across four tiles, one reaching into the partial last column and row
    np.testing.assert_array_equal(level[200:600, 700:900], img[200:600, 700:900])
    np.testing.assert_array_equal(level[250:262, 250:262, 1], img[250:262, 250:262, 1])
    np.testing.assert_array_equal(level[100:590:7, 3:899:5], img[100:590:7, 3:899:5])
    np.testing.assert_array_equal(level[599, 899], img[599, 899])
    np.testing.assert_array_equal(level[-1], img[-1])
    np.testing.assert_array_equal(np.asarray(level), img)
    np.testing.assert_array_equal(wsi_pyramid(slide).levels[1][:, :], img[::2, ::2])


def test_a_region_decodes_only_the_frames_it_covers_and_keeps_them(slide, monkeypatch):
    decoded = []
    real = DicomLevel._decode

    def counting(self, data):
        decoded.append(len(data))
        return real(self, data)

    monkeypatch.setattr(DicomLevel, "_decode", counting)
    level = wsi_pyramid(slide).levels[0]
    level[10:20, 300:310]
    assert len(decoded) == 1  # one tile of 12
    level[250:260, 250:260]
    assert len(decoded) == 4  # the four tiles at a corner, (0, 1) kept from the read before
    level[0:5, 260:270]
    assert len(decoded) == 4


def test_jpeg_frames_decode_close_to_the_source(tmp_path):
    img = _smooth()
    folder = write_slide(tmp_path / "jpeg", img, jpeg=True)
    image = open_dicom_slide(folder / "level1.dcm", level=0)
    pixels = image.read(slice(None), slice(None)).astype(int)
    assert pixels.shape == (H, W, 3)
    assert np.abs(pixels - img).mean() < 2 and np.abs(pixels - img).max() < 40
    region = image.read(slice(240, 300), slice(500, 530)).astype(int)
    assert np.abs(region - img[240:300, 500:530]).mean() < 2


@pytest.mark.parametrize("encapsulation", ["none", "split", "extended"])
def test_jpeg_frames_are_found_with_or_without_an_offset_table(tmp_path, encapsulation):
    img = _smooth(300, 520)  # 2x3 tiles
    path = write_level(tmp_path / "level.dcm", img, 0.00025, jpeg=True,
                       encapsulation=encapsulation)
    pixels = open_dicom_slide(path).read(slice(None), slice(None)).astype(int)
    assert np.abs(pixels - img).mean() < 2


def test_a_sparse_level_places_frames_by_their_positions_and_a_missing_tile_is_glass(tmp_path):
    img = _pixels()
    path = write_level(tmp_path / "sparse.dcm", img, 0.00025, sparse=True, drop=(1, 2))
    pixels = open_dicom_slide(path).read(slice(None), slice(None))
    hole = (slice(256, 512), slice(512, 768))
    expected = img.copy()
    expected[hole] = 255
    np.testing.assert_array_equal(pixels, expected)


@pytest.mark.filterwarnings("ignore:Invalid value for VR UI")  # the UID cut in half
def test_a_truncated_file_is_a_clear_error(slide, tmp_path):
    folder = tmp_path / "cut"
    folder.mkdir()
    data = (slide / "level0.dcm").read_bytes()
    (folder / "level0.dcm").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"level0.dcm.*truncated"):
        open_for_run(folder / "level0.dcm", {"tiled": True})
    (folder / "level0.dcm").write_bytes(data[:600])  # in the header
    with pytest.raises(ValueError, match=r"level0.dcm.*damaged"):
        open_for_run(folder / "level0.dcm", {"tiled": True})


# -- command line, batch, napari ------------------------------------------------------------

def _result(out: Path, name: str) -> AttentionResult:
    return AttentionResult.load(out / f"{name}.attnreg.npz")


@pytest.mark.parametrize("which", ["folder", "file"])
def test_cli_runs_a_dicom_slide_tiled_at_a_level_with_its_tissue_mask(slide, tmp_path, which):
    from napari_attnreg.cli import main

    source = slide if which == "folder" else slide / "level0.dcm"
    out = tmp_path / "out"
    assert main(["run", str(source), "--tiled", "--level", "1", "--out", str(out),
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    result = _result(out, "slide" if which == "folder" else "level0.dcm")
    md = result.metadata
    assert result.image_shape[0] <= H // 2 and result.image_shape[0] > H // 2 - 16
    assert result.spatial["scale"] == (0.5, 0.5) and md["image_kind"] == "pathology"
    assert md["slide_level"] == 1 and md["slide_downsample"] == pytest.approx(2.0)
    assert md["tissue_mask"].startswith("auto") and md["n_tissue_tiles"] < md["n_tiles_total"]


def test_a_batch_of_two_slides_and_a_truncated_one_reports_it_and_goes_on(slide, tmp_path):
    from napari_attnreg.cli import main

    batch = tmp_path / "slides"
    write_slide(batch / "a", _pixels(seed=1)[:300, :400].copy())
    write_slide(batch / "b", _pixels(seed=2)[:300, :400].copy())
    (batch / "c").mkdir()
    data = (slide / "level1.dcm").read_bytes()
    (batch / "c" / "level1.dcm").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    code = main(["run", str(batch), "--recursive", "--tiled", "--level", "0", "--out",
                 str(out), "--n-boot", "4", "--device", "cpu", "--quiet"])
    summary = (out / "summary.csv").read_text()
    assert code != 0 and "truncated" in summary
    assert _result(out, "a").image_shape[1] > 300 and _result(out, "b").metadata["slide_level"] == 0


def test_regularize_opens_a_dicom_slide_at_a_level(slide):
    from napari_attnreg.api import regularize

    result = regularize(slide, "demo", tiled=True, level=1, n_boot=4, device="cpu")
    assert result.metadata["slide_level"] == 1 and result.spatial["scale"] == (0.5, 0.5)


def test_the_napari_reader_opens_a_dicom_slide_as_a_pyramid(slide):
    from napari_attnreg._napari.io import get_reader, read_dicom_wsi_layers
    from napari_attnreg.io.readers import ImageInfo

    for path in (str(slide), str(slide / "level1.dcm"), [str(p) for p in slide.glob("*.dcm")]):
        assert get_reader(path) is read_dicom_wsi_layers
    [(data, kwargs, kind)] = read_dicom_wsi_layers(str(slide))
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(H, W, 3), (H // 2, W // 2, 3)]
    assert kwargs["scale"] == (0.25, 0.25) and kwargs["name"] == "slide"
    info = ImageInfo.from_layer_metadata(kwargs["metadata"])
    assert info.pixel_size == (0.25, 0.25) and info.kind == "pathology"


@pytest.mark.gui
def test_napari_shows_a_dicom_slide_through_the_plugin(slide, make_napari_viewer):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    assert layer.multiscale and len(layer.data) == 2 and layer.rgb
    assert tuple(layer.scale) == pytest.approx((0.25, 0.25))
    viewer.reset_view()
    np.testing.assert_array_equal(np.asarray(layer.data[1][:10, :10]), _pixels()[:20:2, :20:2])


@pytest.mark.gui
def test_the_dock_runs_a_dicom_slide_and_a_saved_session_reopens_it(
        slide, make_napari_viewer, qtbot, tmp_path):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.io import write_outputs
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    controls = widget.options.controls
    controls["device"].setCurrentText("cpu")
    controls["n_boot"].setValue(4)
    controls["tiled"].setChecked(True)
    controls["level"].setValue(1)
    with qtbot.waitSignal(widget.run_finished, timeout=120_000):
        assert widget.run() is not None, widget.run_panel.status_label.text()
    record = widget.current_record()
    assert record is not None, widget.run_panel.status_label.text()
    result = record.results[()]
    assert result.metadata["slide_level"] == 1 and record.grid.factor == pytest.approx((2, 2))
    # level 1, cut to whole 8-pixel patches by the tiling
    level1 = np.asarray(layer.data[1]).shape[:2]
    assert all(0 <= n - m < 8 for n, m in zip(level1, result.image_shape))

    folder = tmp_path / "session"
    write_outputs(str(folder), [lay.as_layer_data_tuple()
                                for lay in (layer, *record.outputs.values())])
    again = make_napari_viewer()
    dock = AttentionWidget(again)
    again.window.add_dock_widget(dock)
    again.open(str(folder), plugin="napari-attnreg")
    assert again.layers[layer.name].multiscale
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=10_000)
    assert dock.current_record().run_id == record.run_id
