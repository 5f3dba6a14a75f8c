"""`znni plan --workers N` (the job on a Dask cluster), `--block` as `znni segment` takes it,
and `znni plan --measure-store` on a real local directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.engine_ref import small_network, write_network, write_volume

from znni.cli import main


@pytest.fixture()
def setup(tmp_path: Path) -> dict:
    rng = np.random.default_rng(5)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=(40, 40, 40)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (8, 8, 8))
    base = ["plan", str(spec), "--machine", "ci-2core", "--input", inp, "--chunks", "8,8,8"]
    return {"tmp": tmp_path, "base": base}


def _json(capsys, argv: list[str]) -> dict:  # noqa: ANN001
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_workers_on_nodes_and_on_this_host(setup: dict, capsys) -> None:  # noqa: ANN001
    base = [*setup["base"], "--block", "16,16,16"]
    plan = _json(capsys, base)
    assert plan["block_shape"] == [16, 16, 16]  # --block: its plain grid, as segment cuts
    assert plan["block_edges"] == [[0, 16, 32, 40]] * 3 and "cluster" not in plan
    nodes = _json(capsys, [*base, "--workers", "2", "--store-bandwidth", "2MB/s"])["cluster"]
    assert (nodes["workers"], nodes["placement"], nodes["machine"]) == (2, "nodes", "ci-2core")
    assert nodes["blocks"] == plan["job_seconds"]["blocks"] == 27
    assert nodes["store_bandwidth_bytes_per_s"] == 2e6
    assert nodes["store_io_s"] == pytest.approx(
        (nodes["read_bytes"] + nodes["write_bytes"]) / 2e6)
    assert nodes["write_bytes"] == 40**3 * 2 * 4  # two float32 channels
    assert nodes["bottleneck"] in ("compute", "store bandwidth", "start-up")
    host = _json(capsys, [*base, "--scheduler", "local:2"])["cluster"]
    assert (host["placement"], host["workers"]) == ("host", 2)
    deadline = _json(capsys, [*base, "--deadline", "1h"])["cluster"]
    assert deadline["deadline_workers"] == 1 and deadline["deadline_s"] == 3600
    assert main([*base, "--workers", "3", "--queue-wait", "10m"]) == 0
    text = capsys.readouterr().out
    assert "cluster: 3 nodes of ci-2core" in text and "queue wait 600 s" in text
    assert "bottleneck: start-up" in text  # ten minutes' wait for a second of blocks


@pytest.mark.parametrize("extra, words", [
    (["--workers", "2", "--store-bandwidth", "fast"], "store bandwidth 'fast' is not a rate"),
    (["--store-bandwidth", "2GB/s"], "--store-bandwidth needs --workers"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--workers", "2", "--deadline", "soon"], "--deadline 'soon' is not a duration"),
    (["--workers", "2", "--scheduler", "local:3"], "ask for different numbers of workers"),
    (["--scheduler", "tcp://h:8786"], "give --workers N"),
    (["--scheduler", "yarn:4"], "is not local:N"),
])
def test_bad_cluster_options_are_one_sentence(setup: dict, capsys, extra: list[str],
                                              words: str) -> None:  # noqa: ANN001
    assert main([*setup["base"], *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_workers_need_an_input(setup: dict, capsys) -> None:  # noqa: ANN001
    assert main(["plan", setup["base"][1], "--machine", "ci-2core", "--workers", "2"]) == 2
    assert "need --input" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "needs a NETWORK" in capsys.readouterr().err


def test_measure_store_on_a_local_directory(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    store.mkdir()
    record = _json(capsys, ["plan", "--measure-store", str(store), "--measure-size", "8MiB"])
    assert record["bytes"] >= 8 * 2**20 and record["chunks"] >= 2
    for key in ("write_bytes_per_s", "read_bytes_per_s", "bytes_per_s"):
        assert record[key] > 0
    assert record["store_bandwidth"].endswith("B/s")
    assert list(store.iterdir()) == []  # the scratch array is removed
    assert main(["plan", "--measure-store", str(store), "--measure-size", "4MiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("--store-bandwidth ") and "wrote 4 MB" in lines[0]
    assert main(["plan", "--measure-store", str(store), "--measure-size", "1kB"]) == 2
    assert "under one chunk" in capsys.readouterr().err


def test_graph_model_blocks_on_workers(setup: dict, capsys, onnx_models, tmp_path: Path
                                       ) -> None:  # noqa: ANN001
    """An ONNX model's blocks (alike, as its whole-run prediction prices them) on 2 nodes:
    the 27 blocks --block cuts, 14 rounds of one block each."""
    path = onnx_models.copy("unet", tmp_path / "unet.onnx")  # a graph (a chain would not be)
    capsys.readouterr()  # MONAI prints as it builds the models
    argv = ["plan", str(path), *setup["base"][2:], "--block", "16,16,16", "--workers", "2"]
    plan = _json(capsys, argv)
    job, cluster = plan["job_seconds"], plan["cluster"]
    assert job["blocks"] == cluster["blocks"] == 27 and cluster["makespan_method"] == "uniform"
    one = job["block_compute_s"] + job["block_read_s"] + job["block_write_s"]
    assert cluster["compute_makespan_s"] == pytest.approx(14 * one)
    assert cluster["write_bytes"] == 27 * job["block_write_bytes"] == 27 * 16**3 * 3 * 4
