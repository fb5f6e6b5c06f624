"""The choice lists of the statistical options, defined once.

The statistics modules check their arguments against these; :mod:`~napari_attnreg.core.run.options`
builds every front end's controls from the same tuples.
"""

RULES = ("forwardstop", "fwer", "q", "p", "lfdr", "pi0", "soft", "base")
P_METHODS = ("pooled", "null")
ALTERNATIVES = ("two-sided", "greater")
PI0_METHODS = ("reference", "bh", "storey", "smoother", "bootstrap")
NULL_MODELS = ("theoretical", "empirical")
NULL_POOLS = ("pooled", "position")
TAILS = ("none", "gpd")
