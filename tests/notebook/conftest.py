"""Fixtures for the notebook front end: a live Jupyter kernel driven like a browser would.

``KernelSession`` starts a real ipykernel (jupyter_client), executes cells, records every
widget ``comm_open`` / ``comm_msg`` on iopub with its arrival time, and sends button clicks
as the front end does (a ``comm_msg`` with ``{"method": "custom", "content": {"event": "click"}}``
on the shell channel). Nothing is mocked between the widget and the kernel's message loop.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("ipywidgets")


@dataclass
class CommUpdate:
    t: float          # seconds since the session started
    comm_id: str
    state: dict


@dataclass
class KernelSession:
    kc: Any
    t0: float = field(default_factory=time.perf_counter)
    comms: dict = field(default_factory=dict)        # comm_id -> initial state
    updates: list = field(default_factory=list)      # CommUpdate, in arrival order
    statuses: list = field(default_factory=list)     # (t, state, parent msg_id)
    streams: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def pump(self, timeout: float = 0.05) -> None:
        """Read every iopub message available within ``timeout``."""
        end = time.perf_counter() + timeout
        while True:
            left = end - time.perf_counter()
            try:
                msg = self.kc.get_iopub_msg(timeout=max(left, 0.001))
            except queue.Empty:
                return
            kind, content = msg["msg_type"], msg["content"]
            parent = msg["parent_header"].get("msg_id")
            if kind == "comm_open":
                self.comms[content["comm_id"]] = dict(content["data"].get("state", {}))
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                state = content["data"].get("state", {})
                self.comms.setdefault(content["comm_id"], {}).update(state)
                self.updates.append(CommUpdate(self.now(), content["comm_id"], state))
            elif kind == "status":
                self.statuses.append((self.now(), content["execution_state"], parent))
            elif kind == "stream":
                self.streams.append(content["text"])
            elif kind == "error":
                self.errors.append("\n".join(content["traceback"]))

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        end = time.perf_counter() + timeout
        while not predicate():
            if time.perf_counter() > end:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                                     f"errors={self.errors} "
                                     f"streams={''.join(self.streams)[-2000:]}")
            self.pump(0.05)

    def idle_after(self, msg_id: str) -> float | None:
        for t, state, parent in self.statuses:
            if parent == msg_id and state == "idle":
                return t
        return None

    def execute(self, code: str, timeout: float = 120.0) -> str:
        """Run a cell to completion; fail on an error; return what it printed."""
        n_streams = len(self.streams)
        msg_id = self.kc.execute(code)
        self.wait_for(lambda: self.idle_after(msg_id) is not None, timeout, "the cell to finish")
        reply = self.kc.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=timeout)
        if reply["content"]["status"] != "ok":
            trace = "\n".join(reply["content"].get("traceback", []))
            raise AssertionError("cell failed:\n" + trace)
        return "".join(self.streams[n_streams:])

    def find_comm(self, **match: Any) -> str:
        hits = [cid for cid, st in self.comms.items()
                if all(st.get(k) == v for k, v in match.items())]
        if len(hits) != 1:
            raise AssertionError(f"expected one widget with {match}, found {len(hits)}")
        return hits[0]

    def click(self, comm_id: str) -> str:
        """Send a button click exactly as JupyterLab does; return the message id."""
        msg = self.kc.session.msg("comm_msg", {
            "comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def set_value(self, comm_id: str, value: Any) -> str:
        """Move a control exactly as JupyterLab does (a state ``update`` from the front end)."""
        msg = self.kc.session.msg("comm_msg", {
            "comm_id": comm_id,
            "data": {"method": "update", "state": {"value": value}, "buffer_paths": []}})
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def values_of(self, comm_id: str, key: str) -> list[tuple[float, Any]]:
        return [(u.t, u.state[key]) for u in self.updates
                if u.comm_id == comm_id and key in u.state]


@pytest.fixture
def kernel():
    """A fresh python3 kernel with widget messages recorded; shut down afterwards."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    session = KernelSession(kc)
    try:
        yield session
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
