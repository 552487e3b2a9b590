"""CPython's own ``multiprocessing.Pool`` tests, run on ``jupyter_cluster.Pool``.

The cases are the running interpreter's: ``_TestPool`` and
``_TestPoolWorkerErrors`` of ``Lib/test/_test_multiprocessing.py``, imported
from its ``test`` package (the module is skipped, with the reason, on a Python
installed without it).  Each is combined with a mixin whose ``Pool`` is ours,
with the bases in the order CPython's ``install_tests_in_module_dict`` uses
(case, mixin, ``unittest.TestCase``), on the real 2-worker cluster of the
``cluster`` fixture.  The classes live at module level under their own names:
``test_traceback`` ships a classmethod of its class, so the workers import
them from here.

Cases that read ``multiprocessing.Pool``'s private attributes are left out,
each with its reason (also listed in docs/pool.md).
"""

from __future__ import annotations

import multiprocessing
import time
import unittest

import pytest

import jupyter_cluster as jc

_mp_tests = pytest.importorskip(
    "test._test_multiprocessing",
    reason="this Python was installed without its test package (e.g. Debian's python3 without libpython3-testsuite)",
)

# A case that hangs (terminate() not freeing the workers' threads) must fail, not stall CI.
# The cases' ``Pool(n)`` use the current cluster: the module's 2-worker one (tests/conftest.py)
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("cpython_cases_cluster")]

#: Cases left out, with the reason: they read what only multiprocessing's Pool has.
EXCLUDED = {
    "test_make_pool": "reads Pool._pool, multiprocessing's private list of its worker processes "
    "(a cluster's pool owns no processes); its ValueError checks run in test_pool_conformance.py",
}


class JupyterClusterMixin(_mp_tests.BaseMixin):
    """What CPython's ``ProcessesMixin`` gives a case, with ``jupyter_cluster.Pool`` as the pool."""

    TYPE = "processes"
    Pool = staticmethod(jc.Pool)

    def setUp(self) -> None:
        # _TestPoolWorkerErrors calls multiprocessing.Pool(2) itself rather than self.Pool.
        real = multiprocessing.Pool
        multiprocessing.Pool = jc.Pool  # type: ignore[assignment]
        self.addCleanup(setattr, multiprocessing, "Pool", real)
        super_setup = getattr(super(), "setUp", None)
        if super_setup is not None:
            super_setup()


def _excluded(name: str):
    return unittest.skip(f"excluded: {EXCLUDED[name]}")(lambda self: None)


class WithJupyterClusterTestPool(_mp_tests._TestPool, JupyterClusterMixin, unittest.TestCase):
    test_make_pool = _excluded("test_make_pool")

    def test_terminate(self):
        super().test_terminate()
        # multiprocessing ends its workers; ours must free the cluster's threads at once, or every
        # later case waits for the 300 s sleeps: a new pool's call must run now.
        started = time.monotonic()
        with self.Pool(1) as p:
            self.assertEqual(p.apply_async(_mp_tests.sqr, (3,)).get(timeout=60), 9)
        print(f"a new pool's apply after terminate(): {time.monotonic() - started:.2f} s")


class WithJupyterClusterTestPoolWorkerErrors(_mp_tests._TestPoolWorkerErrors, JupyterClusterMixin, unittest.TestCase):
    pass


def test_every_case_is_run_or_excluded_by_name():
    """The exclusions name real cases (a renamed case in a newer Python must not hide)."""
    cases = {n for n in dir(_mp_tests._TestPool) if n.startswith("test_")}
    assert set(EXCLUDED) <= cases, set(EXCLUDED) - cases
