"""The explorer's run reads the session model, as napari's dock does (#29 item 4)."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.notebook import AttentionExplorer


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=4, device="cpu", view="image")
    yield ex
    ex.close()


def test_settings_set_on_the_session_in_code_are_what_the_run_uses(explorer):
    explorer.session.update_settings(n_boot=6, seed=3, block_size=4)
    assert explorer.n_boot == 6  # a trait shows it
    result = explorer.run(wait=True)
    assert result is not None, explorer.last_error
    md = result.metadata
    assert (md["n_boot"], md["seed"], md["block_size"]) == (6, 3, 4)
    # the run kept them: the session was not overwritten by the panel at Run
    assert explorer.session.settings["block_size"] == 4


def test_a_control_changed_by_the_analyst_reaches_the_session_and_the_run(explorer):
    explorer.session.update_settings(block_size=4)
    explorer.run(wait=True)
    control = explorer.options_panel.advanced.controls["block_size"]
    control.value = ""  # emptied by the analyst: back to auto
    result = explorer.run(wait=True)
    assert result is not None, explorer.last_error
    assert explorer.session.settings["block_size"] is None
    assert result.metadata["block_size"] != 4
