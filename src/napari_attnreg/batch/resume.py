"""Resume records: what each batch output was made from, so a resume never trusts a stray file.

Beside every result ``NAME.attnreg.npz`` a batch writes ``NAME.attnreg.json`` *last*, once
the result and its figure are complete. It records the input (resolved path, size,
modification time), the run (model and every option) and the size of every artefact. A
resumed batch skips an output only when all of that still matches; otherwise it redoes the
output and says why, or refuses when the output belongs to another input of the same name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from napari_attnreg.core.files import write_text_atomic

RECORD_FORMAT = "napari-attnreg resume record"
RECORD_VERSION = 1
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; a larger one is not ours


@dataclass(frozen=True)
class Decision:
    """What to do with one output: ``new``, ``skip``, ``redo`` (with why) or ``refuse``."""

    action: str
    reason: str = ""


def input_stamp(path: Path) -> dict[str, Any]:
    """The input as a resume record identifies it: resolved path, size, modification time."""
    try:
        st = Path(path).stat()
    except OSError:  # missing: reading it fails and reports it; nothing can match
        return {"source": str(path), "size": None, "mtime_ns": None}
    return {"source": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def run_signature(backbone: Any, opts: Mapping[str, Any]) -> dict[str, Any]:
    """The model (name, weights and their SHA-256) and every option, as plain JSON values
    (compared field by field on resume). Taken from the loaded backbone, so a serial run and
    a Dask run of the same weights agree."""
    from napari_attnreg.core.models.weights_hash import weights_sha256

    ident = {"model": backbone.name, "weights": backbone.weights,
             "weights_sha256": weights_sha256(backbone.weights, backbone.name)}
    # through JSON so that tuples and lists, paths and strings compare equal after a reload
    return json.loads(json.dumps({**ident, **dict(opts)}, sort_keys=True, default=str))


def record_path(result: Path) -> Path:
    """``NAME.attnreg.json`` beside ``NAME.attnreg.npz``."""
    return result.with_suffix(".json")


def write_record(result: Path, stamp: Mapping[str, Any], run: Mapping[str, Any],
                 artefacts: Mapping[str, Path]) -> Path:
    """Record a complete output; call it after every artefact has been written."""
    record = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "input": dict(stamp),
              "run": dict(run),
              "artefacts": {kind: {"file": p.name, "size": p.stat().st_size}
                            for kind, p in artefacts.items()}}
    return write_text_atomic(record_path(result), json.dumps(record, indent=1))


def _read_record(path: Path) -> dict[str, Any] | None:
    """The record, or None when there is none or it is not a valid one of ours."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(record, dict) and record.get("format") == RECORD_FORMAT and all(
        isinstance(record.get(k), dict) for k in ("input", "run", "artefacts"))
    return record if ok else None


def decide(result: Path, artefacts: Mapping[str, Path], stamp: Mapping[str, Any],
           run: Mapping[str, Any]) -> Decision:
    """Whether the output ``result`` (with ``artefacts``, by kind) can be kept for this input.

    Parameters
    ----------
    result : Path
        The ``.attnreg.npz`` path of this input (or plane).
    artefacts : mapping of str to Path
        Every file the output consists of, by kind (``"result"``, ``"figure"``).
    stamp : mapping
        :func:`input_stamp` of the input now.
    run : mapping
        :func:`run_signature` of this run.
    """
    record = _read_record(record_path(result))
    if record is None:
        if not result.exists():
            return Decision("new")
        owner = _result_source(result)
        if owner is not None and owner != stamp["source"]:
            return _refusal(result, owner)
        return Decision("redo", "there is no resume record beside the existing result (an "
                                "interrupted or older run)")
    owner = record["input"].get("source")
    if owner != stamp["source"]:
        return _refusal(result, str(owner))
    if record["input"] != dict(stamp):
        return Decision("redo", "the input changed since (size or modification time)")
    changed = sorted(k for k in set(record["run"]) | set(run)
                     if record["run"].get(k) != run.get(k))
    if changed:
        return Decision("redo", f"the options changed ({', '.join(changed)})")
    for kind, path in artefacts.items():
        entry = record["artefacts"].get(kind)
        if not isinstance(entry, dict) or entry.get("file") != path.name:
            return Decision("redo", f"no {kind} was recorded for it")
        if not path.is_file() or path.stat().st_size != entry.get("size"):
            return Decision("redo", f"its {kind} {path.name} is missing or incomplete")
    return Decision("skip")


def _refusal(result: Path, owner: str) -> Decision:
    return Decision("refuse", f"the output {result} holds the result of {owner}, another input "
                              "of the same name; give this input another --out folder (or "
                              "--overwrite to replace that result)")


def _result_source(result: Path) -> str | None:
    """The ``source`` a result file of an older run names, or None when it cannot be read."""
    from napari_attnreg.core.results.result import AttentionResult

    try:
        source = AttentionResult.load(result).metadata.get("source")
    except (ValueError, OSError):
        return None
    return str(source) if source else None
