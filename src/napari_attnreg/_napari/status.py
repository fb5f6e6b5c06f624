"""What the dock and napari's status bar say about a run: caption, count, diagnostics, planes."""

from __future__ import annotations

import html
from typing import Any

from qtpy.QtWidgets import QLabel

from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg.core.results.display import (
    run_caption,
    significance_caption,
    summary_text,
    unique_diagnostics,
)

WARNING_COLOR = "#e0a030"
#: Source-layer events after which the output layers are moved onto the source again.
TRANSFORM_EVENTS = ("scale", "translate", "rotate", "shear", "affine", "units")


def planes_line(record: RunRecord) -> str | None:
    """Names the computed planes of a partly computed stack (None when all were computed)."""
    all_planes = record.geometry.planes()
    if len(record.results) >= len(all_planes):
        return None
    done = sorted(record.results)
    names = ", ".join(_plane_name(record, p) for p in done[:6]) + (" …" if len(done) > 6 else "")
    return (f"Computed {len(done)} of {len(all_planes)} planes ({names}); the other planes "
            "are not computed (left transparent).")


def _plane_name(record: RunRecord, plane: tuple[int, ...]) -> str:
    return ", ".join(f"axis {a} = {i}" for a, i in zip(record.geometry.stack_axes, plane))


def summary_html(record: RunRecord) -> tuple[str, str]:
    """(rich text for the dock's status line, one plain line for napari's status bar)."""
    results = [record.results[p] for p in sorted(record.results)]
    caption = significance_caption(results, record.thresholds)
    lines = [html.escape(run_caption(results[0], planes=len(results)), quote=False),
             f"<b>{html.escape(caption, quote=False)}</b>"]
    partial = planes_line(record)
    if partial:
        lines.append(f"<span style='color:{WARNING_COLOR}'>{html.escape(partial)}</span>")
    for line in unique_diagnostics(results):
        text = html.escape(line, quote=False)
        lines.append(f"<span style='color:{WARNING_COLOR}'>{text}</span>"
                     if line.startswith("⚠") else text)
    status = f"{record.source_name}: {summary_text(results, record.thresholds)}" + (
        f" · {partial}" if partial else "")
    return "<br>".join(lines), status


def notify_diagnostics(record: RunRecord) -> None:
    """One warning notification listing what makes this result doubtful (if anything)."""
    from napari.utils.notifications import show_warning

    warnings_ = unique_diagnostics(list(record.results.values()), include_info=False)
    if warnings_:
        show_warning(f"Attention regularization of {record.source_name!r}:\n"
                     + "\n".join(warnings_))


def warn_missing_planes(outcome: Any, planes: list[tuple[int, ...]]) -> str:
    """Warn (notification) that a cancelled or partly failed run lacks some planes; the text."""
    from napari.utils.notifications import show_warning

    missing = ", ".join(str(p) for p in outcome.missing(planes))
    text = f"{outcome.message} Not computed: {missing}."
    show_warning(text)
    return text


#: Readable on napari's dark and light themes alike.
LINK_COLOR = "#5aa9ff"


def help_link() -> QLabel:
    """'Help: how to read the maps': the project's docs/method.md (core.docs finds it)."""
    from napari_attnreg.core.docs import docs_url

    url = docs_url("method")
    if url is None:  # no declared documentation URL and no docs folder: say where it lives
        label = QLabel("Help: docs/method.md of napari-attnreg")
        label.setToolTip("How to read the maps and choose the options.")
        return label
    label = QLabel(f"<a style='color:{LINK_COLOR}' href='{url}'>Help: how to read the maps</a>")
    label.setOpenExternalLinks(True)
    label.setToolTip(f"How to read the maps and choose the options: {url}")
    return label
