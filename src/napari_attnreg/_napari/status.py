"""What the dock and napari's status bar say about a run: caption, count, diagnostics, planes."""

from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import Any

from qtpy.QtWidgets import QLabel

from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.slice_cue import plane_text
from napari_attnreg.core.results.display import (
    diagnostics_lines,
    run_caption,
    significance_caption,
    summary_text,
    unique_diagnostics,
)
from napari_attnreg.core.results.meaning import result_meaning

WARNING_COLOR = "#e0a030"
#: Source-layer events after which the output layers are moved onto the source again.
TRANSFORM_EVENTS = ("scale", "translate", "rotate", "shear", "affine", "units")


def planes_line(record: RunRecord) -> str | None:
    """Names the computed planes of a partly computed stack (None when all were computed)."""
    all_planes = record.geometry.planes()
    if len(record.results) >= len(all_planes):
        return None
    done = sorted(record.results)
    names = "; ".join(record.geometry.plane_name(p) for p in done[:6]) + (" …" if len(done) > 6 else "")
    return (f"Computed {len(done)} of {len(all_planes)} planes ({names}); the other planes "
            "are not computed (left transparent).")


def summary_html(record: RunRecord) -> tuple[str, str]:
    """(rich text for the dock's status line, one plain line for napari's status bar)."""
    results = [record.results[p] for p in sorted(record.results)]
    caption = significance_caption(results, record.thresholds)
    meaning = result_meaning(record.preset, results[0].metadata)
    lines = [html.escape(run_caption(results[0], planes=len(results)), quote=False),
             f"<b>{html.escape(caption, quote=False)}</b>",
             f"<i>{html.escape(meaning, quote=False)}</i>"]
    tissue = tissue_line(results[0])
    if tissue:
        lines.insert(1, html.escape(tissue, quote=False))
    partial = planes_line(record)
    if partial:
        lines.append(f"<span style='color:{WARNING_COLOR}'>{html.escape(partial)}</span>")
    for line in plane_diagnostics(record):
        text = html.escape(line, quote=False)
        lines.append(f"<span style='color:{WARNING_COLOR}'>{text}</span>"
                     if line.startswith("⚠") else text)
    status = f"{record.source_name}: {summary_text(results, record.thresholds)}" + (
        f" · {partial}" if partial else "")
    return "<br>".join(lines), status


def tissue_line(result: Any) -> str | None:
    """Which tissue mask chose a tiled run's tiles, and what the others are (None: an untiled
    run, or one with no mask). The caption counts the tiles; without this line an analyst who
    typed an outline could not tell it from the automatic mask."""
    md = result.metadata
    source = md.get("tissue_mask")
    if not md.get("tiled") or not isinstance(source, str) or source == "none":
        return None
    tested, total = md.get("n_tissue_tiles"), md.get("n_tiles_total")
    if tested is None or total is None:
        return f"Tissue by {source}."
    if tested >= total:
        return f"Tissue by {source}: all {total} tiles tested."
    return (f"Tissue by {source}: the {total - tested} tiles with too little tissue are not "
            "measured (transparent).")


def plane_diagnostics(record: RunRecord, *, include_info: bool = True) -> list[str]:
    """The diagnostics of every computed plane, each sentence once; one that holds for only
    some planes names them (after 'Compute remaining slices' four near-identical lines no
    longer leave the analyst guessing which slice each belongs to). Warnings first."""
    if len(record.results) < 2:
        return unique_diagnostics(list(record.results.values()), include_info=include_info)
    planes_of: dict[str, list[tuple[int, ...]]] = {}
    for plane in sorted(record.results):
        for line in diagnostics_lines(record.results[plane], include_info=include_info):
            planes_of.setdefault(line, []).append(plane)
    lines = []
    for line, planes in planes_of.items():
        if len(planes) == len(record.results):
            lines.append(line)
            continue
        mark = "⚠ " if line.startswith("⚠") else ""
        names = "; ".join(plane_text(p, record.geometry) for p in planes)
        lines.append(f"{mark}{names}: {line.removeprefix('⚠ ')}")
    return sorted(lines, key=lambda line: not line.startswith("⚠"))


def notify_summary(record: RunRecord) -> None:
    """The notification the README promises: how many patches are significant, and what
    significant means for this run's procedure."""
    from napari.utils.notifications import show_info

    results = [record.results[p] for p in sorted(record.results)]
    show_info(f"{record.source_name}: {significance_caption(results, record.thresholds)}. "
              f"{result_meaning(record.preset, results[0].metadata)}")


def notify_diagnostics(record: RunRecord) -> None:
    """One warning notification listing what makes this result doubtful (if anything)."""
    from napari.utils.notifications import show_warning

    warnings_ = unique_diagnostics(list(record.results.values()), include_info=False)
    if warnings_:
        show_warning(diagnostics_message(record.source_name, warnings_))


def diagnostics_message(source_name: str, warnings_: list[str]) -> str:
    """The warning toast's text: napari shows a toast's first line alone (cut to its width)
    until expanded, so that line carries the first warning, not a heading."""
    return f"{source_name!r}: " + "\n".join(warnings_)


def warn_missing_planes(outcome: Any, planes: list[tuple[int, ...]],
                        geometry: Any = None) -> str:
    """Warn (notification) that a cancelled or partly failed run lacks some planes; the text.

    The planes are named as the slice cue names them ("slice 2", "t = 2"), not as tuples.
    """
    from napari.utils.notifications import show_warning

    missing = "; ".join(plane_text(p, geometry) for p in outcome.missing(planes))
    text = f"{outcome.message} Not computed: {missing}."
    show_warning(text)
    return text


#: Link colours readable on a dark and on a light background (WCAG contrast ≥ 4.5).
LINK_ON_DARK = "#5aa9ff"
LINK_ON_LIGHT = "#0b57a4"


def _luminance(hex_color: str) -> float:
    """WCAG relative luminance of ``#rrggbb``."""
    channels = [int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours (1 to 21)."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def theme_background() -> str:
    """The background colour of napari's current theme (dark when it cannot be read)."""
    try:
        from napari.settings import get_settings
        from napari.utils.theme import get_theme

        return get_theme(get_settings().appearance.theme).background.as_hex()
    except (ImportError, ValueError, KeyError):
        return "#23242b"


def link_color(background: str | None = None) -> str:
    """A link colour readable on ``background`` (default: napari's current theme).

    Qt's own link colour is a dark blue that napari's dark theme leaves unreadable.
    """
    background = background or theme_background()
    return max((LINK_ON_DARK, LINK_ON_LIGHT), key=lambda c: contrast(c, background))


#: The help label's link target: handled here (rendered Markdown), never opened as it is.
HELP_HREF = "attnreg-help:method"


def help_link() -> QLabel:
    """'Help: how to read the maps': the project's method page, readable without internet.

    A declared documentation URL opens in the browser; otherwise the page's Markdown (package
    data or a source checkout, :mod:`napari_attnreg.core.docs`) is rendered to HTML first, so
    the browser never shows raw Markdown.
    """
    from napari_attnreg.core.docs import declared_docs_url, docs_markdown

    if declared_docs_url() is None and docs_markdown("method") is None:
        label = QLabel("Help: docs/method.md of napari-attnreg")  # nothing to open: say where
        label.setToolTip("How to read the maps and choose the options.")
        return label
    label = QLabel(f"<a style='color:{link_color()}' href='{HELP_HREF}'>Help: how to read the "
                   "maps</a>")
    label.setToolTip("How to read the maps and choose the options (opens in the browser).")
    label.linkActivated.connect(open_help)
    return label


def open_help(href: str = HELP_HREF) -> str | None:
    """Open documentation page ``attnreg-help:<page>``; returns the URL opened (None: none)."""
    from qtpy.QtCore import QUrl
    from qtpy.QtGui import QDesktopServices

    from napari_attnreg.core.docs import docs_url

    page = href.partition(":")[2] or "method"
    url = docs_url(page)
    if url is None:
        return None
    if url.startswith("file:"):
        url = rendered_docs(page).as_uri()
    QDesktopServices.openUrl(QUrl(url))
    return url


def rendered_docs(page: str) -> Path:
    """Documentation page ``page`` rendered from Markdown to HTML in a temporary folder.

    Relative links and images resolve against the Markdown's own folder (an HTML ``base``).
    """
    from qtpy.QtGui import QTextDocument

    from napari_attnreg.core.docs import docs_markdown

    source = docs_markdown(page)
    if source is None:
        raise FileNotFoundError(f"No documentation page {page!r} in this installation.")
    document = QTextDocument()
    document.setMarkdown(source.read_text(encoding="utf-8"))
    body = document.toHtml()
    base = f"<base href='{source.parent.as_uri()}/'><title>napari-attnreg: {page}</title>"
    body = body.replace("<head>", f"<head>{base}", 1)
    out = Path(tempfile.gettempdir()) / "napari-attnreg-docs" / f"{page}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")
    return out
