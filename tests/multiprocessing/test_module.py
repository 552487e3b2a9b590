"""``jupyter_cluster.multiprocessing`` beyond CPython's cases: what a cluster adds or changes.

Real 2-worker cluster (1 thread each).
"""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import jupyter_cluster.multiprocessing as jmp

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("cluster")]  # the module's cluster, current


def echo_twice(conn):
    conn.send(("pid", os.getpid(), jmp.current_process().name))
    conn.send(conn.recv() * 2)


def sleep_long(seconds):
    time.sleep(seconds)


def count_in(shared, lock, n):
    for _ in range(n):
        with lock:
            shared["n"] = shared.get("n", 0) + 1


def test_a_process_runs_on_a_worker_and_talks_through_a_pipe():
    here, there = jmp.Pipe()
    p = jmp.Process(target=echo_twice, args=(there,), name="echo")
    p.start()
    tag, pid, name = here.recv()
    assert (tag, name) == ("pid", "echo")
    assert pid == p.pid and pid != os.getpid()  # the worker process's pid
    here.send(21)
    assert here.poll(30) and here.recv() == 42
    p.join(30)
    assert p.exitcode == 0 and not p.is_alive()


def test_terminate_stops_a_running_process_at_once():
    p = jmp.Process(target=sleep_long, args=(300,))
    p.start()
    assert p.is_alive()
    started = time.monotonic()
    p.terminate()
    p.join(30)
    assert p.exitcode == -15 and not p.is_alive()
    assert time.monotonic() - started < 20  # not the 300 s of the target


def test_more_processes_than_threads_run_at_once():
    # Three processes that wait on one barrier: on 2 threads they need to run beside each other.
    barrier = jmp.Barrier(3)
    procs = [jmp.Process(target=barrier.wait, args=(60,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]


def test_manager_dict_and_lock_shared_by_processes_and_a_standard_child():
    manager = jmp.Manager()
    try:
        shared, lock = manager.dict(), jmp.Lock()
        procs = [jmp.Process(target=count_in, args=(shared, lock, 5)) for _ in range(2)]
        child = multiprocessing.get_context("fork").Process(target=count_in, args=(shared, lock, 5))
        for p in procs:
            p.start()
        child.start()
        for p in procs:
            p.join(60)
        child.join(60)
        assert child.exitcode == 0
        assert shared["n"] == 15
    finally:
        manager.shutdown()


def test_value_array_and_the_module_functions():
    v, a = jmp.Value("i", 3), jmp.Array("d", [1, 2])
    with v.get_lock():
        v.value += 1
    a[1] = 5
    assert (v.value, a[:]) == (4, [1.0, 5.0])
    assert jmp.cpu_count() == 2
    assert jmp.get_context("spawn") is jmp
    assert jmp.current_process().name == "MainProcess"


class Reporter:
    def report(self, q, event, shared):
        q.put("from actor")
        shared["actor"] = True
        event.set()
        return True


def test_the_shared_objects_work_from_an_actor():
    import jupyter_cluster as jc

    q, event, manager = jmp.Queue(), jmp.Event(), jmp.Manager()
    try:
        shared = manager.dict()
        with jc.actor(Reporter) as reporter:
            assert reporter.report(q, event, shared).result(timeout=60)
        assert q.get(timeout=10) == "from actor"
        assert event.wait(10) and shared["actor"] is True
    finally:
        manager.shutdown()


def test_the_shared_objects_work_from_a_parallel_cell(ip):
    q, lock = jmp.Queue(), jmp.Lock()
    ip.user_ns.update(q=q, lock=lock)
    ip.run_cell_magic("parallel", "x in range(3)", "with lock:\n    q.put(x * 10)\n")
    assert sorted(q.get(timeout=30) for _ in range(3)) == [0, 10, 20]


def print_lines(n):
    for i in range(n):
        print("line", i)


def test_what_a_process_prints_appears_here_by_join(capsys):
    p = jmp.Process(target=print_lines, args=(3,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert "line 0\nline 1\nline 2\n" in capsys.readouterr().out
