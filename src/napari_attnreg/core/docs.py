"""Where the front ends' help links point: the project's documentation, offline first.

No address is invented here: a ``Documentation`` project URL declared in the package
metadata wins. Otherwise the Markdown page itself is found: shipped inside the package
(``napari_attnreg/docs/<page>.md``, when the build includes it as package data), or in the
``docs/`` folder of a source checkout or an unpacked sdist. A front end renders that page
(napari: to HTML in a temporary folder) rather than opening raw Markdown.
"""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

DOCS_DIR = Path(__file__).resolve().parents[3] / "docs"
#: Folder of the package that holds the Markdown pages when they are shipped as package data.
PACKAGE_DOCS = "docs"


def declared_docs_url() -> str | None:
    """The ``Documentation`` project URL of the installed distribution, if it declares one."""
    try:
        urls = metadata.metadata("napari-attnreg").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("documentation", "docs"):
            return url.strip()
    return None


def docs_markdown(page: str = "method") -> Path | None:
    """The Markdown file of documentation page ``page``: package data first, then a checkout.

    Example
    -------
    >>> path = docs_markdown("method")
    >>> path is None or path.suffix == ".md"
    True
    """
    try:
        shipped = resources.files("napari_attnreg").joinpath(PACKAGE_DOCS, f"{page}.md")
        if shipped.is_file():
            return Path(str(shipped))
    except (ModuleNotFoundError, OSError):
        pass
    local = DOCS_DIR / f"{page}.md"
    return local if local.is_file() else None


def docs_url(page: str = "method") -> str | None:
    """URL of documentation page ``page`` (``"method"``, ``"models"``, ``"scale-out"``), or None.

    The declared documentation URL, else the page's Markdown file as a ``file:`` URL (see
    :func:`docs_markdown`).

    Example
    -------
    >>> url = docs_url("method")
    >>> url is None or url.startswith(("http", "file:"))
    True
    """
    url = declared_docs_url()
    if url is not None:
        return f"{url.rstrip('/')}/{page}.md" if url.endswith("/") else url
    local = docs_markdown(page)
    return local.as_uri() if local is not None else None
