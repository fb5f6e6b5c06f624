"""Batches on a Dask cluster: one task per image, workers keep their model, results on disk.

Needs the ``scale`` extra (``pip install "napari-attnreg[scale]"``). A local cluster of
``workers`` processes, or any running scheduler (``scheduler="tcp://host:8786"``, e.g. one
started by dask-jobqueue on SLURM; see ``docs/scale-out.md``). Every task runs the batch's
per-image function (:func:`~napari_attnreg.batch.run.process_item`, handed in by
:func:`~napari_attnreg.batch.run.run_batch`), which runs the image through the pipeline
service like a serial batch and writes that image's result files itself; the service's
model cache keeps a worker's model for its next image. Results equal a serial run bit for bit
when both use the same number of torch threads per process (one, on a local cluster): each
image's nulls are seeded from the run's seed and the null index only, while CPU matrix
products block their sums by thread count.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from napari_attnreg.batch.items import BatchItem
from napari_attnreg.batch.summary import Row, failed_row

#: Seconds to wait for a scheduler to answer before saying it cannot be reached.
SCHEDULER_TIMEOUT_S = 20


def check_workers(workers: int | None) -> None:
    """``--workers`` must be a positive count (0 would silently mean a serial run)."""
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ValueError(f"--workers must be a positive number of processes, got {workers!r}; "
                         "leave it out to run serially.")


def check_dask() -> None:
    """Dask (with distributed) must be importable for ``--workers`` / ``--scheduler``.

    Raises
    ------
    ValueError
        Naming the pip command; asked before the output folder or any image is touched.
    """
    try:
        import dask.distributed  # noqa: F401
    except ImportError as err:
        raise ValueError("--workers / --scheduler need Dask, which is not installed: pip "
                         "install 'napari-attnreg[scale]' (dask[distributed]), or leave "
                         f"them out to run serially. ({err})") from None


def _client(workers: int | None, scheduler: str | None) -> tuple[Any, Any]:
    from dask.distributed import Client, LocalCluster

    if scheduler:
        check_scheduler(scheduler)
        try:
            return Client(scheduler, timeout=SCHEDULER_TIMEOUT_S), None
        except (OSError, TimeoutError) as err:
            raise ValueError(_unreachable(scheduler, err)) from None
    check_workers(workers)
    # one thread per process: torch's own threads would fight over the same cores
    cluster = LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                           dashboard_address=None)
    return Client(cluster), cluster


def check_scheduler(address: str) -> None:
    """Ask ``address`` who it is, all within :data:`SCHEDULER_TIMEOUT_S`.

    Dask's client waits without a deadline for the greeting of a server that accepts
    connections but never speaks, and reads a stranger's bytes as a message length (an
    allocation of exabytes); so the scheduler is asked first, under one deadline, in a
    thread of its own (a notebook's event loop may be running here).

    Raises
    ------
    ValueError
        Nothing answers, something that is not a Dask scheduler answers, or it is silent.
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    try:  # refused or unroutable: said as such, not as a silent server
        _tcp_connect(address)
    except OSError as err:
        raise ValueError(_unreachable(address, err)) from None
    with ThreadPoolExecutor(1) as pool:
        try:
            reply = pool.submit(asyncio.run, _identity(address)).result()
        except TimeoutError:
            raise ValueError(
                f"Something at {address} accepts connections but no Dask scheduler answered "
                f"within {SCHEDULER_TIMEOUT_S} s; check the address (a scheduler listens on "
                "port 8786 unless told otherwise), or leave out --scheduler to run "
                "here.") from None
        except OSError as err:
            raise ValueError(_unreachable(address, err)) from None
        except Exception as err:  # noqa: BLE001  whatever a stranger's bytes make of the reader
            reply = err
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        seen = f"{type(reply).__name__}: {str(reply)[:80]}"
        raise ValueError(f"What answers at {address} is not a Dask scheduler ({seen}); check "
                         "the address, or leave out --scheduler to run here.")


def _tcp_connect(address: str) -> None:
    """Open and close a TCP connection to a ``tcp://``/``tls://`` address (others: nothing)."""
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return
        host, port = parse_host_port(location, default_port=8786)
    except ValueError as err:
        raise ValueError(f"--scheduler {address!r} is not a scheduler address "
                         f"(tcp://host:port): {err}") from None
    socket.create_connection((host, port), timeout=SCHEDULER_TIMEOUT_S).close()


async def _identity(address: str) -> Any:
    """The scheduler's ``identity`` reply, read under one deadline."""
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=SCHEDULER_TIMEOUT_S)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), SCHEDULER_TIMEOUT_S)


def _unreachable(address: str, err: BaseException) -> str:
    return (f"Cannot reach the Dask scheduler at {address} within {SCHEDULER_TIMEOUT_S} s "
            f"({type(err).__name__}); check the address and that the scheduler is running, "
            "or leave out --scheduler to run here.")


def run_on_dask(task: Callable[..., list[Row]], items: Sequence[BatchItem], out_dir: Path,
                model: Any, arch: str | None, opts: dict[str, Any], *, overwrite: bool = False,
                quiet: bool = False, figure: Callable[..., Any] | None = None,
                workers: int | None = None,
                scheduler: str | None = None, geojson: bool = False) -> Iterator[list[Row]]:
    """Submit one task per item; yield each item's summary rows as its task finishes.

    Parameters
    ----------
    task : callable
        ``task(item, out_dir, model, arch, opts, overwrite=, quiet=, figure=, geojson=)``
        → the item's rows; :func:`~napari_attnreg.batch.run.process_item`, importable on
        every worker.
    items, out_dir, model, arch, opts, overwrite, figure, geojson
        As for :func:`~napari_attnreg.batch.run.run_batch`; ``model`` must be a name or a
        file every worker can load, not a loaded model.
    quiet : bool
        No progress bar over the images.
    workers, scheduler
        A local cluster of ``workers`` processes, or the address of a running scheduler.

    A task that raises (a worker died, the model failed to load there) becomes a
    ``failed`` row for its image; the other tasks go on.
    """
    from napari_attnreg.core.models.backbones import Backbone

    if isinstance(model, Backbone):
        raise ValueError(
            "A Dask batch needs a model name or weights file that every worker can "
                         "load, not a loaded model object.")
    check_dask()  # its pip command, not a traceback from the imports below
    from dask.base import tokenize
    from dask.distributed import as_completed
    from tqdm import tqdm

    client, cluster = _client(workers, scheduler)
    out_dir = Path(out_dir).resolve()  # workers have their own working folders
    batch = uuid.uuid4().hex  # keys unique per batch: a shared scheduler reuses equal keys
    try:
        futures = {
            client.submit(task, item, out_dir, model, arch, opts, overwrite=overwrite,
                          quiet=True, figure=figure, geojson=geojson, pure=False,
                          key=f"attnreg-{batch}-{i}-{tokenize(str(item.source))}"): item
            for i, item in enumerate(items)
        }
        with tqdm(total=len(futures), desc="images", unit="img", disable=quiet,
                  file=sys.stderr) as bar:
            for future in as_completed(futures):
                item = futures[future]
                try:
                    rows = future.result()
                except Exception as err:  # noqa: BLE001  one task's failure must not end the batch
                    rows = [failed_row(item, None, f"task failed on its worker: {err}")]
                bar.update(1)
                yield rows
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
