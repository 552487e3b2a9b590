"""GPU workers (``%cluster start --gpus``), checked without a GPU.

The device list comes from ``jupyter-cluster.local.gpu-devices`` (fake devices);
the workers are real processes, so what is checked is real: each worker
process's ``CUDA_VISIBLE_DEVICES``, the ``GPU`` resource the scheduler knows,
and that items asking for ``GPU=1`` run there one at a time per device.
"""

from __future__ import annotations

import os

import dask.config
import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster.backends import local
from jupyter_cluster.errors import ClusterError


@pytest.fixture
def no_config_devices():
    with dask.config.set({"jupyter-cluster.local.gpu-devices": None}):
        yield


@pytest.mark.parametrize(
    "env, expected",
    [("0,1", ["0", "1"]), ("2, 3", ["2", "3"]), ("GPU-5e1c3a9b-0c1d", ["GPU-5e1c3a9b-0c1d"]), ("", []), ("-1", [])],
)
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch, no_config_devices, env, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert local.visible_gpus() == expected


def test_configured_devices_win(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with dask.config.set({"jupyter-cluster.local.gpu-devices": "4,5"}):
        assert local.visible_gpus() == ["4", "5"]
        assert local.select_gpus(True) == ["4", "5"]
        assert local.select_gpus("5") == ["5"]
        with pytest.raises(
            ClusterError, match=r"--gpus 7 does not name distinct visible GPUs; the visible ones are 4, 5\."
        ):
            local.select_gpus("7")
        with pytest.raises(ClusterError, match="distinct"):
            local.select_gpus("4,4")


def test_worker_specs_pin_one_device_each():
    specs = local.gpu_worker_specs(["0", "3"], threads=2, memory_limit="4GiB", host="127.0.0.1", security=None)
    assert list(specs) == ["gpu-0", "gpu-3"]
    for device, spec in zip(["0", "3"], specs.values()):
        assert spec["options"]["env"] == {"CUDA_VISIBLE_DEVICES": device}
        assert spec["options"]["resources"] == {"GPU": 1}
        assert spec["options"]["nthreads"] == 2


def test_no_gpus_is_one_sentence(ip):
    with dask.config.set({"jupyter-cluster.local.gpu-devices": []}):
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("cluster", "start --gpus")
    message = str(info.value)
    assert message.startswith("this machine has no visible GPUs")
    assert "leave out --gpus" in message and "\n" not in message
    assert not jc.cluster.session.handles()


def test_gpus_and_workers_conflict():
    with dask.config.set({"jupyter-cluster.local.gpu-devices": ["0", "1"]}):
        with pytest.raises(ClusterError, match="one worker per GPU \\(2 here\\)"):
            jc.start(gpus=True, workers=3)


def _device_and_window(i):
    import os
    import time

    start = time.monotonic()
    time.sleep(0.3)
    return os.environ.get("CUDA_VISIBLE_DEVICES"), start, time.monotonic(), i


def test_gpu_cluster_pins_workers_and_places_items(ip, capsys):
    """Two fake GPUs: two pinned workers; GPU=1 items never share a device."""
    with dask.config.set({"jupyter-cluster.local.gpu-devices": ["0", "1"]}):
        ip.run_line_magic("cluster", "start --gpus --threads 2 --name gpu-test")
    handle = jc.cluster.session.get("gpu-test")
    try:
        assert "Started cluster 'gpu-test'" in capsys.readouterr().out
        client = handle.client
        by_name = {w["name"]: w for w in handle.model()["workers"]}
        assert sorted(by_name) == ["gpu-0", "gpu-1"]
        assert all(w["resources"] == {"GPU": 1} for w in by_name.values())
        pins = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        names = {addr: w["name"] for addr, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        assert {names[a]: pin for a, pin in pins.items()} == {"gpu-0": "0", "gpu-1": "1"}

        # Each worker has 2 threads but 1 GPU: items asking for GPU=1 run one at a time per device.
        futures = client.map(_device_and_window, range(6), resources={"GPU": 1}, pure=False)
        results = client.gather(futures)
        assert sorted(r[3] for r in results) == list(range(6))
        assert {r[0] for r in results} == {"0", "1"}
        for device in ("0", "1"):
            windows = sorted((s, e) for d, s, e, _ in results if d == device)
            assert all(prev_end <= start + 1e-3 for (_, prev_end), (start, _) in zip(windows, windows[1:])), windows

        # A %%parallel cell asking for a GPU runs on the pinned workers.
        ip.run_cell_magic(
            "parallel",
            "i in range(4) --resources GPU=1 --out gpu_pins --no-progress",
            "import os\n(i, os.environ.get('CUDA_VISIBLE_DEVICES'))\n",
        )
        got = ip.user_ns["gpu_pins"]
        assert [g[0] for g in got] == [0, 1, 2, 3] and {g[1] for g in got} <= {"0", "1"}
    finally:
        handle.close()


def test_cuda_cluster_used_when_installed():
    """Without dask-cuda (as here) the SpecCluster path is taken; with it, LocalCUDACluster."""
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        assert local._cuda_cluster_class() is None
    else:  # pragma: no cover - only on machines with dask-cuda
        from dask_cuda import LocalCUDACluster

        assert local._cuda_cluster_class() is LocalCUDACluster
