"""A batch on a 2-process Dask LocalCluster equals the serial batch bit for bit."""

from __future__ import annotations

import csv
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch

pytest.importorskip("dask.distributed")

from napari_attnreg import AttentionResult
from napari_attnreg.batch.items import collect_inputs
from napari_attnreg.batch.run import run_batch
from napari_attnreg.cli import main

OPTS = {"n_boot": 6, "device": "cpu", "seed": 3}


def _images(folder, n=6):
    folder.mkdir()
    for i in range(n):
        rng = np.random.default_rng(i)
        img = 200 + 30 * rng.standard_normal((64 + 8 * i, 72))
        img[10 + i:24 + i, 30:44] += 1500
        tifffile.imwrite(folder / f"img{i}.tif", img.astype(np.uint16))
    (folder / "broken.tif").write_bytes(b"not a tiff at all")


def _maps(path):
    res = AttentionResult.load(path)
    return {"attention": res.attention, "head_attention": res.head_attention,
            **res.maps}, res.pi0


@pytest.mark.slow
def test_two_workers_equal_a_serial_run_bit_for_bit(tmp_path):
    from dask.distributed import Client, LocalCluster

    from napari_attnreg.core.run import service
    from napari_attnreg.core.run.service import ModelSpec

    _images(tmp_path / "in")
    items = collect_inputs([tmp_path / "in"])
    # CPU matrix products block their sums by thread count; the workers run one thread each
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = run_batch(items, tmp_path / "serial", "demo", None, OPTS, quiet=True)
    finally:
        torch.set_num_threads(threads)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        report = run_batch(items, tmp_path / "dask", "demo", None, OPTS, quiet=True,
                           scheduler=cluster.scheduler_address)
        # each worker process loaded the model once and kept it for its later images
        loaded = client.run(service.cached_models)
    assert all(keys == [ModelSpec("demo").key()] for keys in loaded.values()) and len(loaded) == 2
    assert len(serial.failed) == len(report.failed) == 1  # broken.tif, reported, others went on
    assert "broken.tif" in report.failed[0]["source"]
    done = sorted(r["output"].split("/")[-1] for r in report.rows if r["status"] == "done")
    assert done == [f"img{i}.tif.attnreg.npz" for i in range(6)]
    for i in range(6):
        a, pi0_a = _maps(tmp_path / "serial" / f"img{i}.tif.attnreg.npz")
        b, pi0_b = _maps(tmp_path / "dask" / f"img{i}.tif.attnreg.npz")
        assert pi0_a == pi0_b
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"img{i} {name}")
    with open(tmp_path / "dask" / "summary.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 7


@pytest.mark.slow
def test_workers_option_of_the_command_line(tmp_path, capsys):
    _images(tmp_path / "in", n=2)
    out = tmp_path / "out"
    code = main(["run", str(tmp_path / "in"), "--out", str(out), "--model", "demo", "--n-boot", "4",
                 "--device", "cpu", "--workers", "2", "--quiet"])
    assert code == 1  # broken.tif failed, the others were written
    assert sorted(p.name for p in out.glob("*.attnreg.npz")) == ["img0.tif.attnreg.npz",
                                                                 "img1.tif.attnreg.npz"]
    assert "broken.tif" in capsys.readouterr().err


def test_batches_sharing_a_scheduler_never_swap_results(tmp_path, monkeypatch):
    from dask.distributed import Client, LocalCluster

    from napari_attnreg.batch.summary import SUMMARY_COLUMNS

    _images(tmp_path / "in", n=1)
    monkeypatch.chdir(tmp_path)
    items = collect_inputs([tmp_path / "in" / "img0.tif"])
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        # another batch on this scheduler still holds its first task's result
        other = {**dict.fromkeys(SUMMARY_COLUMNS, ""), "source": "another batch's image",
                 "status": "done"}
        held = client.submit(lambda: [other], key="attnreg-0", pure=False)
        held.result()
        report = run_batch(items, "rel-out", "demo", None, OPTS, quiet=True,
                           scheduler=cluster.scheduler_address)
    assert [r["source"] for r in report.rows] == [str(items[0].source)]
    # a relative --out is resolved here, not in each worker's own working folder
    assert Path(report.rows[0]["output"]).is_absolute()
    assert (tmp_path / "rel-out" / "img0.tif.attnreg.npz").is_file()


def test_an_unreachable_scheduler_or_zero_workers_is_a_clear_error(tmp_path, monkeypatch):
    from napari_attnreg.batch import distributed
    _images(tmp_path / "in", n=1)
    items = collect_inputs([tmp_path / "in" / "img0.tif"])
    monkeypatch.setattr(distributed, "SCHEDULER_TIMEOUT_S", 1)
    with socket.socket() as free:  # a port on this machine where nothing listens
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ValueError, match=f"Cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"):
        run_batch(items, tmp_path / "out", "demo", None, OPTS, scheduler=f"tcp://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="--workers must be a positive number"):
        run_batch(items, tmp_path / "out", "demo", None, OPTS, workers=0)


def test_dask_tasks_run_each_image_through_the_pipeline_service(tmp_path, monkeypatch):
    """In-process workers (processes=False) share this module's service, so a spy sees them."""
    from dask.distributed import Client, LocalCluster, get_worker

    from napari_attnreg.core.run import service

    ran = []
    real = service.run_job

    def counting_job(job, cancel=None):
        try:
            where = get_worker().address
        except ValueError:  # not inside a Dask task
            where = None
        ran.append((Path(job.config.extra["source"]).name, job.planes, where))
        return real(job, cancel)

    monkeypatch.setattr(service, "run_job", counting_job)
    _images(tmp_path / "in", n=2)
    items = collect_inputs([tmp_path / "in"])
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster):
        report = run_batch(items, tmp_path / "out", "demo", None, OPTS, quiet=True,
                           scheduler=cluster.scheduler_address)
        worker = next(iter(cluster.workers.values())).address
    assert sorted(ran) == [("img0.tif", [()], worker), ("img1.tif", [()], worker)]
    assert sorted(r["status"].split(":")[0] for r in report.rows) == ["done", "done", "failed"]
    assert "broken.tif" in report.failed[0]["source"]  # unreadable: failed before any job


@pytest.fixture
def stranger():
    """A loopback TCP server that is no Dask scheduler: it accepts every connection and then
    says nothing, or sends bytes of its own (``stranger(reply)`` gives its address)."""
    import threading

    servers = []

    def start(reply: bytes) -> str:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        servers.append(server)
        held = []  # connections stay open (silent) until the test ends

        def serve():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                held.append(conn)
                if reply:
                    conn.sendall(reply)

        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{server.getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("reply, said", [(b"", "no Dask scheduler answered within 2 s"),
                                         (b"\xff" * 64, "is not a Dask scheduler"),
                                         (b"HTTP/1.1 400 Bad Request\r\n\r\n",
                                          "is not a Dask scheduler")])
def test_a_server_that_is_not_dask_is_a_clear_error_within_the_timeout(
        tmp_path, monkeypatch, stranger, reply, said):
    """Issue #27 item 9: a silent server hung the batch past 200 s; garbage bytes were read
    as a message length (``Unable to allocate 3.07 EiB``)."""
    import time

    from napari_attnreg.batch import distributed
    _images(tmp_path / "in", n=1)
    items = collect_inputs([tmp_path / "in" / "img0.tif"])
    monkeypatch.setattr(distributed, "SCHEDULER_TIMEOUT_S", 2)
    address = stranger(reply)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=said) as info:
        run_batch(items, tmp_path / "out", "demo", None, OPTS, scheduler=address)
    assert time.perf_counter() - t0 < 10
    assert address in str(info.value)


def test_workers_without_dask_name_the_pip_command(tmp_path, monkeypatch, capsys):
    """--workers on an install without the scale extra: one line with the pip command,
    exit 2, no output folder; it was a traceback ending in 'No module named dask'."""
    tifffile.imwrite(tmp_path / "a.tif", np.random.default_rng(0).integers(0, 999, (48, 48)))
    for name in [m for m in sys.modules if m == "dask" or m.startswith("dask.")] + ["dask"]:
        monkeypatch.setitem(sys.modules, name, None)  # "import dask..." raises ImportError
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "a.tif"), "--workers", "2", "--out", str(out),
                 "--n-boot", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'napari-attnreg[scale]'" in err and "Traceback" not in err
    assert not out.exists()
