"""The explorer in a real Jupyter kernel: Run and Cancel clicks, progress while the kernel idles.

This is the check for ipykernel 7, which changed how messages from other threads are
routed (ipywidgets #4001, #4020): the Run click handler must return at once, the progress
bar must advance while the kernel is idle, and a Cancel click must be handled mid-run.
"""

from __future__ import annotations

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from napari_attnreg.core.run.options import option

SETUP = r"""
import numpy as np, timm, torch
torch.set_num_threads(1)
import ipykernel
from IPython.display import display
from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.notebook import AttentionExplorer
torch.manual_seed(0)
bb = load_backbone(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2))
yy, xx = np.mgrid[0:96, 0:80]
img = (400 + 3000 * np.exp(-((yy - 30) ** 2 + (xx - 20) ** 2) / 60)
       + 50 * np.random.default_rng(0).standard_normal((96, 80))).astype(np.uint16)
ex = AttentionExplorer(img, bb, n_boot=3000, chunk_size=4, device="cpu", view="image")
display(ex)
print("ipykernel", ipykernel.__version__)
"""


def test_run_click_progress_and_cancel_in_a_live_kernel(kernel):
    printed = kernel.execute(SETUP, timeout=180)
    assert "ipykernel" in printed
    run_id = kernel.find_comm(_model_name="ButtonModel", description="Run")
    cancel_id = kernel.find_comm(_model_name="ButtonModel", description="Cancel")
    progress_id = kernel.find_comm(_model_name="FloatProgressModel")
    status_id = kernel.find_comm(_model_name="HTMLModel", _dom_classes=["attnreg-status"])

    click = kernel.click(run_id)
    kernel.wait_for(lambda: len(kernel.values_of(progress_id, "value")) >= 4, 60,
                    "progress updates after Run")
    handled = kernel.idle_after(click)
    assert handled is not None, "the Run click handler must return while the run goes on"
    progress = kernel.values_of(progress_id, "value")
    # updates keep arriving after the kernel went idle: the computation is off the handler
    after_idle = [v for t, v in progress if t > handled]
    assert len(after_idle) >= 2 and after_idle == sorted(after_idle) and after_idle[-1] < 1.0
    assert kernel.comms[cancel_id]["disabled"] is False

    # mid-run the kernel still takes slider moves and executes cells
    p_slider = kernel.find_comm(_model_name="FloatSliderModel",
                                description=option("p_th").label)
    kernel.set_value(p_slider, 0.05)
    out = kernel.execute("print(ex.p_th, ex.running, ex.run_panel.runner.task.done())", timeout=30)
    assert out.split() == ["0.05", "True", "False"]

    cancel = kernel.click(cancel_id)
    kernel.wait_for(lambda: "Cancelled" in kernel.comms[status_id].get("value", ""), 60,
                    "the Cancelled status")
    assert kernel.idle_after(cancel) is not None
    stopped_at = kernel.values_of(progress_id, "value")[-1][1]
    assert stopped_at < 0.5  # far from the 3000 images requested
    assert kernel.comms[run_id]["disabled"] is False and kernel.comms[cancel_id]["disabled"] is True

    out = kernel.execute("print(ex.running, ex.result is None, ex.run_panel.progress.bar_style)")
    assert out.split() == ["False", "True", "warning"]

    # a complete run from the button: the result arrives and the status shows timings
    kernel.execute("ex.n_boot = 16")
    kernel.click(run_id)
    kernel.wait_for(lambda: "Done in" in kernel.comms[status_id].get("value", ""), 120,
                    "the run to finish")
    out = kernel.execute("print(ex.result.metadata['n_boot'], ex.result.grid_shape)")
    assert out.strip() == "16 (14, 12)"
    assert not kernel.errors
