"""Kept for imports inside the plugin; the guard lives in core so scripts get it too."""

from napari_attnreg.core.models.triton_guard import avoid_triton_llvm_clash, llvm_already_loaded

__all__ = ["avoid_triton_llvm_clash", "llvm_already_loaded"]
