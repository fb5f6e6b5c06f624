"""Work around a crash between Mesa's software OpenGL and Triton (imported by torch/timm).

On machines that render napari with Mesa's llvmpipe (CI under Xvfb, VMs, remote desktops),
the OpenGL driver loads ``libLLVM``; importing ``triton`` afterwards loads a second LLVM
and the process segfaults. ``import timm`` imports torchvision → ``torch._dynamo`` →
``triton``, so the first model load after the viewer opened would kill napari. Triton only
serves ``torch.compile`` kernels, which this plugin never uses; when (and only when) that
crash is certain to follow, later ``import triton`` raises ImportError instead, which torch
handles by running without it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def llvm_already_loaded() -> bool:
    """Whether a shared ``libLLVM`` (Mesa's llvmpipe) is mapped into this process (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "libLLVM" in maps


def avoid_triton_llvm_clash() -> bool:
    """Block ``import triton`` if it would crash next to an already loaded libLLVM.

    Returns
    -------
    bool
        True when Triton was blocked (nothing changes if triton or timm is already imported,
        or no libLLVM is loaded).
    """
    if "triton" in sys.modules or not llvm_already_loaded():
        return False
    try:
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return False
    except (ImportError, ValueError):
        return False
    sys.modules["triton"] = None  # type: ignore[assignment]  # import triton → ImportError
    logger.warning("napari-attnreg: Mesa's libLLVM is loaded (software OpenGL); Triton is "
                   "disabled in this process so loading torch/timm cannot crash napari.")
    return True
