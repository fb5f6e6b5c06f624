"""The dock's save buttons share one dialog step: cancel writes nothing, a failure is a message."""

from __future__ import annotations

import pytest
from qtpy.QtWidgets import QFileDialog, QWidget

from napari_attnreg._napari import dialogs

pytestmark = pytest.mark.gui


@pytest.fixture
def notes(monkeypatch):
    seen = []
    import napari.utils.notifications as n

    monkeypatch.setattr(n, "show_info", lambda text: seen.append(("info", text)))
    monkeypatch.setattr(n, "show_error", lambda text: seen.append(("error", text)))
    return seen


def _answer(monkeypatch, path):
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (path, "")))


def test_a_cancelled_dialog_writes_nothing(qtbot, monkeypatch, notes):
    _answer(monkeypatch, "")
    calls = []
    assert dialogs.save_through_dialog(QWidget(), "t", "x.csv", "CSV (*.csv)", calls.append,
                                       str) is None
    assert calls == [] and notes == []


def test_a_written_file_is_announced_and_returned(qtbot, monkeypatch, notes, tmp_path):
    _answer(monkeypatch, str(tmp_path / "x.csv"))
    written = dialogs.save_through_dialog(QWidget(), "t", "x.csv", "CSV (*.csv)",
                                          lambda path: path.upper(), lambda w: f"wrote {w}")
    assert written == str(tmp_path / "x.csv").upper()
    assert notes == [("info", f"wrote {written}")]


@pytest.mark.parametrize("error", [OSError("No space left on device"),
                                   ValueError("There are no ROI rows to export")])
def test_a_failed_write_is_an_error_message_not_a_traceback(qtbot, monkeypatch, notes, error):
    _answer(monkeypatch, "/somewhere/x.csv")

    def fail(path):
        raise error

    assert dialogs.save_through_dialog(QWidget(), "t", "x.csv", "CSV (*.csv)", fail, str) is None
    assert notes == [("error", str(error))]
