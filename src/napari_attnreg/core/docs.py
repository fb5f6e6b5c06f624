"""Where the front ends' help links point: the project's documentation, offline first.

No address is invented here: a ``Documentation`` project URL declared in the package
metadata wins; otherwise the ``docs/`` folder of a source checkout or an unpacked sdist is
linked as a local file, so the link works without internet.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DOCS_DIR = Path(__file__).resolve().parents[3] / "docs"


def docs_url(page: str = "method") -> str | None:
    """URL of documentation page ``page`` (``"method"``, ``"models"``, ``"scale-out"``), or None.

    Example
    -------
    >>> url = docs_url("method")
    >>> url is None or url.startswith(("http", "file:"))
    True
    """
    try:
        urls = metadata.metadata("napari-attnreg").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("documentation", "docs"):
            return f"{url.strip().rstrip('/')}/{page}.md" if url.strip().endswith("/") else url.strip()
    local = DOCS_DIR / f"{page}.md"
    return local.as_uri() if local.is_file() else None
