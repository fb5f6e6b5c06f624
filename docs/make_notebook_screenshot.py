"""Screenshot of AttentionExplorer in a real JupyterLab page → docs/images/notebook_explorer.png.

Starts a local JupyterLab server on a scratch notebook, opens it in headless Chromium
(playwright driving the system browser, no browser download), runs all cells in the page,
waits until the explorer reports "Done in" and the ipympl canvas has drawn, and photographs
the widget's output area. Nothing is faked: the kernel, the widget manager and ipympl's
front end are the ones a user gets.

Usage::

    python docs/make_notebook_screenshot.py [--out docs/images/notebook_explorer.png]
        [--chromium /usr/bin/chromium] [--port 8899]

Needs jupyterlab, ipympl, playwright (Python package only) and a Chromium binary.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
# a quiet browser that reaches nothing but the local server (playwright gives every launch a
# fresh temporary profile, the equivalent of a new --user-data-dir)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

CELL = r'''
import numpy as np, torch
torch.set_num_threads(1)
from napari_attnreg.core.models.backbones import BackboneError, load_backbone
from napari_attnreg.notebook import AttentionExplorer
try:
    from napari_attnreg.samples import demo_image
    model, image, source = load_backbone("demo"), demo_image(), "demo"
except (BackboneError, ValueError):
    import timm
    from skimage import data
    torch.manual_seed(0)
    model = load_backbone(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=4))
    image, source = data.cell(), "skimage cell + random-init vit_tiny"
# the default (step-down): its evidence map, 1 − adjusted p, with the significant patches
# outlined and the map-level p in the caption
explorer = AttentionExplorer(image, model, n_boot=200, seed=0, device="auto", overlay="posterior")
h, w = image.shape[:2]
explorer.run(wait=True)
explorer.add_roi(rectangle=(h // 2, w // 2, h - 1, w - 1))
print("image/model:", source)
explorer
'''


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def _wait_http(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer at {url} within {timeout} s")


def _check_server(server: subprocess.Popen, log: Path) -> None:
    if server.poll() is not None:
        raise RuntimeError(f"JupyterLab exited ({server.returncode}):\n{log.read_text()[-3000:]}")


def _live_check(page) -> None:
    """Run and Cancel clicked in the browser: the bar must advance while the kernel is free."""
    widget = page.locator(".jp-OutputArea-output:has(.attnreg-status)").first
    from napari_attnreg.core.run.options import option

    label = option("n_boot").label  # the control's label comes from the core's option metadata
    n_boot = widget.locator(f".widget-inline-hbox:has-text('{label}') input")
    n_boot.fill("3000")
    n_boot.press("Enter")
    time.sleep(1)
    widget.locator("button:has-text('Run')").click()
    bar = widget.locator(".widget-hprogress .progress-bar").first
    samples = []
    for _ in range(8):
        time.sleep(0.5)
        samples.append(bar.evaluate("e => parseFloat(e.style.width || '0')"))
    widget.locator("button:has-text('Cancel')").click()
    page.wait_for_function("[...document.querySelectorAll('.attnreg-status')]"
                           ".some(e => e.textContent.includes('Cancelled'))", timeout=60_000)
    status = widget.locator(".attnreg-status").inner_text()
    print("progress bar % while running:", samples)
    print("status after Cancel:", status)
    moving = [b for a, b in itertools.pairwise(samples) if b > a]
    if len(moving) < 2 or samples[-1] >= 100:
        raise RuntimeError(f"the progress bar did not advance during the run: {samples}")


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=ROOT / "docs" / "images" / "notebook_explorer.png")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--port", type=int, default=8899)
    parser.add_argument("--live-check", action="store_true",
                        help="after the screenshot, click Run with B=3000 in the page, check that "
                             "the progress bar advances, then click Cancel")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="attnreg-lab-"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, work / "explorer.ipynb")
    port = _free_port(args.port)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(work / "config")}  # no user settings
    # no "get notified about Jupyter news?" toast over the widget
    news = work / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    log_file = open(work / "lab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--ServerApp.root_dir={work}", "--IdentityProvider.token=", "--ServerApp.password=",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=True",
         # containers often run as root; the server only listens on 127.0.0.1
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        time.sleep(2)
        _check_server(server, work / "lab.log")
        _wait_http(f"http://127.0.0.1:{port}/api", 90)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            # the size the docs promise to fit: nothing may be clipped at 1280 px wide
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"http://127.0.0.1:{port}/lab/tree/explorer.ipynb?reset")
            page.wait_for_function("window.jupyterapp && document.querySelector('.jp-Notebook')",
                                   timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            time.sleep(3)  # let the kernel session attach before running
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                "[...document.querySelectorAll('.attnreg-status')]"
                ".some(e => e.textContent.includes('Done in'))", timeout=300_000)
            page.wait_for_selector(".jupyter-matplotlib-figure canvas, .attnreg-status",
                                   timeout=60_000)
            time.sleep(4)  # ipympl sends the first frame after the canvas reports its size
            page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
            time.sleep(1)
            output = page.locator(".jp-OutputArea-output:has(.attnreg-status)").first
            output.scroll_into_view_if_needed()
            box = output.bounding_box()
            if box["x"] + box["width"] > 1280:
                raise RuntimeError(f"the explorer is wider than the 1280 px viewport: {box}")
            # the layout is the 1280 px wide one; the page only grows taller so that the whole
            # widget fits in one picture (a notebook scrolls vertically anyway)
            page.set_viewport_size({"width": 1280, "height": int(box["height"]) + 400})
            time.sleep(2)
            output.scroll_into_view_if_needed()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            output.screenshot(path=str(args.out))
            if args.live_check:
                _live_check(page)
            browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log_file.close()
        shutil.rmtree(work, ignore_errors=True)
    print(args.out)
    return args.out


if __name__ == "__main__":
    main()
