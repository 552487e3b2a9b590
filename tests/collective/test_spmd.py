"""``%%spmd`` and ``jupyter_cluster.collective.client``: real 2-worker clusters, real gloo process groups.

Every test runs real torch.distributed collectives between two Dask worker
processes.  The failure tests bound the time the notebook waits: a rank that
raises, a rank whose worker is SIGKILLed in the middle of a collective, and a
Ctrl-C all end the cell within seconds, and the next ``%%spmd`` cell works.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

pytest.importorskip("torch")

import jupyter_cluster as jc
from jupyter_cluster.collective import groups as spmd_groups
from jupyter_cluster.collective import worker as spmd_worker
from jupyter_cluster.engine.cluster import workers_now
from jupyter_cluster.errors import ClusterError

from ..conftest import wait_for
from ..helpers import ANSI, kernel_execute


@pytest.fixture(scope="module")
def cluster():
    handle = jc.start(workers=2, threads=1)
    handle.wait_for_workers(2, timeout=60)
    yield handle
    spmd_groups._groups.pop(handle.address, None)
    if not handle.closed:
        handle.close()


@pytest.fixture
def shell(ip, cluster, capsys):
    """The IPython shell with the module's cluster current; output captured."""
    from jupyter_cluster.cluster import session

    if session.current() is not cluster:
        session.connect(cluster.name)
    capsys.readouterr()
    return ip


def run_cell(ip, text: str):
    result = ip.run_cell(text)
    return result


def _out(capsys) -> str:
    captured = capsys.readouterr()
    return ANSI.sub("", captured.out + captured.err)


def _all_reduce_works(shell) -> None:
    """A %%spmd cell's all_reduce of ones over the 2 ranks gives 2.0 on each: the group works."""
    res = run_cell(
        shell,
        "%%spmd --out total\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n",
    )
    assert res.error_in_exec is None, res.error_in_exec
    assert shell.user_ns["total"] == {0: 2.0, 1: 2.0}


def _statuses(cluster):
    return cluster.client.run(spmd_worker.status)


def _interrupt_when_running(cluster, holder, settle=0.3):
    """Ctrl-C the notebook once every rank is inside the cell (polled from this thread)."""

    def go():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if all(s["running"] for s in _statuses(cluster).values()):
                    break
            except Exception:  # noqa: BLE001 - a worker busy starting: ask again
                pass
            time.sleep(0.1)
        time.sleep(settle)
        holder["at"] = time.monotonic()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # what the stop button sends

    thread = threading.Thread(target=go)
    thread.start()
    return thread


# -- what runs, and where --------------------------------------------------------------------
def test_ranks_env_and_collectives(shell, cluster, capsys):
    shell.user_ns["scale"] = 10.0  # a notebook value the cell reads: shipped as in %%parallel
    res = run_cell(
        shell,
        """%%spmd --out info
import os
import torch
import torch.distributed as dist
t = torch.tensor([float(rank + 1)]) * scale
dist.all_reduce(t)
send = torch.arange(4, dtype=torch.float32) + 100 * rank   # chunk j goes to rank j
recv = torch.empty(4)
dist.all_to_all_single(recv, send)
print(f"rank {rank} of {world_size}: sum {t.item()}")
(rank, world_size, dist.get_rank(), dist.get_world_size(), t.item(), recv.tolist(),
 {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")})
""",
    )
    assert res.error_in_exec is None, res.error_in_exec
    out = _out(capsys)
    info = shell.user_ns["info"]
    assert sorted(info) == [0, 1]
    for r, (rank, ws, drank, dws, total, recv, env) in info.items():
        assert (rank, ws, drank, dws) == (r, 2, r, 2)
        assert total == 30.0  # (1 + 2) * 10
        # rank r receives chunk r of every rank's send: [2r, 2r+1] + 100 * source
        assert recv == [2 * r, 2 * r + 1, 100 + 2 * r, 101 + 2 * r]
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == str(r)  # both workers are on this host
        assert env["MASTER_ADDR"] == spmd_groups.group(cluster).hosts[0]
    # rank 0's print is shown, labelled; rank 1's is not (by default)
    assert "[rank 0] rank 0 of 2: sum 30.0" in out
    assert "[rank 1]" not in out


def test_state_persists_per_rank_and_shadows_notebook_names(shell, cluster, capsys):
    res = run_cell(
        shell,
        """%%spmd
import torch
torch.manual_seed(rank)
model = torch.nn.Linear(3, 1)
counter = rank * 100
""",
    )
    assert res.error_in_exec is None, res.error_in_exec
    shell.user_ns["model"] = "the notebook's own model"  # must not replace the ranks' models
    shell.user_ns["counter"] = -1
    res = run_cell(
        shell,
        """%%spmd --out state --show all
counter += 1
print("counter", counter)
(type(model).__name__, counter, round(float(model.weight.sum()), 6))
""",
    )
    assert res.error_in_exec is None, res.error_in_exec
    state = shell.user_ns["state"]
    assert state[0][:2] == ("Linear", 1) and state[1][:2] == ("Linear", 101)
    assert state[0][2] != state[1][2]  # each rank has its own model (seeded by rank)
    out = _out(capsys)
    assert "[rank 0] counter 1" in out and "[rank 1] counter 101" in out  # --show all


class _TimedStream:
    """A real text stream that notes when each line was written."""

    def __init__(self, below):
        self.below = below
        self.lines: list[tuple[float, str]] = []

    def write(self, text):
        for line in text.splitlines():
            if line.strip():
                self.lines.append((time.monotonic(), line))
        return self.below.write(text)

    def flush(self):
        self.below.flush()

    def __getattr__(self, name):
        return getattr(self.below, name)


def test_output_appears_while_the_cell_runs(shell, cluster, monkeypatch):
    import sys

    stream = _TimedStream(sys.stdout)
    monkeypatch.setattr(sys, "stdout", stream)
    res = run_cell(
        shell,
        """%%spmd --show all --no-progress
import time
print(f"start {rank}")
time.sleep(2.5)
print(f"end {rank}", end="")
""",
    )
    ended = time.monotonic()
    monkeypatch.undo()
    assert res.error_in_exec is None, res.error_in_exec
    when = {line: t for t, line in stream.lines}
    assert set(when) >= {"[rank 0] start 0", "[rank 1] start 1", "[rank 0] end 0", "[rank 1] end 1"}, stream.lines
    for r in (0, 1):
        assert ended - when[f"[rank {r}] start {r}"] > 1.5, "the first line waited for the end of the cell"
    assert [line for _, line in stream.lines].count("[rank 0] start 0") == 1  # printed once, not again at the end


def test_python_api_shares_the_group_and_state(shell, cluster):
    def grab(rank, world_size, state, offset=0):
        import torch
        import torch.distributed as dist

        t = torch.tensor([rank + offset])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return rank, world_size, int(t.item()), state.get("counter")

    before = spmd_groups.group(cluster)
    out = jc.spmd(grab, offset=5, show=None)
    assert out == {0: (0, 2, 6, 1), 1: (1, 2, 6, 101)}  # counter set by the %%spmd cells above
    assert spmd_groups.group(cluster) is before  # same group, not rebuilt


def test_the_rendezvous_store_is_shared_by_the_ranks_over_the_cluster_comm(shell, cluster):
    """The group's store (keys kept on rank 0's worker, reached over the Dask comm instead of a TCPStore
    port) behaves as a torch.distributed.Store between ranks: writes, blocking reads, counters,
    compare-and-set, a wait for a key that never comes fails in one clear sentence, and a later
    dist.new_group (which needs the store after init_process_group returned) works."""

    def use_store(rank, world_size):
        import datetime

        import torch
        import torch.distributed as dist

        prefixed = dist.distributed_c10d._get_default_store()
        store = dist.PrefixStore("jc-test", prefixed)
        got = {"kind": type(prefixed.underlying_store).__name__}
        if rank == 1:
            store.set("hello", "from rank 1")
        got["read"] = store.get("hello")  # rank 0 waits here for rank 1's write
        store.add("count", rank + 1)
        if rank == 0:
            got["cas"] = [store.compare_set("cas", "", "first"), store.compare_set("cas", "wrong", "x")]
        dist.barrier()
        got["count"] = store.get("count")
        got["multi"] = store.multi_get(["hello", "count"])
        got["check"] = (store.check(["hello"]), store.check(["never-written"]))
        if rank == 1:
            got["cas"] = [store.compare_set("cas", "first", "second"), store.get("cas")]
        t0 = time.monotonic()
        try:
            store.wait(["never-written"], datetime.timedelta(seconds=1))
            got["wait"] = "returned"
        except Exception as exc:  # noqa: BLE001 - the message is asserted
            got["wait"] = (type(exc).__name__, str(exc))
        got["waited"] = time.monotonic() - t0
        sub = dist.new_group([0, 1])  # rendezvous through the same store, after init_process_group returned
        t = torch.ones(1)
        dist.all_reduce(t, group=sub)
        got["subgroup"] = t.item()
        dist.barrier()
        return got

    out = jc.spmd(use_store, show=None)
    for got in out.values():
        assert got["kind"] == "ClusterStore"
        assert got["read"] == b"from rank 1"
        assert got["count"] == b"3" and got["multi"] == [b"from rank 1", b"3"]
        assert got["check"] == (True, False)
        name, text = got["wait"]
        assert name == "DistStoreError" and "Timed out after 1 s waiting for the rendezvous keys" in text, text
        assert 0.9 < got["waited"] < 30
        assert got["subgroup"] == 2.0
    assert out[0]["cas"] == [b"first", b"first"] and out[1]["cas"] == [b"second", b"second"]


def test_gloo_and_nccl_listen_on_the_workers_interface_unless_the_user_chose(monkeypatch):
    """Left alone, gloo listens on the address the host name resolves to, which may face the network
    although the cluster is loopback only; the rank sets GLOO_/NCCL_SOCKET_IFNAME to the interface of
    its worker's address, and keeps a value the user set."""
    import psutil

    loopback = next(
        name for name, addrs in psutil.net_if_addrs().items() if any(a.address == "127.0.0.1" for a in addrs)
    )
    assert spmd_worker._interface_of("127.0.0.1") == loopback
    assert spmd_worker._interface_of("192.0.2.1") is None  # TEST-NET-1: no interface has it, nothing is set
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "users-choice")
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(spmd_worker.IFNAME_MARK + var, raising=False)
    spmd_worker._bind_to_worker_interface("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == loopback
    assert os.environ["NCCL_SOCKET_IFNAME"] == "users-choice"


def test_an_inherited_interface_this_package_chose_is_rebound_in_a_new_process(monkeypatch):
    """A kernel whose in-process ranks bound gloo to loopback passes GLOO_SOCKET_IFNAME=lo on to the batch
    jobs it submits (sbatch exports the environment); a rank there must bind to its own interface, not
    keep loopback as if the user had chosen it (gloo's peers were refused on the test SLURM's nodes)."""
    import subprocess
    import sys

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv(spmd_worker.IFNAME_MARK + "GLOO_SOCKET_IFNAME", raising=False)
    spmd_worker._bind_to_worker_interface("127.0.0.1")  # as in-process ranks do in the kernel
    inherited = {k: v for k, v in os.environ.items() if "SOCKET_IFNAME" in k}
    child = (
        "import os, jupyter_cluster.collective.worker as w\n"
        "w._interface_of = lambda host: 'eth-of-the-node'\n"  # a node whose worker listens elsewhere
        "w._bind_to_worker_interface('10.0.0.5')\n"
        "print(os.environ['GLOO_SOCKET_IFNAME'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", child], env={**os.environ, **inherited}, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "eth-of-the-node", (out.stdout, out.stderr)


def test_report_inside_gives_a_series_per_rank(shell, cluster):
    res = run_cell(
        shell,
        """%%spmd
import jupyter_cluster as jc
for step in range(3):
    jc.report(step=step, topic="spmd-test", rank=rank, loss=float(rank * 10 + step))
""",
    )
    assert res.error_in_exec is None, res.error_in_exec

    def got():
        try:
            df = jc.metrics("spmd-test")
        except Exception:
            return None
        return [df] if len(df) >= 6 else None

    [df] = wait_for(got, timeout=20, message="6 reports from 2 ranks")
    assert sorted(df["rank"].unique().tolist()) == [0, 1]
    assert sorted(df[df["rank"] == 1]["loss"].tolist()) == [10.0, 11.0, 12.0]


# -- refused before anything runs ---------------------------------------------------------------
def test_too_few_workers_is_one_sentence_before_anything_runs(shell, cluster, capsys):
    before = _statuses(cluster)
    res = run_cell(shell, "%%spmd --workers 5\nraise SystemExit('must not run')\n")
    out = _out(capsys)
    assert res.error_in_exec is not None
    msg = str(res.error_in_exec)
    assert "--workers 5 needs 5 workers but the cluster has 2" in msg and "%cluster scale 5" in msg
    assert msg.count(". ") == 0 and "Traceback" not in out
    assert _statuses(cluster) == before  # no rank ran, no group changed


def test_nccl_on_cpu_ranks_is_one_sentence(shell, cluster, capsys):
    before = _statuses(cluster)
    res = run_cell(shell, "%%spmd --backend nccl\nraise SystemExit('must not run')\n")
    assert res.error_in_exec is not None
    msg = str(res.error_in_exec)
    assert msg.startswith("--backend nccl needs a GPU on every rank, but ranks 0 (worker")
    assert "--gpus" in msg and "--backend gloo" in msg
    assert _statuses(cluster) == before
    before_group = spmd_groups.group(cluster)
    assert before_group.backend == "gloo"  # the existing group was left alone
    # asking for what `auto` already chose keeps the group (and its per-rank state)
    res = run_cell(shell, "%%spmd --backend gloo --out b\nimport torch.distributed as dist\ndist.get_backend()\n")
    assert res.error_in_exec is None and shell.user_ns["b"] == {0: "gloo", 1: "gloo"}
    assert spmd_groups.group(cluster) is before_group and "rebuilt" not in _out(capsys)


def test_backend_choice():
    assert spmd_groups.choose_backend("auto", [0, 0]) == "gloo"
    assert spmd_groups.choose_backend("auto", [1, 0]) == "gloo"  # any CPU rank -> gloo
    assert spmd_groups.choose_backend("auto", [1, 2]) == "nccl"
    assert spmd_groups.choose_backend(None, [0]) == "gloo"
    assert spmd_groups.choose_backend("gloo", [1, 1]) == "gloo"
    assert spmd_groups.choose_backend("nccl", [1, 1]) == "nccl"
    with pytest.raises(
        ClusterError, match=r"^--backend nccl needs a GPU on every rank, but rank 1 \(worker b\) has none"
    ):
        spmd_groups.choose_backend("nccl", [1, 0], ["a", "b"])
    with pytest.raises(ClusterError, match="takes gloo, nccl or auto"):
        spmd_groups.choose_backend("mpi", [0])


# -- failures never hang -----------------------------------------------------------------------
def test_one_rank_raising_releases_the_others_and_shows_its_traceback(shell, cluster, capsys):
    run_cell(shell, "%%spmd\nkeep = rank + 7\n")
    _out(capsys)
    t0 = time.monotonic()
    res = run_cell(
        shell,
        """%%spmd
import torch
import torch.distributed as dist
if rank == 1:
    raise ValueError(f"bad shard on rank {rank}")
dist.all_reduce(torch.ones(2))      # rank 0 blocks here until rank 1's failure releases it
""",
    )
    elapsed = time.monotonic() - t0
    out = _out(capsys)
    assert isinstance(res.error_in_exec, ValueError) and str(res.error_in_exec) == "bad shard on rank 1", (
        res.error_in_exec,
        out,
    )
    assert elapsed < 10, f"the failing cell took {elapsed:.1f} s"
    # the traceback is rank 1's, at the cell's own line (line 5 counts the %%spmd line) with its source
    assert "rank 1 (worker" in out and "failed" in out, out
    assert re.search(r"\b5\b.*raise ValueError", out), out
    job = shell.user_ns["_spmd_job"]
    assert job.failed_rank == 1 and 0 in job.errors, (
        job.tracebacks,
        out,
    )  # rank 0 was released with an error of its own
    # no rank is left blocked: the next cell runs, and the ranks' state survived the failure
    t0 = time.monotonic()
    res = run_cell(
        shell,
        "%%spmd --out after\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n(keep, t.item())\n",
    )
    assert res.error_in_exec is None, res.error_in_exec
    assert shell.user_ns["after"] == {0: (7, 2.0), 1: (8, 2.0)}
    assert time.monotonic() - t0 < 15


def test_group_timeout_releases_a_rank_whose_peer_never_comes(shell, cluster, capsys):
    res = run_cell(
        shell, "%%spmd --timeout 2\nimport torch, torch.distributed as dist\ndist.all_reduce(torch.ones(1))\n"
    )
    assert res.error_in_exec is None, res.error_in_exec  # the live group took the new timeout
    t0 = time.monotonic()
    res = run_cell(
        shell,
        """%%spmd --timeout 2
import time, torch, torch.distributed as dist
if rank == 1:
    for _ in range(3000):           # computing (in Python), never reaching the collective
        time.sleep(0.01)
dist.all_reduce(torch.ones(1))      # rank 0 gives up after 2 s
""",
    )
    elapsed = time.monotonic() - t0
    assert res.error_in_exec is not None and "Timed out" in str(res.error_in_exec), res.error_in_exec
    assert shell.user_ns["_spmd_job"].failed_rank == 0
    assert elapsed < 10, f"took {elapsed:.1f} s"
    _out(capsys)
    wait_for(lambda: not any(s["running"] for s in _statuses(cluster).values()), timeout=10, message="rank 1 to stop")


def test_the_cell_shows_progress_and_is_published_as_a_job(shell, cluster):
    from jupyter_cluster.tracking import progress

    res = run_cell(shell, "%%spmd\nimport time\ntime.sleep(1.5)\n")
    assert res.error_in_exec is None, res.error_in_exec
    job = shell.user_ns["_spmd_job"]
    observer = next(o for o in reversed(progress.recent) if o.job is job)
    assert observer.shown  # the bar appeared: the cell outlasted the progress delay
    states = [m["state"] for m in observer.published]
    assert states[0] == "running" and states[-1] == "finished"
    assert observer.published[-1]["total"] == 2 and observer.published[-1]["done"] == 2


def test_interrupt_returns_within_two_seconds(shell, cluster, capsys):
    run_cell(shell, "%%spmd\nsurvivor = rank\n")
    _out(capsys)
    code = """%%spmd
import time
started = time.time()
while time.time() - started < 120:
    time.sleep(0.01)
"""
    holder = {}
    timer = _interrupt_when_running(cluster, holder)
    res = run_cell(shell, code)
    returned = time.monotonic()
    timer.join()
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert returned - holder["at"] < 2.0, f"returned {returned - holder['at']:.2f} s after the interrupt"
    assert "interrupted; every rank was sent KeyboardInterrupt" in _out(capsys)
    # the ranks stopped (not still looping), and the next cell runs on the same group with its state
    wait_for(lambda: not any(s["running"] for s in _statuses(cluster).values()), timeout=10, message="ranks to stop")
    res = run_cell(
        shell,
        "%%spmd --out s\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n(survivor, t.item())\n",
    )
    assert res.error_in_exec is None, res.error_in_exec
    assert shell.user_ns["s"] == {0: (0, 2.0), 1: (1, 2.0)}


def test_killed_worker_gives_a_clear_error_and_the_group_is_rebuilt(shell, cluster, capsys):
    res = run_cell(shell, "%%spmd --out pids\nimport os\nos.getpid()\n")
    assert res.error_in_exec is None
    victim = shell.user_ns["pids"][1]
    old_group = spmd_groups.group(cluster)
    _out(capsys)

    def kill_when_blocked():
        time.sleep(1.0)  # rank 0 is in all_reduce, rank 1 is sleeping before it
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_blocked)
    killer.start()
    t0 = time.monotonic()
    res = run_cell(
        shell,
        """%%spmd
import time, torch, torch.distributed as dist
if rank == 1:
    time.sleep(60)
dist.all_reduce(torch.ones(1))
""",
    )
    elapsed = time.monotonic() - t0
    killer.join()
    assert res.error_in_exec is not None
    msg = str(res.error_in_exec)
    assert msg.startswith("rank 1 (worker") and "died during the %%spmd cell" in msg, msg
    assert elapsed < 10, f"the notebook waited {elapsed:.1f} s"
    # the cluster stays usable: the nanny brings a worker back, the next cell builds a new group
    cluster.wait_for_workers(2, timeout=60)
    wait_for(lambda: len(workers_now(cluster.client)) == 2, timeout=60, message="2 workers")
    _all_reduce_works(shell)
    out = _out(capsys)
    assert "rebuilt the process group with 2 ranks" in out and out.count("%%spmd:") == 1, out
    assert spmd_groups.group(cluster).id != old_group.id


def test_reset_drops_the_state(shell, cluster, capsys):
    run_cell(shell, "%%spmd\nsecret = 42\n")
    run_cell(shell, "%spmd")
    out = _out(capsys)
    assert "%%spmd group: 2 ranks, backend gloo" in out and "rank 1: worker" in out
    run_cell(shell, "%spmd reset")
    assert "torn down" in _out(capsys)
    assert spmd_groups.group(cluster) is None
    assert all(s["group"] is None and not s["initialized"] for s in _statuses(cluster).values())
    res = run_cell(shell, "%%spmd --out fresh\n'secret' in globals()\n")
    assert res.error_in_exec is None
    assert shell.user_ns["fresh"] == {0: False, 1: False}


def test_large_notebook_values_reach_every_rank(shell, cluster):
    import numpy as np

    shell.user_ns["big"] = np.arange(400_000, dtype=np.float64)  # 3.2 MB: scattered to the ranks' workers once
    res = run_cell(shell, "%%spmd --out sums\nfloat(big.sum()) + rank\n")
    assert res.error_in_exec is None, res.error_in_exec
    total = float(np.arange(400_000, dtype=np.float64).sum())
    assert shell.user_ns["sums"] == {0: total, 1: total + 1}


def test_ranks_stuck_inside_torch_are_restarted_by_the_next_cell(shell, cluster, capsys):
    """A deadlock in C++ (both ranks in recv) ignores KeyboardInterrupt: the notebook still returns, and
    the next cell restarts the stuck workers instead of queueing behind them."""
    holder = {}
    timer = _interrupt_when_running(cluster, holder, settle=1.0)  # both ranks reach recv
    res = run_cell(
        shell, "%%spmd\nimport torch, torch.distributed as dist\nt = torch.zeros(1)\ndist.recv(t, src=1 - rank)\n"
    )
    returned = time.monotonic()
    timer.join()
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert returned - holder["at"] < 2.0
    assert all(s["running"] for s in _statuses(cluster).values())  # really stuck in torch
    _out(capsys)
    t0 = time.monotonic()
    _all_reduce_works(shell)
    out = _out(capsys)
    assert (
        "were still busy with an earlier cell, inside a call Python cannot interrupt; restarting their workers" in out
    ), out
    assert time.monotonic() - t0 < 60


def test_four_ranks_a_rank_late_to_the_collective_is_released_too(shell, cluster, capsys):
    """Every failed rank must free its process group (its sockets close only then), not only the
    rank that raised: a failed collective's frames, kept by the exception's traceback, hold it.
    Rank 3 enters the barrier after its peers have failed; it must fail too, not wait forever."""
    cluster.scale(4)
    try:
        cluster.wait_for_workers(4, timeout=60)
        res = run_cell(shell, "%%spmd --out w\nimport torch.distributed as dist\ndist.barrier()\nworld_size\n")
        assert res.error_in_exec is None, res.error_in_exec
        assert shell.user_ns["w"] == {0: 4, 1: 4, 2: 4, 3: 4}
        cell = """%%spmd
import time
import torch.distributed as dist
if rank == 1:
    raise ValueError("bad")
if rank == 3:                # arrives after its peers have failed
    for _ in range(150):
        time.sleep(0.01)
dist.barrier()
"""
        for _ in range(2):
            res = run_cell(shell, cell)
            assert isinstance(res.error_in_exec, ValueError), res.error_in_exec
            assert spmd_groups.group(cluster).pending == []  # every rank came back; none left blocked
        _out(capsys)
        res = run_cell(shell, "%%spmd --out w\nimport torch.distributed as dist\ndist.barrier()\nrank\n")
        assert res.error_in_exec is None and shell.user_ns["w"] == {0: 0, 1: 1, 2: 2, 3: 3}
        assert "restarting" not in _out(capsys)
    finally:
        cluster.scale(2)
        wait_for(lambda: len(workers_now(cluster.client)) == 2, timeout=60, message="2 workers")


@pytest.mark.slow
def test_stop_button_in_a_real_kernel(tmp_path):
    """JupyterLab's stop button (SIGINT to the kernel's process group, workers included) ends an
    %%spmd cell within 2 s, and the next cell runs on the same group with the ranks' state."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)

        def execute(code, timeout=120):
            status, out = kernel_execute(kc, code, timeout)
            return status, ANSI.sub("", out)

        status, out = execute("%load_ext jupyter_cluster\n%cluster start --workers 2 --threads 1")
        assert status == "ok", out
        status, out = execute("%%spmd\nkept = rank * 10\n")
        assert status == "ok", out
        msg_id = kc.execute("%%spmd\nimport time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # rank 0's line arrives while the cell runs
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
                if "[rank 0] looping" in msg["content"]["text"]:
                    break
        else:
            pytest.fail("rank 0's output never arrived while the cell ran")
        pressed = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        took = time.monotonic() - pressed
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert took < 2.0, f"the cell ended {took:.2f} s after the stop button"
        status, out = execute(
            "%%spmd --out back\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n(kept, t.item())\n"
        )
        assert status == "ok", out
        status, out = execute("print(back)")
        assert "{0: (0, 2.0), 1: (10, 2.0)}" in out, out
        execute("%cluster stop")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_worker_lost_to_its_memory_limit_while_importing_torch_is_one_sentence():
    """A worker whose nanny restarts it while torch is imported (its memory limit too small: seen on SLURM
    workers with 500 MiB) gives one sentence that names the limit and what to change."""
    handle = jc.start(workers=1, threads=1, memory_limit="300MiB")
    try:
        handle.wait_for_workers(1, timeout=60)
        with pytest.raises(ClusterError) as err:
            spmd_groups.prepare(handle, notice=lambda _: None)
        message = str(err.value)
        assert "was lost while torch was imported on it" in message, message
        assert "more memory than 300.00 MiB (--memory-limit)" in message and "\n" not in message
    finally:
        spmd_groups._groups.pop(handle.address, None)
        handle.close()
