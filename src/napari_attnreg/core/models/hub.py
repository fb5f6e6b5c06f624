"""Hugging Face Hub access that fails in seconds without a network and explains gated models.

huggingface_hub reads the token from ``HF_TOKEN`` or ``hf auth login`` by itself; nothing
here touches credentials. Without a network the hub client would retry for a long time,
so the hub is probed once per process with a short exchange under a total deadline, and when
it is out of reach every hub call runs in offline mode: cached files load at once, missing ones fail at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from napari_attnreg.core.models.errors import BackboneError

HUB_HOST = "huggingface.co"
PROBE_TIMEOUT_S = 2.0
FILE_HINT = "Choose the weights file option and pick the file you downloaded."

T = TypeVar("T")
_reachable: bool | None = None
#: Why the probe found the hub out of reach, when it knows more than "no answer".
_unreachable_why: str | None = None


def hub_reachable() -> bool:
    """Whether huggingface.co:443 (or the HTTPS proxy, if one is set) *answers* in time.

    A TCP connection is not enough: a proxy that accepts connections but never answers
    would make every hub call wait for minutes. So the probe completes an exchange within
    :data:`PROBE_TIMEOUT_S` in total (connect, then a TLS handshake with the hub, or the
    proxy's reply to ``CONNECT``, which must accept it: a server that is no proxy answers
    with an error status). Probed once per process.
    """
    global _reachable, _unreachable_why
    if _reachable is None:
        host, port, proxied = _probe_target()
        _reachable = _answers(host, port, proxied)
        if not _reachable and proxied:
            _unreachable_why = (f"the HTTPS proxy {host}:{port} does not forward to {HUB_HOST}"
                                f"{_proxy_said}; check HTTPS_PROXY")
    return _reachable


_proxy_said = ""  # the proxy's status line, for the message above


def _answers(host: str, port: int, proxied: bool) -> bool:
    """Whether ``host:port`` completes the probe exchange before the deadline (through a
    proxy: the proxy accepts the ``CONNECT`` with a 2xx status)."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the hub probe ran out of time")
        return remaining

    try:
        with socket.create_connection((host, port), timeout=left()) as sock:
            sock.settimeout(left())
            if proxied:
                sock.sendall(f"CONNECT {HUB_HOST}:443 HTTP/1.1\r\nHost: {HUB_HOST}:443\r\n\r\n"
                             .encode("ascii"))
                sock.settimeout(left())
                return _connect_accepted(sock.recv(64))
            context = ssl.create_default_context()
            context.check_hostname = False  # only "does it answer": a TLS-inspecting
            context.verify_mode = ssl.CERT_NONE  # network's own certificates are its business
            with context.wrap_socket(sock, server_hostname=HUB_HOST):
                return True
    except (OSError, TimeoutError):  # ssl.SSLError and socket.timeout are OSErrors
        return False


def _connect_accepted(reply: bytes) -> bool:
    """Whether a proxy's reply to ``CONNECT`` accepts it (``HTTP/1.1 200 ...``)."""
    global _proxy_said
    status = reply.split(b"\r\n", 1)[0].decode("ascii", "replace").strip()
    parts = status.split()
    accepted = len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].startswith("2")
    _proxy_said = "" if accepted else (f" (it answered {status[:60]!r})" if status
                                       else " (it sent nothing)")
    return accepted


def _probe_target() -> tuple[str, int, bool]:
    """Behind an institutional proxy only the proxy is reachable: probe it instead of the hub
    (the last value says whether it is a proxy)."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    proxy = getproxies().get("https")
    if proxy and not proxy_bypass(HUB_HOST):
        parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if parts.hostname:
            return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), True
    return HUB_HOST, 443, False


def offline_requested() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set in the environment."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(v.strip().upper() in ("1", "ON", "YES", "TRUE") for v in flags)


def work_offline() -> bool:
    """Use the local cache only: offline was asked for, or the hub cannot be reached."""
    return offline_requested() or not hub_reachable()


@contextlib.contextmanager
def _hub_offline_mode() -> Iterator[None]:
    """Make huggingface_hub behave as with ``HF_HUB_OFFLINE=1`` for libraries that call it
    (timm)."""
    from huggingface_hub import constants

    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


def call_hub(repo_id: str, load: Callable[[bool], T], *, offline_alternative: str) -> T:
    """Run ``load(local_files_only)`` against the hub and turn hub failures into BackboneError.

    Parameters
    ----------
    repo_id : str
        ``org/name`` on the Hugging Face Hub, named in error messages.
    load : callable
        Called with ``local_files_only``; must pass it on to the hub client.
    offline_alternative : str
        The Python call that loads a local copy instead, quoted in the offline error.
    """
    offline = work_offline()
    try:
        if offline:
            with _hub_offline_mode():
                return load(True)
        return load(False)
    except BackboneError:
        raise
    except Exception as err:
        translated = hub_error(repo_id, err, offline=offline,
                               offline_alternative=offline_alternative)
        if translated is None:
            raise
        raise translated from err


def hub_error(repo_id: str, err: BaseException, *, offline: bool,
              offline_alternative: str) -> BackboneError | None:
    """The user-facing error for a failed hub call, or None if ``err`` is not a hub failure."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    page = f"https://huggingface.co/{repo_id}"
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, GatedRepoError) or status in (401, 403):
        return BackboneError(
            f"'{repo_id}' is a gated model: request access on {page}, then log in with "
            "`hf auth login` or set the HF_TOKEN environment variable, and try again.")
    if isinstance(err, RepositoryNotFoundError) and not offline:
        return BackboneError(f"There is no model '{repo_id}' on the Hugging Face Hub ({page}); "
                             "check the id.")
    root = type(err).__module__.split(".")[0]  # httpx's successor is httpx2: any httpx*
    hubby = root in ("huggingface_hub", "requests", "urllib3") or root.startswith("httpx")
    if not (hubby or isinstance(err, (OSError, TimeoutError, HfHubHTTPError))):
        return None
    return offline_error(repo_id, offline_alternative,
                         None if offline else type(err).__name__)


def is_cached(repo_id: str, filenames: tuple[str, ...]) -> bool:
    """Whether one of ``filenames`` of ``repo_id`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in filenames)


def offline_error(repo_id: str, offline_alternative: str, why: str | None = None) -> BackboneError:
    """The error for a model that is neither downloadable now nor in the local cache."""
    page = f"https://huggingface.co/{repo_id}"
    why = why or ("HF_HUB_OFFLINE is set" if offline_requested()
                  else _unreachable_why or "huggingface.co cannot be reached or does not answer")
    advice = "" if offline_requested() else (
        " To use only the local cache without waiting for the network, set HF_HUB_OFFLINE=1.")
    return BackboneError(
        f"Could not download '{repo_id}' ({why}) and it is not in the local Hugging Face cache. "
        f"Download the weights on a machine with internet (from {page}) and load them from a "
        f"file: {offline_alternative}.{advice}",
        gui_hint=FILE_HINT)
