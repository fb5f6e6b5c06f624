"""The Qt-free session model that the napari dock and the notebook explorer bind to.

:class:`Session` holds the run settings, one result per image with the thresholds chosen for
it, and the selected result; its :attr:`Session.events` say what changed. No GUI toolkit is
imported here (tests/test_architecture.py checks it).
"""

from __future__ import annotations

from napari_attnreg.session.events import SessionEvents, Signal
from napari_attnreg.session.model import ResultEntry, RunInfo, Session

__all__ = ["ResultEntry", "RunInfo", "Session", "SessionEvents", "Signal"]
