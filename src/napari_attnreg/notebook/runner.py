"""Run the engine generator without blocking the kernel: one chunk per worker-thread step.

In a Jupyter kernel the main thread runs an asyncio event loop that also handles widget
messages (button clicks, slider moves). :class:`BackgroundRunner` advances the engine
generator one ``next()`` at a time in a single worker thread (``loop.run_in_executor``) and
handles every event back on the event loop, so

- the kernel stays idle while a run computes: Cancel clicks and threshold moves are
  handled between chunks;
- widgets are only ever touched from the event-loop thread, which does not depend on how
  a given ipykernel version routes messages sent from other threads (ipykernel 7 changed
  that; see ipywidgets #4001/#4020) and never races with a slider callback.

Without a running loop (a plain script, a test) the same generator is drained in the
calling thread with the same callbacks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

from napari_attnreg.core.run.engine import CancelToken, RunCancelled

log = logging.getLogger(__name__)

#: A run: yields progress events, returns what the run produced (the service's Outcome).
RunGenerator = Generator[Any, None, Any]


@dataclass(frozen=True)
class Ended:
    """How the generator ended: ``done`` with its return value (the run's own outcome),
    ``cancelled``, or ``failed`` with an error."""

    kind: Literal["done", "cancelled", "failed"]
    result: Any = None
    error: BaseException | None = None


def _advance(gen: RunGenerator) -> tuple[str, Any]:
    # StopIteration must not cross a Future (asyncio turns it into RuntimeError)
    try:
        return "event", next(gen)
    except StopIteration as stop:
        return "done", stop.value


def _log_failure(err: Exception) -> None:
    # ValueError / MemoryError carry a user-facing message (the status line shows it); anything
    # else is a bug or a broken environment, so its traceback goes to the log as well
    expected = isinstance(err, (ValueError, MemoryError))
    log.log(logging.DEBUG if expected else logging.ERROR, "attention run failed: %s", err,
            exc_info=not expected)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread (the kernel's), or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class BackgroundRunner:
    """One run at a time: start, cancel, and report events and the outcome by callbacks.

    Parameters
    ----------
    on_event : callable
        Called with each progress event, on the thread that started the run.
    on_finish : callable
        Called once with the :class:`Ended`, on the same thread.
    """

    def __init__(self, on_event: Callable[[Any], Any], on_finish: Callable[[Ended], Any]):
        self._on_event = on_event
        self._on_finish = on_finish
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._token: CancelToken | None = None
        self.task: asyncio.Task | None = None
        self.running = False

    def start(self, make_generator: Callable[[CancelToken], RunGenerator], *,
              background: bool = True) -> Ended | None:
        """Start a run.

        Parameters
        ----------
        make_generator : callable
            Called with a fresh :class:`CancelToken`; returns the (not yet started) generator.
            Its body (model loading included) runs in the worker thread.
        background : bool
            With a running event loop, return at once and compute in the worker thread.
            Otherwise (or with ``background=False``) run to the end in this thread.

        Returns
        -------
        Ended or None
            None while a background run is still going.
        """
        if self.running:
            raise ValueError("A run is already in progress; cancel it or wait for it to finish.")
        self._token = CancelToken()
        gen = make_generator(self._token)
        self.running = True
        loop = running_loop() if background else None
        if loop is None:
            return self._run_here(gen)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="attnreg-run")
        self.task = loop.create_task(self._run_async(gen, self._executor))
        return None

    def cancel(self) -> None:
        """Ask the run to stop at the next chunk boundary (no-op when idle)."""
        if self._token is not None:
            self._token.cancel()

    @property
    def cancel_requested(self) -> bool:
        return self._token is not None and self._token.cancelled

    def _finish(self, outcome: Ended) -> Ended:
        self.running = False
        self._on_finish(outcome)
        return outcome

    def _run_here(self, gen: RunGenerator) -> Ended:
        try:
            while True:
                kind, value = _advance(gen)
                if kind == "done":
                    return self._finish(Ended("done", result=value))
                self._on_event(value)
        except RunCancelled:
            return self._finish(Ended("cancelled"))
        except KeyboardInterrupt:  # kernel interrupt during a blocking run: stop cleanly, re-raise
            gen.close()
            self._finish(Ended("cancelled"))
            raise
        except Exception as err:  # noqa: BLE001 -- any failure goes to the status line, not the kernel
            _log_failure(err)
            return self._finish(Ended("failed", error=err))

    async def _run_async(self, gen: RunGenerator, executor: concurrent.futures.Executor) -> Ended:
        loop = asyncio.get_running_loop()
        try:
            while True:
                kind, value = await loop.run_in_executor(executor, _advance, gen)
                if kind == "done":
                    return self._finish(Ended("done", result=value))
                self._on_event(value)
        except RunCancelled:
            return self._finish(Ended("cancelled"))
        except asyncio.CancelledError:
            # the task itself was cancelled (kernel shutting down): stop the generator after the
            # step that may still be running in the worker; the executor runs jobs in order
            if self._token is not None:
                self._token.cancel()
            executor.submit(gen.close)
            self._finish(Ended("cancelled"))
            raise
        except Exception as err:  # noqa: BLE001 -- an escaping error would kill the task silently
            _log_failure(err)
            return self._finish(Ended("failed", error=err))

    def shutdown(self) -> None:
        """Cancel any run and let the worker thread end."""
        self.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
