"""Hub access: gated models name their access page; no network fails (or loads cached) in seconds."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time

import pytest
import timm  # noqa: F401  (imported here so the timings below measure the hub, not imports)
import torch
from safetensors.torch import save_file

from napari_attnreg.core.models import catalogue, hub
from napari_attnreg.core.models.backbones import BackboneError, load_backbone


def _http_error(cls, status: int, url: str):
    from huggingface_hub import errors

    http = importlib.import_module(errors.Response.__module__.split(".")[0])
    response = errors.Response(status, request=http.Request("GET", url))
    return cls(f"{status} Client Error", response=response)


def test_gated_repo_names_the_access_page(monkeypatch):
    from huggingface_hub import errors

    def refuse(repo_id, filename, **kwargs):
        raise _http_error(errors.GatedRepoError, 401, f"https://huggingface.co/{repo_id}/{filename}")

    monkeypatch.setattr(hub, "work_offline", lambda: False)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)
    with pytest.raises(BackboneError, match=r"https://huggingface.co/MahmoodLab/UNI\b") as info:
        catalogue.download_weights(catalogue.find("uni"))
    assert "HF_TOKEN" in str(info.value) and info.value.for_gui() == str(info.value)


def test_forbidden_status_is_gated_too():
    from huggingface_hub import errors

    err = hub.hub_error("org/model", _http_error(errors.HfHubHTTPError, 403, "https://x"),
                        offline=False, offline_alternative="a file")
    assert "request access on https://huggingface.co/org/model" in str(err)


def test_unreachable_hub_fails_fast_and_names_the_file_option(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    for model in ("uni", "rad-dino", "hf:owkin/phikon", "vit_small_patch8_224.dino", "dinov2-l-reg"):
        t0 = time.perf_counter()
        with pytest.raises(BackboneError, match="cannot be reached") as info:
            load_backbone(model)
        assert time.perf_counter() - t0 < 5.0, model
        assert "file" in str(info.value) and info.value.gui_hint == hub.FILE_HINT
        gui = info.value.for_gui()
        assert gui.endswith(hub.FILE_HINT) and "load_backbone" not in gui and "cannot be reached" in gui
    assert "weights='path/to/pytorch_model.bin'" in _message("uni", monkeypatch)


def _message(model: str, monkeypatch) -> str:
    try:
        load_backbone(model)
    except BackboneError as err:
        return str(err)
    raise AssertionError("no error")


def _run(code: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, **env), timeout=120, check=False)
    return out, time.perf_counter() - t0


IMPORT = "import napari_attnreg.core.models.backbones, timm, transformers\n"


def test_hf_hub_offline_fails_in_seconds():
    code = IMPORT + (
        "import time\nfrom napari_attnreg.core.models.backbones import load_backbone, BackboneError\n"
        "for m in ('uni2-h', 'hf:microsoft/rad-dino'):\n"
        "    t = time.perf_counter()\n"
        "    try:\n        load_backbone(m)\n"
        "    except BackboneError as e:\n        print('MSG', round(time.perf_counter() - t, 2), e)\n")
    out, _ = _run(code, HF_HUB_OFFLINE="1")
    lines = [line for line in out.stdout.splitlines() if line.startswith("MSG")]
    assert len(lines) == 2, out.stdout + out.stderr
    for line in lines:
        assert float(line.split()[1]) < 5.0 and "HF_HUB_OFFLINE is set" in line


def test_cached_weights_load_offline(tmp_path):
    """A model in the local hub cache loads with HF_HUB_OFFLINE=1 (no network wait)."""
    entry = catalogue.find("dino-vits8")
    torch.manual_seed(2)
    module = catalogue.build_module(entry)
    commit = "0" * 40
    repo = tmp_path / f"models--{entry.hub_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    save_file(module.state_dict(), str(repo / "snapshots" / commit / "model.safetensors"))
    code = IMPORT + (
        "import time\nfrom napari_attnreg.core.models.backbones import load_backbone\n"
        "t = time.perf_counter()\nbb = load_backbone('dino-vits8')\n"
        "print('OK', round(time.perf_counter() - t, 2), bb.weights, bb.domain, "
        "float(bb.model.blocks[0].attn.qkv.weight.sum()))\n")
    out, _ = _run(code, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    assert out.stdout.startswith("OK"), out.stdout + out.stderr
    _, seconds, weights, domain, checksum = out.stdout.split()
    assert float(seconds) < 10.0 and weights == "pretrained" and domain == "natural"
    assert abs(float(checksum) - float(module.blocks[0].attn.qkv.weight.detach().sum())) < 1e-3


def test_probe_goes_to_the_proxy_when_one_is_set(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.example.org:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.org:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert hub._probe_target() == ("proxy.example.org", 3128, True)
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert hub._probe_target() == ("huggingface.co", 443, False)


def test_a_proxy_that_never_answers_fails_fast_and_suggests_offline(monkeypatch):
    import socket

    from huggingface_hub.errors import LocalEntryNotFoundError

    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        for name in ("NO_PROXY", "no_proxy", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
        monkeypatch.setattr(hub, "_reachable", None)
        monkeypatch.setattr(hub, "PROBE_TIMEOUT_S", 1.0)
        calls = []

        def load(local_only):
            calls.append(local_only)
            if local_only:
                raise LocalEntryNotFoundError("not in the cache")
            raise TimeoutError("read timed out")  # what a silent proxy gives after minutes

        t0 = time.perf_counter()
        with pytest.raises(BackboneError) as info:
            hub.call_hub("org/model", load, offline_alternative="load_backbone('file')")
        assert time.perf_counter() - t0 < 10
        assert calls == [True]  # never tried the network through the silent proxy
        assert "HF_HUB_OFFLINE=1" in str(info.value)
        models = ["vit_small_patch8_224.dino"]  # a timm id, and hf: with transformers
        models += ["hf:owkin/phikon"] if importlib.util.find_spec("transformers") else []
        for model in models:
            t0 = time.perf_counter()
            with pytest.raises(BackboneError, match="HF_HUB_OFFLINE=1"):
                load_backbone(model)
            assert time.perf_counter() - t0 < 10, model


@pytest.fixture
def not_a_proxy(monkeypatch, tmp_path):
    """HTTPS_PROXY pointing at a loopback server that answers everything with an HTTP error,
    as a web server or a captive portal does (no network is used), and an empty hub cache."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(30)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(2)
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    address = f"http://127.0.0.1:{server.getsockname()[1]}"
    for name in ("NO_PROXY", "no_proxy", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, address)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(hub, "_reachable", None)
    yield address
    server.close()


def test_an_answering_server_that_is_no_proxy_gives_a_clear_offline_message(not_a_proxy):
    """Issue #27 item 10: a 400 reply to CONNECT counted as a working proxy; the hub client
    then raised a raw ProxyError traceback."""
    assert not hub.hub_reachable()
    port = not_a_proxy.rsplit(":", 1)[1]
    with pytest.raises(BackboneError) as info:
        load_backbone("vit_small_patch8_224.dino")
    text = str(info.value)
    assert f"proxy 127.0.0.1:{port}" in text and "400 Bad Request" in text
    assert "load_backbone(" in text  # the offline alternative: a local weights file


def test_a_proxy_error_of_any_http_client_is_a_hub_failure():
    """huggingface_hub's HTTP client may be httpx or its successor (module ``httpx2``)."""
    proxy_error = type("ProxyError", (Exception,), {"__module__": "httpx2._exceptions"})
    err = hub.hub_error("org/model", proxy_error("400 Bad Request"), offline=False,
                        offline_alternative="load_backbone('weights.safetensors')")
    assert isinstance(err, BackboneError) and "weights.safetensors" in str(err)
