"""Weights files: which suffixes hold weights, and reading them into a state dict."""

from __future__ import annotations

#: Suffixes of the weights files every route accepts (the pickers' filters say the same).
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt", ".bin")
