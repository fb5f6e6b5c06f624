"""Slides from the scanners analysts have: Hamamatsu NDPI, Philips TIFF, Leica SCN, Ventana BIF
and Aperio SVS with JPEG 2000 or shared-table JPEG tiles, through the command line, the Python
API and napari's reader; a slide whose tiles this environment cannot decode.

Each file is written with tifffile in the layout its scanner uses (what tifffile and tiffslide
detect it by, where it states its levels and pixel size), small: 1024² at most at level 0,
256² tiles. Where the scanner's layout is more than tifffile writes, the writer says what it
adds (NDPI's 64-bit IFD layout, Philips' padded levels, Ventana's XMP) or leaves out.
"""

from __future__ import annotations

import io
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")
Image = pytest.importorskip("PIL.Image")

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402
from napari_attnreg.io.slides import is_slide, open_slide  # noqa: E402

TILE = 256
MPP = 0.25


def _pixels(h: int = 1024, w: int = 1024) -> np.ndarray:
    """White glass with a pink-purple stained block in the top-left corner (~30 % tissue),
    its shades varying over tens of pixels (as JPEG keeps them)."""
    rng = np.random.default_rng(0)
    img = np.full((h, w, 3), 236, np.uint8)
    th, tw = int(h * 0.55), int(w * 0.55)
    y, x = np.mgrid[:th, :tw]
    shade = (np.sin(y / 23.0) * np.cos(x / 31.0))[..., None] * 40
    stain = shade + rng.normal(0, 4, (th, tw, 3)) + np.array([175, 85, 165])
    img[:th, :tw] = stain.clip(0, 255).astype(np.uint8)
    return img


# -- JPEG as scanners store it ---------------------------------------------------------------

def _jpeg(img: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(img).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def _segments(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The JPEG's marker segments up to its scan: (marker, start, end), and where the entropy
    coded data begins."""
    i, segments = 2, []
    while True:
        marker, length = struct.unpack(">HH", data[i:i + 4])
        segments.append((marker, i, i + 2 + length))
        if marker == 0xFFDA:
            return segments, i + 2 + length
        i += 2 + length


def _tiles_with_shared_tables(img: np.ndarray) -> tuple[bytes, list[bytes]]:
    """JPEG tiles without their quantisation and Huffman tables, and the tables once (the TIFF
    JPEGTables tag), as Aperio and Philips scanners write them."""
    tables, tiles = None, []
    for y in range(0, img.shape[0], TILE):
        for x in range(0, img.shape[1], TILE):
            data = _jpeg(np.ascontiguousarray(img[y:y + TILE, x:x + TILE]))
            segments, scan = _segments(data)
            shared = b"\xff\xd8" + b"".join(data[s:e] for m, s, e in segments
                                            if m in (0xFFDB, 0xFFC4)) + b"\xff\xd9"
            assert tables in (None, shared)  # one quality: the same tables in every tile
            tables = shared
            tiles.append(b"\xff\xd8" + b"".join(data[s:e] for m, s, e in segments
                                                if m in (0xFFC0, 0xFFDA)) + data[scan:])
    assert tables is not None
    return tables, tiles


# -- the vendors' files ----------------------------------------------------------------------

def _write_ndpi(path: Path, img: np.ndarray) -> None:
    """Hamamatsu NDPI: each level one JPEG strip with restart markers, whose offsets the
    McuStarts tag (65426) lists (tifffile reads them as tiles); the Hamamatsu tags (65420
    FileFormat, 65421 SourceLens: 40, 20, 10 and -1 for the macro image); the pixel size in
    the resolution tags, in centimetres. tifffile writes a classic TIFF; NDPI's own layout
    (an 8-byte offset to the first IFD and to each next one, 4 high bytes after each IFD's
    entries, which tifffile requires of a ``.ndpi``) is made by rewriting the IFDs, the
    pixel data staying where tifffile put it."""
    classic = io.BytesIO()
    macro = np.full((96, 256, 3), 200, np.uint8)
    with tifffile.TiffWriter(classic) as tif:
        for k, lens, level in ((1, 40.0, img), (2, 20.0, img[::2, ::2]),
                               (4, 10.0, img[::4, ::4]), (40, -1.0, macro)):
            level = np.ascontiguousarray(level)
            data = _jpeg(level, restart_marker_blocks=4)
            _, scan = _segments(data)
            starts = [scan] + [j + 2 for j in range(scan, len(data) - 1)
                               if data[j] == 0xFF and 0xD0 <= data[j + 1] <= 0xD7]
            per_cm = 1e4 / (MPP * k)
            tif.write(iter([data]), shape=level.shape, dtype=np.uint8, photometric="ycbcr",
                      subsampling=(2, 2), compression="jpeg", rowsperstrip=level.shape[0],
                      metadata=None, resolution=(per_cm, per_cm), resolutionunit="CENTIMETER",
                      extratags=[(271, "s", 0, "Hamamatsu", True), (272, "s", 0, "C13210", True),
                                 (65420, "I", 1, 1, True), (65421, "f", 1, lens, True),
                                 (65422, "i", 1, 0, True), (65423, "i", 1, 0, True),
                                 (65424, "i", 1, 0, True),
                                 (65426, "I", len(starts), np.array(starts, np.uint32), True),
                                 (65427, "s", 0, "AB1234", True)])
    raw = classic.getvalue()
    out, entries = bytearray(raw), []
    ifd = struct.unpack_from("<I", raw, 4)[0]
    while ifd:
        n = struct.unpack_from("<H", raw, ifd)[0]
        entries.append(raw[ifd + 2:ifd + 2 + 12 * n])
        ifd = struct.unpack_from("<I", raw, ifd + 2 + 12 * n)[0]
    offsets = []
    for block in entries:  # the old IFDs stay behind, unused
        offsets.append(len(out))
        out += struct.pack("<H", len(block) // 12) + block + bytes(8 + len(block) // 3)
    for k, at in enumerate(offsets):
        following = offsets[k + 1] if k + 1 < len(offsets) else 0
        struct.pack_into("<Q", out, at + 2 + len(entries[k]), following)
    struct.pack_into("<Q", out, 4, offsets[0])  # over the old first IFD's first bytes
    path.write_bytes(bytes(out))


def _philips_xml(levels: int) -> str:
    """Philips' ImageDescription: DPUfsImport XML; each level's DICOM_PIXEL_SPACING (mm, rows
    then columns) in the WSI's PixelDataRepresentation sequence."""
    def attribute(name: str, value: str) -> str:
        return f'<Attribute Name="{name}" Group="0x0" Element="0x0" PMSVR="IString">{value}</Attribute>'

    representations = "".join(
        '<DataObject ObjectType="PixelDataRepresentation">'
        + attribute("DICOM_PIXEL_SPACING", f"&quot;{MPP * 2 ** k / 1000:g}&quot; "
                                           f"&quot;{MPP * 2 ** k / 1000:g}&quot;")
        + attribute("PIIM_PIXEL_DATA_REPRESENTATION_NUMBER", str(k)) + "</DataObject>"
        for k in range(levels))
    return ('<?xml version="1.0" encoding="UTF-8" ?>\n<DataObject ObjectType="DPUfsImport">'
            + attribute("DICOM_MANUFACTURER", "PHILIPS")
            + '<Attribute Name="PIM_DP_SCANNED_IMAGES" PMSVR="IDataObjectArray"><Array>'
            '<DataObject ObjectType="DPScannedImage">' + attribute("PIM_DP_IMAGE_TYPE", "WSI")
            + '<Attribute Name="PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE" '
            'PMSVR="IDataObjectArray"><Array>' + representations
            + "</Array></Attribute></DataObject></Array></Attribute></DataObject>")


def _write_philips(path: Path, img: np.ndarray) -> None:
    """Philips TIFF: software 'Philips DP', the XML above; the levels in the main IFD chain,
    each padded to whole tiles (its TIFF size is not the level's: tifffile corrects it from
    the pixel spacings), JPEG tiles with shared tables; a 'Macro' image."""
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for k in range(3):
            level = img[::2 ** k, ::2 ** k]
            h, w = level.shape[:2]
            padded = np.full((-(-h // TILE) * TILE, -(-w // TILE) * TILE, 3), 255, np.uint8)
            padded[:h, :w] = level
            tables, tiles = _tiles_with_shared_tables(padded)
            tif.write(iter(tiles), shape=padded.shape, dtype=np.uint8, tile=(TILE, TILE),
                      photometric="ycbcr", subsampling=(2, 2), compression="jpeg",
                      jpegtables=tables, software="Philips DP v1.0", metadata=None,
                      description=_philips_xml(3) if k == 0 else None)
        tif.write(np.full((64, 160, 3), 200, np.uint8), description="Macro", metadata=None,
                  software="Philips DP v1.0", photometric="rgb")


#: Leica SCN test slide: a 1024² canvas (the glass) at 0.5 µm, the scanned region 768x512 at
#: (64, 128) pixels; level 1 a quarter of level 0, as Leica scanners make them.
SCN_MPP, SCN_REGION, SCN_OFFSET = 0.5, (512, 768), (128, 64)


def _write_scn(path: Path, img: np.ndarray) -> None:
    """Leica SCN: a BigTIFF whose first ImageDescription is the SCN XML; a collection (the glass,
    in nm) holding a macro image (IFD 0, the whole glass) and the scanned region placed on it
    (its view in nm), each level a 'dimension' naming its IFD."""
    (h, w), (oy, ox), nm = img.shape[:2], SCN_OFFSET, SCN_MPP * 1000
    canvas = int(1024 * nm)

    def image(name: str, dims: str, size: tuple[int, int], view: tuple[int, int, int, int],
              objective: float) -> str:
        return (f'<image name="{name}"><creationDate>2024-01-01T00:00:00Z</creationDate>'
                '<device model="Leica SCN400;Leica SCN" version="1.5"/>'
                f'<pixels sizeX="{size[0]}" sizeY="{size[1]}">{dims}</pixels>'
                f'<view sizeX="{view[0]}" sizeY="{view[1]}" offsetX="{view[2]}" '
                f'offsetY="{view[3]}" spacingZ="0"/><scanSettings><objectiveSettings>'
                f'<objective>{objective}</objective></objectiveSettings><illuminationSettings>'
                '<numericalAperture>0.4</numericalAperture><illuminationSource>brightfield'
                '</illuminationSource></illuminationSettings></scanSettings></image>')

    xml = ('<?xml version="1.0"?>\n<scn xmlns="http://www.leica-microsystems.com/scn/2010/10/01">'
           f'<collection name="slide" sizeX="{canvas}" sizeY="{canvas}">'
           + image("macro", '<dimension sizeX="128" sizeY="128" r="0" ifd="0"/>', (128, 128),
                   (canvas, canvas, 0, 0), 0.5)
           + image("main", f'<dimension sizeX="{w}" sizeY="{h}" r="0" ifd="1"/>'
                           f'<dimension sizeX="{w // 4}" sizeY="{h // 4}" r="1" ifd="2"/>',
                   (w, h), (int(w * nm), int(h * nm), int(ox * nm), int(oy * nm)), 20)
           + "</collection></scn>")
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        tif.write(np.full((128, 128, 3), 180, np.uint8), tile=(64, 64), photometric="rgb",
                  compression="jpeg", description=xml, metadata=None)
        for k in (1, 4):
            per_cm = 1e4 / (SCN_MPP * k)
            tif.write(np.ascontiguousarray(img[::k, ::k]), tile=(TILE, TILE), photometric="rgb",
                      compression="jpeg", metadata=None, resolution=(per_cm, per_cm),
                      resolutionunit="CENTIMETER")


def _write_bif(path: Path, img: np.ndarray) -> None:
    """Ventana BIF: a BigTIFF whose first image ('Label Image') carries the iScan XMP (tag
    700: ScanRes, the µm per pixel, and Magnification), levels described 'level=N mag=M
    quality=Q' and, at level 0, an EncodeInfo XMP on how the scanner's tiles join; no
    resolution tags (the scanner states its pixel size in the XMP). The tiles here join
    edge to edge (overlap 0, as a DP 200 writes them); slides whose tiles overlap are not
    made here: tifffile and tiffslide place their tiles edge to edge all the same."""
    software = "ScanOutputManager 1.1.0.15854"
    iscan = (f'<?xml version="1.0" encoding="utf-8"?><Metadata><iScan Z-layers="1" '
             f'ScanRes="{MPP}" Magnification="40" UnitNumber="1"/></Metadata>').encode()
    rows, cols = -(-img.shape[0] // TILE), -(-img.shape[1] // TILE)
    encode = (f'<EncodeInfo Ver="2"><SlideStitchInfo><ImageInfo AOIScanned="1" Width="{TILE}" '
              f'Height="{TILE}" NumRows="{rows}" NumCols="{cols}" Pos-X="0" Pos-Y="0">'
              '<TileJointInfo FlagJoined="1" Confidence="100" Direction="RIGHT" Tile1="1" '
              'Tile2="2" OverlapX="0" OverlapY="0"/></ImageInfo></SlideStitchInfo>'
              '<AoiOrigin><AOI0 OriginX="0" OriginY="0"/></AoiOrigin></EncodeInfo>').encode()
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        tif.write(np.full((64, 64, 3), 220, np.uint8), description="Label Image",
                  software=software, metadata=None, photometric="rgb",
                  extratags=[(700, "B", len(iscan), iscan, True)])
        tif.write(np.ascontiguousarray(img[::16, ::16]), description="Thumbnail",
                  software=software, metadata=None, photometric="rgb")
        for level, mag in enumerate((40, 20, 10)):
            tif.write(np.ascontiguousarray(img[::2 ** level, ::2 ** level]), tile=(TILE, TILE),
                      photometric="rgb", compression="jpeg", software=software, metadata=None,
                      description=f"level={level} mag={mag} quality=90",
                      extratags=[(700, "B", len(encode), encode, True)] if level == 0 else [])


def _aperio(w: int, h: int, compression: str) -> str:
    return (f"Aperio Image Library v12.0.15\n{w}x{h} [0,0 {w}x{h}] ({TILE}x{TILE}) {compression}"
            f"|AppMag = 40|MPP = {MPP}")


def _write_svs(path: Path, img: np.ndarray, compression: int) -> None:
    """Aperio SVS: levels in the main IFD chain, the thumbnail second; JPEG tiles with shared
    tables (compression 7) or JPEG 2000 codestreams (33005: Aperio's JPEG 2000 in RGB)."""
    h, w = img.shape[:2]
    with tifffile.TiffWriter(path) as tif:
        for k in (1, 2, 4):
            level = np.ascontiguousarray(img[::k, ::k])
            if compression == 7:
                tables, tiles = _tiles_with_shared_tables(level)
                tif.write(iter(tiles), shape=level.shape, dtype=np.uint8, tile=(TILE, TILE),
                          photometric="ycbcr", subsampling=(2, 2), compression="jpeg",
                          jpegtables=tables, description=_aperio(w // k, h // k, "JPEG/RGB Q=90"),
                          metadata=None)
            else:
                tif.write(level, tile=(TILE, TILE), photometric="rgb", compression=compression,
                          description=_aperio(w // k, h // k, "J2K/KDU Q=70"), metadata=None)
            if k == 1:
                tif.write(np.ascontiguousarray(img[::16, ::16]), photometric="rgb",
                          description="Aperio Image Library v12.0.15\nthumbnail", metadata=None)


#: name: (file name, writer, level-0 (H, W) of the stored image, µm per level-0 pixel,
#: the format tiffslide detects).
VENDORS = {
    "ndpi": ("slide.ndpi", _write_ndpi, (1024, 1024), MPP, "hamamatsu"),
    "philips": ("slide.tiff", _write_philips, (1024, 768), MPP, "philips_tiff"),
    "scn": ("slide.scn", _write_scn, SCN_REGION, SCN_MPP, "leica"),
    "bif": ("slide.bif", _write_bif, (1024, 1024), MPP, "ventana"),
    "svs-j2k": ("j2k.svs", lambda p, img: _write_svs(p, img, 33005), (1024, 1024), MPP, "aperio"),
    "svs-jpeg": ("jpeg.svs", lambda p, img: _write_svs(p, img, 7), (1024, 1024), MPP, "aperio"),
}


@pytest.fixture(scope="module")
def vendor_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vendors")
    paths = {}
    for key, (name, write, shape, _, _) in VENDORS.items():
        paths[key] = folder / key / name
        paths[key].parent.mkdir()
        write(paths[key], _pixels(*shape))
    return paths


def _expected(key: str, level: int) -> np.ndarray:
    """The pixels level ``level`` holds: the written image downsampled, placed on the glass
    for a Leica slide (tiffslide composes the scanned region onto the whole slide)."""
    shape = VENDORS[key][2]
    k = 4 ** level if key == "scn" else 2 ** level
    img = _pixels(*shape)[::k, ::k]
    if key != "scn":
        return img
    canvas = np.zeros((1024 // k, 1024 // k, 3), np.uint8)  # tiffslide fills the glass with 0
    y, x = SCN_OFFSET[0] // k, SCN_OFFSET[1] // k
    canvas[y:y + img.shape[0], x:x + img.shape[1]] = img
    return canvas


# -- what tiffslide reads of each ------------------------------------------------------------

@pytest.mark.parametrize("key", list(VENDORS))
def test_each_vendors_file_is_that_vendors_slide_for_tiffslide(vendor_files, key):
    import tiffslide

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiffslide's notes on its partial NDPI/BIF parsing
        assert tiffslide.TiffSlide.detect_format(vendor_files[key]) == VENDORS[key][4]
        assert tiffslide.TiffSlide(vendor_files[key]).level_count >= 2


@pytest.mark.parametrize("key", list(VENDORS))
def test_a_vendors_slide_opens_at_a_level_with_its_pixel_size(vendor_files, key):
    path, mpp = vendor_files[key], VENDORS[key][3]
    assert is_slide(path)
    step = 4 if key == "scn" else 2
    image = open_slide(path, level=1)
    expected = _expected(key, 1)
    assert image.level == 1 and image.shape == expected.shape[:2]
    assert image.mpp == pytest.approx(mpp * step) and image.downsample == pytest.approx(step)
    block = image.read(slice(0, 200), slice(0, 180)).astype(int)
    # JPEG keeps the shades to a few levels; JPEG 2000 here is lossless
    assert np.abs(block - expected[:200, :180]).mean() < 4
    # and at a resolution: the level at least that fine, resampled
    assert open_slide(path, mpp=mpp * step * 1.5).level == 1


def test_a_leica_level_is_indexed_as_a_numpy_array_of_the_composed_slide(vendor_files):
    level = open_slide(vendor_files["scn"], level=0).array
    whole = _expected("scn", 0)
    assert level.shape == whole.shape and level.dtype == whole.dtype and level.ndim == 3
    for key in [(slice(100, 300, 3), slice(None, None, 7)), (140,), (140, 80), (..., 1),
                (slice(5, 5),), (slice(-40, None), slice(60, 70), slice(0, 2)), (-1, -1, -1)]:
        got, want = level[key], whole[key]
        assert got.shape == want.shape, key
        assert got.size == 0 or np.abs(got.astype(int) - want).mean() < 4, key
    with pytest.raises(IndexError):
        level[1024, 0]


def test_opening_an_ndpi_or_bif_slide_raises_no_warning(vendor_files):
    # tiffslide warned on every NDPI and BIF opened that it parses their metadata in part
    for key in ("ndpi", "bif"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            open_slide(vendor_files[key], level=1)
        assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []


def test_is_slide_leaves_plain_and_ome_tiffs_and_other_scn_files_to_their_readers(tmp_path):
    plain = tmp_path / "plain.tif"
    tifffile.imwrite(plain, _pixels(256, 256), photometric="rgb")
    ome = tmp_path / "pyramid.ome.tif"
    with tifffile.TiffWriter(ome, ome=True) as tif:
        tif.write(_pixels(512, 512), tile=(256, 256), subifds=1, photometric="rgb")
        tif.write(_pixels(256, 256), tile=(256, 256), subfiletype=1, photometric="rgb")
    gel = tmp_path / "gel.scn"  # Bio-Rad's 1D gel images share the ending; not TIFF
    gel.write_bytes(b"\x00\x01Bio-Rad gel" + bytes(200))
    assert not any(is_slide(p) for p in (plain, ome, gel))


def test_a_leica_or_ventana_slide_renamed_tif_is_still_a_slide(vendor_files, tmp_path):
    for key in ("scn", "bif"):
        renamed = tmp_path / f"{key}.tif"
        renamed.write_bytes(vendor_files[key].read_bytes())
        assert is_slide(renamed), key
        assert open_slide(renamed, level=1).mpp == pytest.approx(
            VENDORS[key][3] * (4 if key == "scn" else 2))


# -- the three routes ------------------------------------------------------------------------

@pytest.mark.parametrize("key", list(VENDORS))
def test_the_command_line_runs_a_vendors_slide_at_level_1(vendor_files, key, tmp_path):
    from napari_attnreg.cli import main

    out = tmp_path / "out"
    code = main(["run", str(vendor_files[key]), "--tiled", "--level", "1", "--n-boot", "8",
                 "--device", "cpu", "--out", str(out), "--quiet"])
    assert code == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    md, step = result.metadata, 4 if key == "scn" else 2
    assert md["slide_level"] == 1 and md["slide_downsample"] == pytest.approx(step)
    assert result.spatial["scale"] == pytest.approx((VENDORS[key][3] * step,) * 2)
    assert result.spatial["units"] == ("µm", "µm") and md["image_kind"] == "pathology"
    # the automatic tissue mask keeps the stained tiles and leaves the glass
    assert md["tissue_mask"].startswith("auto")
    assert 0 < md["n_tissue_tiles"] < md["n_tiles_total"]


@pytest.mark.parametrize("key", ["scn", "bif"])
def test_the_python_api_runs_a_vendors_slide_at_level_1(vendor_files, key):
    import napari_attnreg

    result = napari_attnreg.regularize(str(vendor_files[key]), "demo", tiled=True, level=1,
                                       n_boot=8, device="cpu")
    step = 4 if key == "scn" else 2
    assert result.metadata["slide_level"] == 1
    assert result.spatial["scale"] == pytest.approx((VENDORS[key][3] * step,) * 2)
    assert 0 < result.metadata["n_tissue_tiles"] < result.metadata["n_tiles_total"]


@pytest.mark.parametrize("key", list(VENDORS))
def test_napari_reads_a_vendors_slide_as_a_pyramid_in_micrometres(vendor_files, key):
    from napari_attnreg._napari.io import get_reader

    path = str(vendor_files[key])
    reader = get_reader(path)
    assert reader is not None
    [(data, kwargs, kind)] = reader(path)
    full = _expected(key, 0)
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert data[0].shape == full.shape and data[1].shape == _expected(key, 1).shape
    assert kwargs["scale"] == pytest.approx((VENDORS[key][3],) * 2)
    assert kwargs["units"] == ("µm", "µm")
    # napari reads what it draws, as it slices a level
    corner = np.asarray(data[1][10:20, 5:15])
    assert np.abs(corner.astype(int) - _expected(key, 1)[10:20, 5:15]).mean() < 4


# -- tiles this environment cannot decode ----------------------------------------------------

@pytest.fixture
def without_jpeg2000(monkeypatch):
    """This environment as with an imagecodecs built without OpenJPEG: its ``jpeg2k_decode``
    is imagecodecs' stand-in, which raises DelayedImportError when called."""
    import imagecodecs

    def stub_decode(*args, **kwargs):
        raise imagecodecs.DelayedImportError("jpeg2k_decode")

    monkeypatch.setattr(imagecodecs, "jpeg2k_decode", stub_decode)
    for code in (33003, 33004, 33005, 34712):  # tifffile keeps the decoders it looked up
        monkeypatch.delitem(tifffile.TIFF.DECOMPRESSORS._codecs, code, raising=False)


def test_a_jpeg2000_slide_without_the_codec_says_what_to_install(vendor_files,
                                                                  without_jpeg2000):
    from napari_attnreg._napari.io import get_reader

    path = vendor_files["svs-j2k"]
    for read in (lambda: open_slide(path, level=1), lambda: get_reader(str(path))(str(path))):
        with pytest.raises(ValueError) as err:
            read()
        message = str(err.value)
        assert str(path) in message and "JPEG 2000" in message and "33005" in message
        assert "pip install --upgrade imagecodecs" in message
    # a slide of JPEG tiles opens as before
    assert open_slide(vendor_files["svs-jpeg"], level=1).read(slice(0, 8), slice(0, 8)).any()


def test_a_batch_reports_the_undecodable_slide_and_runs_the_others(vendor_files, tmp_path,
                                                                    without_jpeg2000):
    import csv

    from napari_attnreg.cli import main

    folder = tmp_path / "slides"
    folder.mkdir()
    for key in ("svs-j2k", "svs-jpeg"):
        (folder / vendor_files[key].name).write_bytes(vendor_files[key].read_bytes())
    out = tmp_path / "out"
    code = main(["run", str(folder), "--tiled", "--level", "1", "--n-boot", "8",
                 "--device", "cpu", "--out", str(out), "--quiet"])
    assert code != 0
    with open(out / "summary.csv", newline="", encoding="utf-8") as handle:
        rows = {Path(row["source"]).name: row for row in csv.DictReader(handle)}
    assert rows["jpeg.svs"]["status"] == "done"
    assert rows["j2k.svs"]["status"].startswith("failed")
    assert "JPEG 2000" in rows["j2k.svs"]["status"] and "imagecodecs" in rows["j2k.svs"]["status"]


def test_a_slide_in_a_compression_tifffile_does_not_know_is_refused_by_name(vendor_files,
                                                                          tmp_path):
    path = tmp_path / "unknown.svs"
    path.write_bytes(vendor_files["svs-j2k"].read_bytes())
    with tifffile.TiffFile(path, mode="r+b") as tif:
        for page in tif.pages:
            if page.is_tiled:
                page.tags["Compression"].overwrite(65535)
    with pytest.raises(ValueError, match=r"unknown\.svs: .*TIFF compression 65535.*no decoder"):
        open_slide(path, level=1)


@pytest.mark.gui
def test_napari_draws_a_leica_slide_composed_on_the_glass(vendor_files, make_napari_viewer):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py
    from napari.layers import Layer

    from napari_attnreg._napari.io import get_reader

    path = str(vendor_files["scn"])
    [(data, kwargs, kind)] = get_reader(path)(path)
    viewer = make_napari_viewer()
    # the layer napari makes of the reader's data (napari offers the plugin for a .scn once
    # its manifest lists the ending)
    layer = viewer.add_layer(Layer.create(data, kwargs, kind))
    assert layer.multiscale and layer.rgb and tuple(layer.scale) == pytest.approx((0.5, 0.5))
    viewer.reset_view()
    layer.refresh()
    # what napari sliced to draw (the whole slide fits the canvas: level 0 here), the scanned
    # region on the glass (a screenshot under Xvfb comes back black, whatever is drawn)
    drawn = np.asarray(layer._data_view).astype(int)
    assert np.abs(drawn - _expected("scn", layer.data_level)).mean() < 4


def test_a_batch_over_a_folder_takes_leica_and_ventana_slides(vendor_files, tmp_path):
    from napari_attnreg.cli import main

    folder = tmp_path / "slides"
    folder.mkdir()
    for key in ("scn", "bif"):  # a folder scan skipped .scn and .bif as "not images"
        (folder / vendor_files[key].name).write_bytes(vendor_files[key].read_bytes())
    out = tmp_path / "out"
    assert main(["run", str(folder), "--tiled", "--level", "1", "--n-boot", "8", "--device",
                 "cpu", "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.glob("*.attnreg.npz")) == [
        "slide.bif.attnreg.npz", "slide.scn.attnreg.npz"]
