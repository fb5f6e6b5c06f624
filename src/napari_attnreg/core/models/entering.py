"""The tokens entering one transformer block, kept from a forward pass to run that block again.

The CLS-row adapters run every block before the chosen one and then only the CLS query's
row of the chosen block. What enters the chosen block is all that the block's own work
depends on, so a caller that keeps it can run that block again (its full output, or the row
of a re-drawn copy of it) without the blocks before it: the map checks of a run do this with
the observed image's pass instead of two more passes through the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Entering:
    """What block ``idx`` was called with in one forward pass.

    Attributes
    ----------
    idx : int
        The block's index (0-based).
    tokens : tensor ``(N, L, D)``
        The tokens entering it (prefix tokens first).
    grid : (int, int)
        The patch grid of the images.
    args, kwargs :
        The block's call, ``block(*args, **kwargs)``, as the library's forward made it (the
        tokens among them): a rotary embedding, a transformers layer's extra arguments.
    """

    idx: int
    tokens: torch.Tensor
    grid: tuple[int, int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def output(self, block: nn.Module) -> torch.Tensor:
        """The tokens leaving ``block`` (this block, or a re-drawn copy of it) ``(N, L, D)``."""
        out = block(*self.args, **self.kwargs)
        return out[0] if isinstance(out, tuple) else out
