"""Small helpers of the validation harness (benchmarks/validate.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

_T0 = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.0f} s] {message}", file=sys.stderr, flush=True)


def overlap(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float, float, float]:
    """Precision, recall, F1, IoU of a boolean prediction (0 where undefined)."""
    tp = float(np.sum(pred & truth))
    precision = tp / pred.sum() if pred.sum() else 0.0
    recall = tp / truth.sum() if truth.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    union = float(np.sum(pred | truth))
    return precision, recall, f1, (tp / union if union else 0.0)


def most_significant(result) -> np.ndarray | None:
    """One-hot ``(gh, gw)`` mask of the most significant patch (smallest p; among equal p the
    most attended), or None when no patch is significant."""
    sig = result.significant()
    if not sig.any():
        return None
    p = np.where(sig, result.p, np.inf).ravel()
    first = np.lexsort((-np.asarray(result.attention).ravel(), p))[0]
    top = np.zeros(sig.size, bool)
    top[first] = True
    return top.reshape(sig.shape)


def source_version() -> str:
    """The commit of the package source, and whether it had uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=root, text=True,
                               capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes in src/" if dirty else "")
