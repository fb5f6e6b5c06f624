"""Crafted result files: AttentionResult.load refuses every damaged or tampered file with a
ValueError naming the file, never reads members it does not know, and still loads real ones."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napari_attnreg import AttentionResult

GRID = (16, 13)


@pytest.fixture(scope="module")
def real_result(tmp_path_factory):
    """A result file from the current writer (the demo model, a small image)."""
    from napari_attnreg import regularize
    from napari_attnreg.core.models.backbones import load_backbone

    rng = np.random.default_rng(3)
    image = (rng.random((96, 80)) * 1000).astype(np.uint16)  # demo: patch 8, grid (16, 13)
    result = regularize(image, load_backbone("demo"), n_boot=8, device="cpu", seed=1,
                        keep_nulls=True)
    return result.save(tmp_path_factory.mktemp("res") / "real.npz")


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=True)
    return buf.getvalue()


def _header(members: dict[str, bytes]) -> dict:
    arr = np.lib.format.read_array(io.BytesIO(members["metadata_json.npy"]))
    return json.loads(arr.tobytes().decode())


def _write(path: Path, members: dict[str, bytes], compress: bool = True) -> Path:
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _with_header(members: dict[str, bytes], **changes) -> dict[str, bytes]:
    header = _header(members)
    for key, value in changes.items():
        if value is _DROP:
            header.pop(key, None)
        else:
            header[key] = value
    raw = np.frombuffer(json.dumps(header).encode(), np.uint8)
    return {**members, "metadata_json.npy": _npy(raw)}


_DROP = object()


def test_a_file_from_the_current_writer_loads_the_same(real_result):
    back = AttentionResult.load(real_result)
    assert back.grid_shape == GRID and back.image_shape == (96, 80)
    assert back.null_scores is not None and back.null_scores.shape[0] == 8
    assert back.head_attention is not None and back.summary()
    again = AttentionResult.load(back.save(real_result.with_name("again.npz")))
    assert again == back


HEADER_TAMPERING = [
    ({"image_shape": [10, 10]}, "image_shape \\[10, 10\\] does not fit model_shape"),
    ({"image_shape": [4, 80]}, "image_shape \\[4, 80\\] is smaller than one patch"),
    ({"image_shape": [80, 96]}, "does not fit model_shape"),
    ({"image_shape": [96]}, "image_shape must be two positive integers"),
    ({"image_shape": [96, -80]}, "image_shape must be two positive integers"),
    ({"image_shape": "96x80"}, "image_shape must be two positive integers"),
    ({"patch_size": [0, 0]}, "patch_size must be two positive integers"),
    ({"patch_size": [True, 16]}, "patch_size must be two positive integers"),
    ({"patch_size": [16, 16]}, "shape \\(16, 13\\), expected the token grid \\(8, 6\\)"),
    ({"model_shape": [256, 208]}, "expected the token grid \\(32, 26\\)"),
    ({"model_shape": [512, 512]}, "does not fit model_shape"),
    ({"model_shape": [4, 4]}, "model_shape \\[4, 4\\] is smaller than one patch"),
    ({"pi0": 5.0}, "pi0 must be a number in \\[0, 1\\], got 5.0"),
    ({"pi0": -0.1}, "pi0 must be"),
    ({"pi0": "0.5"}, "pi0 must be"),
    ({"pi0": None}, "pi0 must be"),
    ({"pi0": _DROP}, "lacks \\['pi0'\\]"),
    ({"image_shape": _DROP}, "lacks \\['image_shape'\\]"),
    ({"thresholds": _DROP}, "lacks"),
    ({"thresholds": [1, 2]}, "thresholds must be a dictionary"),
    ({"thresholds": {"rule": "magic"}}, "rule 'magic' is not one of"),
    ({"thresholds": {"p_th": 2.0}}, "p_th=2.0 is not a number in \\[0, 1\\]"),
    ({"thresholds": {"unknown": 1}}, "thresholds must be a dictionary"),
    ({"format_version": 99}, "newer napari-attnreg"),
    ({"format_version": "1"}, "format_version '1' is not an integer"),
    ({"format": "something else"}, "not a napari-attnreg result"),
    ({"metadata": [1, 2]}, "metadata is not a dictionary"),
    ({"null_summary": "x"}, "null_summary in the metadata is not a dictionary"),
]


@pytest.mark.parametrize("changes,match", HEADER_TAMPERING)
def test_tampered_metadata_is_refused_with_the_file_name(real_result, tmp_path, changes, match):
    path = _write(tmp_path / "bad.npz", _with_header(_members(real_result), **changes))
    with pytest.raises(ValueError, match=match) as info:
        AttentionResult.load(path)
    assert str(path) in str(info.value)


def _replace_map(members, name, array):
    return {**members, f"{name}.npy": _npy(array)}


MAP_TAMPERING = [  # the step-down (default) result's maps, under their own names
    ("evidence", lambda m: np.full_like(m, np.nan), "evidence map has 208 values outside"),
    ("step_p", lambda m: m + 1.5, "step_p map has .* outside \\[0, 1\\]"),
    ("adjusted_p", lambda m: -m - 0.1, "adjusted_p map"),
    ("adjusted_p", lambda m: np.where(np.arange(m.size).reshape(m.shape) == 3, np.nan, m),
     "adjusted_p map has 1"),
    ("attention", lambda m: np.full_like(m, np.inf), "attention map has NaN/inf"),
    ("attention", lambda m: m[:4], "member 'attention' has shape \\(4, 13\\)"),
    ("z", lambda m: m.ravel(), "member 'z' has shape \\(208,\\)"),
    ("step_p", lambda m: m.astype(complex), "holds complex128 values"),
    ("step_p", lambda m: np.array(["a"] * m.size).reshape(m.shape), "not numbers"),
    ("head_attention", lambda m: m[0], "member 'head_attention' has shape"),
    ("null_scores", lambda m: m[..., :3], "member 'null_scores' has shape"),
]


@pytest.mark.parametrize("name,change,match", MAP_TAMPERING)
def test_tampered_maps_are_refused(real_result, tmp_path, name, change, match):
    members = _members(real_result)
    original = np.lib.format.read_array(io.BytesIO(members[f"{name}.npy"]))
    path = _write(tmp_path / "bad.npz", _replace_map(members, name, change(original)))
    with pytest.raises(ValueError, match=match):
        AttentionResult.load(path)


def test_object_arrays_are_refused_without_unpickling(real_result, tmp_path):
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    members = _replace_map(_members(real_result), "step_p", np.array([Boom()], dtype=object))
    with pytest.raises(ValueError, match="holds object values, not numbers"):
        AttentionResult.load(_write(tmp_path / "bad.npz", members))


@pytest.mark.parametrize("drop", ["attention.npy", "evidence.npy"])
def test_a_missing_map_is_named(real_result, tmp_path, drop):
    members = {k: v for k, v in _members(real_result).items() if k != drop}
    with pytest.raises(ValueError, match=f"the maps \\['{drop[:-4]}'\\] are missing"):
        AttentionResult.load(_write(tmp_path / "bad.npz", members))


BROKEN_FILES = {
    "text": lambda good: b"this is not a zip file at all",
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "zip of text": None,
    "bad json": None,
    "bad utf-8": None,
    "no metadata": None,
    "npy garbage": None,
}


def _broken(kind: str, good: bytes, members: dict[str, bytes]) -> bytes | dict[str, bytes]:
    if BROKEN_FILES[kind] is not None:
        return BROKEN_FILES[kind](good)
    if kind == "zip of text":
        return {"readme.txt": b"hello"}
    if kind == "bad json":
        return {**members, "metadata_json.npy": _npy(np.frombuffer(b"{not json", np.uint8))}
    if kind == "bad utf-8":
        return {**members, "metadata_json.npy": _npy(np.frombuffer(b"\xff\xfe\x00", np.uint8))}
    if kind == "no metadata":
        return {k: v for k, v in members.items() if k != "metadata_json.npy"}
    return {**members, "step_p.npy": b"\x93NUMPY garbage that is not a header"}


@pytest.mark.parametrize("kind", list(BROKEN_FILES))
def test_damaged_files_give_one_clear_value_error(real_result, tmp_path, kind):
    made = _broken(kind, real_result.read_bytes(), _members(real_result))
    path = tmp_path / "bad.npz"
    if isinstance(made, bytes):
        path.write_bytes(made)
    else:
        _write(path, made)
    with pytest.raises(ValueError) as info:
        AttentionResult.load(path)
    assert str(path) in str(info.value)


def test_a_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="No result file"):
        AttentionResult.load(tmp_path / "nothing.npz")


def test_an_extra_member_is_never_read(real_result, tmp_path, monkeypatch):
    # a large member stored uncompressed; reading it would also fail: its data is garbage
    extra = np.lib.format.header_data_from_array_1_0(np.empty((200, 1 << 20), np.uint8))
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, extra)
    members = {**_members(real_result), "huge.npy": buf.getvalue() + b"\x00" * 1024}
    path = _write(tmp_path / "extra.npz", members, compress=False)
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, name, *a, **k: opened.append(str(name)) or
                        real_open(self, name, *a, **k))
    back = AttentionResult.load(path)
    assert back.grid_shape == GRID
    assert "huge.npy" not in opened and "step_p.npy" in opened


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_damage_never_escapes_as_another_exception(real_result, tmp_path, data):
    good = bytearray(real_result.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(good) - 1))
        good[at] = data.draw(st.integers(0, 255))
    path = tmp_path / "fuzzed.npz"
    path.write_bytes(bytes(good))
    try:
        back = AttentionResult.load(path)
    except ValueError as err:
        assert str(path) in str(err)
    else:  # damage the reader could not see (e.g. in zip padding) leaves a consistent result
        assert back.grid_shape == GRID
        assert np.all((back.p >= 0) & (back.p <= 1))


def test_a_thousand_damaged_copies_are_each_a_result_or_a_value_error(tmp_path):
    """Seeded byte damage and truncation: zip headers claiming encryption or an unknown
    compression, broken .npy headers, ... all end as one ValueError naming the file."""
    import random

    from napari_attnreg.core.results.result import AttentionResult

    grid = np.random.default_rng(0).random((4, 5))
    source = AttentionResult(
        attention=grid, maps=dict(z=grid - 0.5, p=grid, lfdr=grid, posterior=1 - grid, q=grid),
        pi0=0.9,
        thresholds={"rule": "q", "z_th": None, "p_th": 0.05, "l_th": 0.2, "q_th": 0.1},
        image_shape=(32, 40), model_shape=(32, 40), patch_size=(8, 8),
        metadata={"preset": "directional"}).save(tmp_path / "source.npz")
    raw = source.read_bytes()
    rng = random.Random(0)
    damaged = tmp_path / "damaged.npz"
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(1000):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        damaged.write_bytes(bytes(data))
        try:
            AttentionResult.load(damaged)
            outcomes["loaded"] += 1
        except ValueError as err:
            assert str(damaged) in str(err)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 900, outcomes


# ---- issue #18: bounded loading --------------------------------------------------------------
def _with_metadata(members: dict[str, bytes], **changes) -> dict[str, bytes]:
    metadata = {**_header(members)["metadata"], **changes}
    return _with_header(members, metadata=metadata)


def test_a_zip_bomb_of_nulls_is_refused_before_it_is_read(real_result, tmp_path):
    members = _members(real_result)
    # 1.2 GB of zeros compress to about 1.2 MB: far more rows than the run's n_boot (8)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if name != "null_scores.npy":
                zf.writestr(name, data)
        header = np.lib.format.header_data_from_array_1_0(np.zeros((1, *GRID), np.float32))
        header["shape"] = (600_000, *GRID)
        with zf.open("null_scores.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            block = bytes(1 << 22)
            left = 600_000 * GRID[0] * GRID[1] * 4
            while left:
                fh.write(block[: min(left, len(block))])
                left -= min(left, len(block))
    bomb = tmp_path / "bomb.npz"
    bomb.write_bytes(buf.getvalue())
    assert bomb.stat().st_size < 5_000_000
    with pytest.raises(ValueError, match=f"{bomb}.*null_scores.*n_boot"):
        AttentionResult.load(bomb)


@pytest.mark.parametrize("shape", [(10**12, *GRID), (2**40,)])
def test_a_declared_shape_larger_than_the_member_is_refused(real_result, tmp_path, shape):
    members = _members(real_result)
    name = "null_scores.npy" if len(shape) == 3 else "metadata_json.npy"
    raw = members[name]
    fh = io.BytesIO(raw)
    version = np.lib.format.read_magic(fh)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
        else np.lib.format.read_array_header_2_0
    _, fortran, dtype = read_header(fh)
    body = raw[fh.tell():]
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"shape": shape, "fortran_order": fortran, "descr": np.lib.format.dtype_to_descr(dtype)})
    path = _write(tmp_path / "big.npz", {**members, name: head.getvalue() + body})
    with pytest.raises(ValueError, match=f"{path}"):
        AttentionResult.load(path)


@pytest.mark.parametrize("change,match", [
    ({"timings": "fast"}, "timings"),
    ({"timings": {"total_s": "slow"}}, "timings"),
    ({"diagnostics": [1]}, "diagnostics"),
    ({"diagnostics": "none"}, "diagnostics"),
    ({"n_boot": "8"}, "n_boot"),
])
def test_metadata_values_are_checked(real_result, tmp_path, change, match):
    path = _write(tmp_path / "m.npz", _with_metadata(_members(real_result), **change))
    with pytest.raises(ValueError, match=f"{path}.*{match}"):
        AttentionResult.load(path)


def test_an_absurd_image_shape_is_refused(real_result, tmp_path):
    members = _with_metadata(_members(real_result), target_size=[96, 80])  # no aspect check
    path = _write(tmp_path / "huge.npz", _with_header(members, image_shape=[10**18, 10**18]))
    with pytest.raises(ValueError, match=f"{path}.*image_shape"):
        AttentionResult.load(path)
