"""Reading a saved result without trusting it: known members only, shapes checked first.

A result file is an ``.npz`` (a zip of ``.npy`` members) written by
:meth:`~napari_attnreg.core.results.result.AttentionResult.save`. Since format version 2 it
holds each token map under the name its procedure gives it (step-down: ``step_p``,
``adjusted_p``, ``evidence``, ...) and its header names the procedure and the maps; a file
of version 1 (or older) holds the paper's five maps ``z``, ``p``, ``q``, ``lfdr``,
``posterior`` whatever its preset, and is read into its procedure's maps. A damaged, tampered or foreign file
must give one clear ``ValueError`` naming the file and the problem, never a misaligned result
or a raw ``KeyError``/``BadZipFile``; and a member this reader does not know (however large)
is never read. Object arrays are refused (no pickles).
"""

from __future__ import annotations

import json
import math
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy

from napari_attnreg.core.results.tissue_grid import tissue_token_grid
from napari_attnreg.core.stats.presets import THRESHOLD_KEYS
from napari_attnreg.core.stats.procedures import Procedure, get_procedure
from napari_attnreg.core.stats.rules import RULES

#: Version 2: maps under their procedure's names, the procedure named in the header.
FORMAT_VERSION = 2
#: The token maps a file of format version 1 (or older) stores, whatever its preset.
LEGACY_MAP_NAMES = ("z", "p", "lfdr", "posterior", "q")

FORMAT_NAME = "napari-attnreg result"
REQUIRED_HEADER = ("pi0", "thresholds", "image_shape", "model_shape", "patch_size")
MAX_HEADER_BYTES = 64 << 20  # metadata JSON; real ones are a few kB
MAX_SUMMARY_ELEMENTS = 1 << 24
#: Per-token summaries may hold this many values per token of the grid (a few arrays,
#: overlapping tiles counting their shared tokens again).
SUMMARY_ELEMENTS_PER_TOKEN = 16
#: No member is read into more memory than this, whatever its header declares.
MAX_MEMBER_BYTES = 4 << 30
MAX_HEADS = 4096
MAX_IMAGE_SIDE = 1 << 22  # 4 M pixels a side: beyond any whole-slide image
MAX_BOOT = 10**7


class ResultFileError(ValueError):
    """A result file that cannot be used; the message names the file and the problem."""


def read_result_file(path: Path, *, format_version: int = FORMAT_VERSION) -> dict[str, Any]:
    """The keyword arguments of ``AttentionResult`` stored in ``path``, checked.

    Raises
    ------
    ValueError
        Missing, not a result file, damaged or inconsistent.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultFileError(f"No result file at {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            return _Reader(archive, path).read(format_version)
    except ResultFileError:
        raise
    # a damaged .npy header fails inside numpy's header parser (SyntaxError, TokenError); a
    # damaged zip entry can claim an unknown compression (NotImplementedError) or encryption
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, KeyError,
            SyntaxError, tokenize.TokenError, NotImplementedError, RuntimeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ResultFileError(f"{path} is not a readable napari-attnreg result file ({reason}); "
                              "it may be damaged or not a result file.") from None


class _Reader:
    def __init__(self, archive: zipfile.ZipFile, path: Path) -> None:
        self.archive, self.path = archive, path
        self.members = {n[:-4]: n for n in archive.namelist() if n.endswith(".npy")}

    def fail(self, problem: str) -> ResultFileError:
        return ResultFileError(f"{self.path}: {problem}")

    def read(self, format_version: int) -> dict[str, Any]:
        header = self.header(format_version)
        image_shape = self.pair(header, "image_shape")
        model_shape = self.pair(header, "model_shape")
        patch = self.pair(header, "patch_size")
        too_big = [k for k, v in (("image_shape", image_shape), ("model_shape", model_shape))
                   if max(v) > MAX_IMAGE_SIDE]
        if too_big:
            raise self.fail(f"{too_big[0]} {list(header[too_big[0]])} is larger than any image "
                            f"({MAX_IMAGE_SIDE} pixels a side); the file is damaged or was edited.")
        metadata = header.get("metadata", {})
        if not isinstance(metadata, dict):
            raise self.fail("metadata is not a dictionary.")
        n_boot = self.check_metadata(metadata)
        if image_shape[0] < patch[0] or image_shape[1] < patch[1]:
            raise self.fail(f"image_shape {list(image_shape)} is smaller than one patch "
                            f"{list(patch)}; the file is damaged or was edited.")
        grid = (model_shape[0] // patch[0], model_shape[1] // patch[1])
        if 0 in grid:
            raise self.fail(f"model_shape {list(model_shape)} is smaller than one patch "
                            f"{list(patch)}; the file is damaged or was edited.")
        self.check_aspect(header, image_shape, model_shape, patch)
        summary = header.get("null_summary") or {}
        if not isinstance(summary, dict):
            raise self.fail("null_summary in the metadata is not a dictionary.")
        summary = dict(summary)
        # A tiled step-down keeps per-token summaries (each token's family, the families'
        # steps), so a slide's summary grows with its grid: the bound follows the grid, as
        # the maps' own shapes do, and still refuses a member no result could hold.
        limit = max(MAX_SUMMARY_ELEMENTS, SUMMARY_ELEMENTS_PER_TOKEN * grid[0] * grid[1])
        for name in self.members:
            if name.startswith("null_summary__"):
                summary[name.split("__", 1)[1]] = self.array(
                    name, lambda s: math.prod(s) <= limit,
                    f"a summary of at most {limit} values")
        maps = self.maps(header, metadata, grid, self.glass(summary, metadata, patch, grid))
        rows = {"head_attention": (lambda n: n <= MAX_HEADS, f"n ≤ {MAX_HEADS} heads"),
                "null_scores": (lambda n: n == n_boot, f"n_boot = {n_boot} rows")
                if n_boot is not None else (lambda n: n <= MAX_BOOT, f"n ≤ {MAX_BOOT} rows")}
        optional = {
            name: self.array(name, lambda s, g=grid, ok=rows[name][0]: len(s) == 3
                             and s[1:] == g and ok(s[0]),
                             f"(n, {grid[0]}, {grid[1]}) with {rows[name][1]}")
            for name in ("head_attention", "null_scores") if name in self.members}
        return dict(attention=maps.pop("attention"), maps=maps, pi0=self.pi0(header),
                    thresholds=self.thresholds(header),
                    image_shape=image_shape, model_shape=model_shape, patch_size=patch,
                    head_attention=optional.get("head_attention"), null_summary=summary,
                    null_scores=optional.get("null_scores"), metadata=metadata)

    # ---- token maps ---------------------------------------------------------------------------
    def procedure(self, header: dict[str, Any], metadata: dict[str, Any]) -> Procedure:
        """The procedure that made the result: its preset in the metadata (files before
        presets were the paper's), which a version-2 header names again."""
        name = metadata.get("preset", "paper")
        named = header.get("procedure") if header.get("format_version", 0) >= 2 else name
        if named != name:
            raise self.fail(f"its header names the procedure {named!r} but its metadata the "
                            f"preset {name!r}; the file is damaged or was edited.")
        try:
            return get_procedure(name)
        except ValueError:
            raise self.fail(f"it was made by preset {name!r}, which this napari-attnreg does "
                            "not know; upgrade (or install the plugin that adds it) to read "
                            "it.") from None

    def maps(self, header: dict[str, Any], metadata: dict[str, Any],
             grid: tuple[int, int], glass: np.ndarray) -> dict[str, np.ndarray]:
        """``attention`` and the procedure's token maps by its names, checked; NaN is a
        damaged value except at a token left out of the test or never run (``glass``)."""
        procedure = self.procedure(header, metadata)
        legacy = header.get("format_version", 0) < 2
        if legacy:
            stored = LEGACY_MAP_NAMES
        else:
            stored = header.get("maps")
            if not (isinstance(stored, list) and sorted(stored) == sorted(procedure.stored_maps)):
                raise self.fail(f"its header lists the maps {_short(stored)}, but a "
                                f"{procedure.title} result holds "
                                f"{', '.join(procedure.stored_maps)}; the file is damaged or "
                                "was edited.")
        names = ("attention", *stored)
        missing = [m for m in names if m not in self.members]
        if missing:
            raise self.fail(f"the maps {missing} are missing; the file is damaged or incomplete.")
        maps = {m: self.array(m, lambda s, g=grid: s == g, f"the token grid {grid}")
                for m in names}
        probabilities = ("p", "q", "lfdr", "posterior") if legacy \
            else procedure.probability_maps()
        self._check_values(maps, probabilities, self.untested(metadata, grid) | glass)
        _glass_not_measured(maps, probabilities, glass)
        if legacy:  # the paper's five fields, each renamed as the procedure declares
            return {"attention": maps["attention"], **procedure.store(_Fields(maps))}
        return maps

    # ---- members ------------------------------------------------------------------------------
    def array(self, name: str, shape_ok: Any, expected: str) -> np.ndarray:
        """Check a member's shape and dtype from its header, then read it."""
        member = self.members[name]
        with self.archive.open(member) as fh:
            version = npy.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = npy.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = npy.read_array_header_2_0(fh)
            else:
                raise self.fail(f"member {name!r} has an unknown .npy version {version}.")
            offset = fh.tell()  # where the data begins, after the .npy header
        if dtype.hasobject or dtype.kind not in "biuf":
            raise self.fail(f"member {name!r} holds {dtype} values, not numbers (refused).")
        if not shape_ok(tuple(shape)):
            raise self.fail(f"member {name!r} has shape {tuple(shape)}, expected {expected}; "
                            "the file is damaged or was edited.")
        # sizes before allocation: the declared shape must be what the member holds (the zip
        # bounds what it unpacks to its stated size) and below a cap, so neither a header
        # declaring 10**12 rows nor a zip bomb reaches numpy's allocator
        declared = math.prod(shape) * dtype.itemsize
        stored = self.archive.getinfo(member).file_size - offset
        if declared != stored or declared > MAX_MEMBER_BYTES:
            raise self.fail(f"member {name!r} declares {declared} bytes of data but holds "
                            f"{stored} (at most {MAX_MEMBER_BYTES} are read); the file is "
                            "damaged or was edited.")
        with self.archive.open(member) as fh:
            return npy.read_array(fh, allow_pickle=False)

    def header(self, format_version: int) -> dict[str, Any]:
        if "metadata_json" not in self.members:
            raise self.fail("not a napari-attnreg result file (no metadata).")
        raw = self.array("metadata_json", lambda s: len(s) == 1 and s[0] <= MAX_HEADER_BYTES,
                         "a 1D byte string")
        try:
            header = json.loads(raw.astype(np.uint8).tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise self.fail(f"its metadata is not valid JSON ({err}).") from None
        if not isinstance(header, dict) or header.get("format", FORMAT_NAME) != FORMAT_NAME:
            raise self.fail("not a napari-attnreg result file (foreign metadata).")
        version = header.get("format_version", 0)
        if not _is_int(version):
            raise self.fail(f"format_version {version!r} is not an integer.")
        if version > format_version:
            raise self.fail("written by a newer napari-attnreg; upgrade to read it.")
        missing = [k for k in REQUIRED_HEADER if k not in header]
        if missing:
            raise self.fail(f"its metadata lacks {missing}; the file is damaged or was edited.")
        return header

    # ---- values -------------------------------------------------------------------------------
    def check_metadata(self, metadata: dict[str, Any]) -> int | None:
        """The values that are used (summaries, diagnostics, row counts) have their types;
        returns ``n_boot`` (None in files that do not record it)."""
        n_boot = metadata.get("n_boot")
        if n_boot is not None and not (_is_int(n_boot) and 1 <= n_boot <= MAX_BOOT):
            raise self.fail(f"metadata n_boot {n_boot!r} is not a number of bootstrap images.")
        timings = metadata.get("timings", {})
        if not (isinstance(timings, dict) and all(
                isinstance(k, str) and _is_number(v) for k, v in timings.items())):
            raise self.fail(f"metadata timings {_short(timings)} is not a dictionary of seconds.")
        diagnostics = metadata.get("diagnostics", [])
        fields = {"code", "severity", "message"}
        if not (isinstance(diagnostics, list) and all(
                isinstance(d, dict) and set(d) == fields
                and all(isinstance(v, str) for v in d.values()) for d in diagnostics)):
            raise self.fail(f"metadata diagnostics {_short(diagnostics)} is not a list of "
                            "findings.")
        return n_boot


    def pair(self, header: dict[str, Any], key: str) -> tuple[int, int]:
        value = header[key]
        if not (isinstance(value, list) and len(value) == 2 and all(
                _is_int(v) and v >= 1 for v in value)):
            raise self.fail(f"{key} must be two positive integers, got {value!r}.")
        return int(value[0]), int(value[1])

    def check_aspect(self, header: dict[str, Any], image: tuple[int, int],
                     model: tuple[int, int], patch: tuple[int, int]) -> None:
        """A run that kept the aspect ratio scaled both axes alike, up to a patch of rounding:
        an edited ``image_shape`` would otherwise misplace every map in ``to_pixels``."""
        target = (header.get("metadata") or {}).get("target_size") \
            if isinstance(header.get("metadata"), dict) else None
        if not isinstance(target, (str, int)) or isinstance(target, bool):
            return  # an explicit (h, w) may change the aspect; older files do not say
        low = max((model[0] - patch[0]) / image[0], (model[1] - patch[1]) / image[1])
        high = min((model[0] + patch[0]) / image[0], (model[1] + patch[1]) / image[1])
        if low > high:
            raise self.fail(f"image_shape {list(image)} does not fit model_shape {list(model)} "
                            f"(target_size {target!r} keeps the aspect ratio); the file is "
                            "damaged or was edited.")

    def pi0(self, header: dict[str, Any]) -> float:
        pi0 = header["pi0"]
        if not (_is_number(pi0) and 0.0 <= float(pi0) <= 1.0):
            raise self.fail(f"pi0 must be a number in [0, 1], got {pi0!r}.")
        return float(pi0)

    def thresholds(self, header: dict[str, Any]) -> dict[str, Any]:
        t = header["thresholds"]
        if not isinstance(t, dict) or set(t) - set(THRESHOLD_KEYS):
            raise self.fail(f"thresholds must be a dictionary of {list(THRESHOLD_KEYS)}, "
                            f"got {t!r}.")
        if t.get("rule") is not None and t["rule"] not in RULES:
            raise self.fail(f"threshold rule {t['rule']!r} is not one of {list(RULES)}.")
        for key, value in t.items():
            if key == "rule" or value is None:
                continue
            in_range = key == "z_th" or 0.0 <= float(value) <= 1.0 if _is_number(value) else False
            if not in_range:
                raise self.fail(f"threshold {key}={value!r} is not a "
                                f"{'finite number' if key == 'z_th' else 'number in [0, 1]'}.")
        return t

    def untested(self, metadata: dict[str, Any], grid: tuple[int, int]) -> np.ndarray:
        """Boolean token grid of the tokens left out of the test (``excluded_tokens``, flat
        indices: attention sinks with ``exclude_sinks=True``), whose maps hold NaN."""
        excluded = metadata.get("excluded_tokens", [])
        n_tokens = grid[0] * grid[1]
        if not (isinstance(excluded, list) and len(excluded) < n_tokens and all(
                _is_int(t) and 0 <= t < n_tokens for t in excluded)):
            raise self.fail(f"metadata excluded_tokens {_short(excluded)} is not a list of "
                            "token indices; the file is damaged or was edited.")
        mask = np.zeros(n_tokens, dtype=bool)
        mask[np.asarray(excluded, dtype=np.int64)] = True
        return mask.reshape(grid)

    def glass(self, summary: dict[str, Any], metadata: dict[str, Any],
              patch: tuple[int, int], grid: tuple[int, int]) -> np.ndarray:
        """Boolean token grid of the tokens a tiled run with a tissue mask never ran (no
        tissue tile holds them), whose maps hold NaN: derived from the run tiles and the
        tiles' places the file records, as the front ends derive them (all False without
        a mask, or where those records do not describe this grid)."""
        tested = tissue_token_grid(summary.get("tissue_tiles"), metadata, patch, grid,
                                   summary.get("tissue_glass_tokens"))
        return np.zeros(grid, dtype=bool) if tested is None else ~tested

    def _check_values(self, maps: dict[str, np.ndarray], probabilities: tuple[str, ...],
                      untested: np.ndarray) -> None:
        if not np.all(np.isfinite(maps["attention"])):
            raise self.fail("the attention map has NaN/inf values; the file is damaged.")
        for name in probabilities:
            values = maps[name]
            # NaN counts as outside, except at a token the run left out of the test
            outside = ~((values >= 0) & (values <= 1)) & ~(untested & np.isnan(values))
            if outside.any():
                raise self.fail(f"the {name} map has {int(outside.sum())} values outside "
                                "[0, 1] or NaN; the file is damaged or was edited.")


def _glass_not_measured(maps: dict[str, np.ndarray], probabilities: tuple[str, ...],
                        glass: np.ndarray) -> None:
    """Glass in a file written before it was NaN, read as not measured (in place).

    Those versions filled the tokens no tissue tile holds with p = q = lfdr = 1 and
    posterior 0, as if tested: reopened, the paper preset's ``base`` rule (z ≥ 0, p not
    NaN) marked all of that glass significant, and counts and ROI tables took it for
    tested patches. Only such a fill is replaced: finite values at every glass token.
    """
    if not glass.any() or any(np.isnan(maps[name][glass]).any() for name in probabilities):
        return
    for name in probabilities:
        values = np.array(maps[name], dtype=np.float64, copy=True)
        values[glass] = np.nan
        maps[name] = values


class _Fields:
    """A version-1 file's maps as the attributes a procedure's ``store`` reads."""

    def __init__(self, maps: dict[str, np.ndarray]) -> None:
        self.__dict__.update(maps)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
