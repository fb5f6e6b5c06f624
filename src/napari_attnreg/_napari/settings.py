"""The plugin's napari settings (manifest ``configurations``): defaults for a new widget.

napari 0.9 shows them under *Preferences* and stores them per user. :func:`run_defaults`
reads them, falling back to the manifest's defaults on an older napari, when the plugin is
not registered (a widget built in a script or test), or for a stored value that is no longer
valid. No Qt here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

PLUGIN_NAME = "napari-attnreg"
CONFIG_KEY = "run"
MANIFEST = Path(__file__).resolve().parents[1] / "napari.yaml"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunDefaults:
    """What a new Attention Regularization widget starts with."""

    model: str
    device: str
    n_boot: int
    preset: str


def run_defaults() -> RunDefaults:
    """The user's plugin settings, each one checked against the manifest's schema.

    Examples
    --------
    >>> run_defaults()                                            # doctest: +SKIP
    RunDefaults(model='demo', device='auto', n_boot=200, preset='stepdown')
    """
    schema = _schema()
    stored = _stored_settings()
    values = {key: _valid(key, stored.get(key), prop) for key, prop in schema.items()}
    return RunDefaults(**values)


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    from npe2 import PluginManifest

    config = PluginManifest.from_file(MANIFEST).contributions.configurations[CONFIG_KEY]
    return {key: prop for key, prop in config.properties.items()}


def _stored_settings() -> dict[str, Any]:
    try:
        from napari.settings import get_plugin_settings
    except ImportError:  # napari < 0.9 has no plugin settings: manifest defaults
        return {}
    try:
        section = getattr(get_plugin_settings(PLUGIN_NAME), CONFIG_KEY)
    except (KeyError, AttributeError):  # plugin not registered with napari (script, test)
        return {}
    return {key: getattr(section, key, None) for key in _schema()}


def _valid(key: str, value: Any, prop: Any) -> Any:
    default = prop.default
    if value is None:
        return default
    enum = prop.enum or None
    ok = (value in enum) if enum else isinstance(value, type(default))
    if isinstance(default, int) and not isinstance(value, bool) and isinstance(value, int):
        ok = (prop.minimum is None or value >= prop.minimum) and \
            (prop.maximum is None or value <= prop.maximum)
    if isinstance(default, str) and not enum:
        ok = isinstance(value, str) and bool(value.strip())
    if not ok:
        _log.warning("napari-attnreg setting %s=%r is not valid; using %r.", key, value, default)
        return default
    return value
