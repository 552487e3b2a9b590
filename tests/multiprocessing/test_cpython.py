"""CPython's own ``multiprocessing`` tests, run on ``jupyter_cluster.multiprocessing``.

The cases are the running interpreter's (``Lib/test/_test_multiprocessing.py``),
bound as ``tests/pool/test_cpython.py`` binds the Pool ones: each class is
combined with a mixin whose names are ours, on the module's 2-worker
cluster.  The classes live at module level under their own names so that
the workers import the cases' classmethod targets from here.  Cases that
cannot pass on a cluster are expected failures, each with its reason (the
same list is in docs/pool.md).
"""

from __future__ import annotations

import multiprocessing
import unittest

import pytest

import jupyter_cluster.multiprocessing as jmp

_mp_tests = pytest.importorskip(
    "test._test_multiprocessing",
    reason="this Python was installed without its test package (e.g. Debian's python3 without libpython3-testsuite)",
)

# the cases' objects use the current cluster: the module's 2-worker one (tests/conftest.py)
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("cpython_cases_cluster")]

#: Expected failures: case name -> reason.  Filled from runs of this module (see docs/pool.md).
EXPECTED_FAILURES: dict[str, str] = {
    "_TestProcess.test_kill": "calls the standard multiprocessing.Process.kill on our object (it reads its private _popen)",
    "_TestProcess.test_terminate": "calls the standard multiprocessing.Process.terminate on our object (its private _popen)",
    "_TestProcess.test_wait_for_threads": "a Process ends when run() returns; threads its target leaves running are not waited for",
    "_TestQueue.test_queue_feeder_donot_stop_onexc": "overrides the private _on_queue_feeder_error (a cluster Queue has no feeder thread)",
    "_TestConnection.test_connection": "reads the Connection's fileno() (a cluster Pipe has no file descriptor)",
    "_TestConnection.test_fd_transfer": "sends OS file descriptors through the Pipe (they mean nothing on another machine)",
    "_TestConnection.test_large_fd_transfer": "sends OS file descriptors through the Pipe (they mean nothing on another machine)",
    "_TestConnection.test_missing_fd_transfer": "sends OS file descriptors through the Pipe (they mean nothing on another machine)",
    "_TestSubclassingProcess.test_stderr_flush": "looks for the test file's name in the child's traceback, which names "
    "the code as the worker received it (pickled by value)",
    "_TestCondition.test_notify": "reads the Condition's private _sleeping_count semaphore",
    "_TestCondition.test_notify_all": "reads the Condition's private _sleeping_count semaphore",
    "_TestCondition.test_notify_n": "reads the Condition's private _sleeping_count semaphore",
}


class JupyterClusterMixin(_mp_tests.BaseMixin):
    """What CPython's ``ProcessesMixin`` gives a case, with ``jupyter_cluster.multiprocessing``'s names."""

    TYPE = "processes"
    Process = jmp.Process
    connection = multiprocessing.connection
    current_process = staticmethod(jmp.current_process)
    parent_process = staticmethod(jmp.parent_process)
    active_children = staticmethod(jmp.active_children)
    set_executable = staticmethod(jmp.set_executable)
    Pool = staticmethod(jmp.Pool)
    Pipe = staticmethod(jmp.Pipe)
    Queue = staticmethod(jmp.Queue)
    JoinableQueue = staticmethod(jmp.JoinableQueue)
    Lock = staticmethod(jmp.Lock)
    RLock = staticmethod(jmp.RLock)
    Semaphore = staticmethod(jmp.Semaphore)
    BoundedSemaphore = staticmethod(jmp.BoundedSemaphore)
    Condition = staticmethod(jmp.Condition)
    Event = staticmethod(jmp.Event)
    Barrier = staticmethod(jmp.Barrier)
    Value = staticmethod(jmp.Value)
    Array = staticmethod(jmp.Array)
    RawValue = staticmethod(jmp.RawValue)
    RawArray = staticmethod(jmp.RawArray)


class JupyterClusterManagerMixin(_mp_tests.BaseMixin):
    """What CPython's ``ManagerMixin`` gives a case: a manager's objects (``_TestContainers``)."""

    TYPE = "manager"
    Process = multiprocessing.Process  # the manager cases' processes are threads of this one
    Queue = property(lambda self: self.manager.Queue)
    JoinableQueue = property(lambda self: self.manager.JoinableQueue)
    Lock = property(lambda self: self.manager.Lock)
    RLock = property(lambda self: self.manager.RLock)
    Semaphore = property(lambda self: self.manager.Semaphore)
    BoundedSemaphore = property(lambda self: self.manager.BoundedSemaphore)
    Condition = property(lambda self: self.manager.Condition)
    Event = property(lambda self: self.manager.Event)
    Barrier = property(lambda self: self.manager.Barrier)
    Value = property(lambda self: self.manager.Value)
    Array = property(lambda self: self.manager.Array)
    list = property(lambda self: self.manager.list)
    dict = property(lambda self: self.manager.dict)
    Namespace = property(lambda self: self.manager.Namespace)

    @classmethod
    def Pool(cls, *args, **kwds):  # noqa: N802
        return jmp.Pool(*args, **kwds)

    @classmethod
    def setUpClass(cls):
        cls.manager = jmp.Manager()

    @classmethod
    def tearDownClass(cls):
        cls.manager.shutdown()
        cls.manager = None


#: Left out (they would fail only after waiting out their own timeouts, 10-30 s each): case name -> reason.
EXCLUDED: dict[str, str] = {
    "_TestProcess.test_parent_process": "the child checks parent_process() is this OS process, alive, by pid and sentinel",
    "_TestProcess.test_sentinel": "a cluster Process has no OS sentinel (a file descriptor of this machine) to wait on",
}

#: Passing cases over ~20 s on the 2-core machine.
SLOW = {"_TestBarrier.test_thousand"}

_managers: list = []


def _manager():
    if not _managers:
        _managers.append(jmp.Manager())
    return _managers[0]


def _copy(func):
    def case(self):
        return func(self)

    case.__name__ = case.__qualname__ = func.__name__
    return case


def _bind(name: str, mixin: type) -> type:
    base = getattr(_mp_tests, name)
    cls = type("WithJupyterCluster" + name[1:], (base, mixin, unittest.TestCase), {"__module__": __name__})
    for case, reason in EXPECTED_FAILURES.items():
        owner, _, method = case.partition(".")
        if owner == name and hasattr(cls, method):
            setattr(cls, method, pytest.mark.xfail(reason=reason, strict=True)(_copy(getattr(base, method))))
    for case, reason in EXCLUDED.items():
        owner, _, method = case.partition(".")
        if owner == name:
            setattr(cls, method, unittest.skip(f"excluded: {reason}")(lambda self: None))
    for case in SLOW:
        owner, _, method = case.partition(".")
        if owner == name:
            # 17 s on a quiet machine; over the module's 60 s with two test processes on a loaded one
            setattr(cls, method, pytest.mark.timeout(240)(pytest.mark.slow(_copy(getattr(base, method)))))
    return cls


WithJupyterClusterTestProcess = _bind("_TestProcess", JupyterClusterMixin)
WithJupyterClusterTestQueue = _bind("_TestQueue", JupyterClusterMixin)
WithJupyterClusterTestConnection = _bind("_TestConnection", JupyterClusterMixin)
WithJupyterClusterTestLock = _bind("_TestLock", JupyterClusterMixin)
WithJupyterClusterTestSemaphore = _bind("_TestSemaphore", JupyterClusterMixin)
WithJupyterClusterTestCondition = _bind("_TestCondition", JupyterClusterMixin)
WithJupyterClusterTestEvent = _bind("_TestEvent", JupyterClusterMixin)
WithJupyterClusterTestValue = _bind("_TestValue", JupyterClusterMixin)
WithJupyterClusterTestArray = _bind("_TestArray", JupyterClusterMixin)
WithJupyterClusterTestBarrier = _bind("_TestBarrier", JupyterClusterMixin)
# The cases count arrivals in a _DummyList of shared memory; a manager's list is the cluster's counterpart.
WithJupyterClusterTestBarrier.DummyList = lambda self: _manager().list()  # type: ignore[attr-defined]
WithJupyterClusterTestContainers = _bind("_TestContainers", JupyterClusterManagerMixin)
WithJupyterClusterTestManagerRestart = _bind("_TestManagerRestart", JupyterClusterMixin)
WithJupyterClusterTestSubclassingProcess = _bind("_TestSubclassingProcess", JupyterClusterMixin)
