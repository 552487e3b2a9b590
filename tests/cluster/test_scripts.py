"""Scripts that use ``jupyter_cluster.Pool``, run as real Python processes.

Spawned worker processes import the script's main module, as multiprocessing
does (those forked by the fork server do not); a script that starts a cluster at its
top level, outside ``if __name__ == "__main__":``, must get one sentence
saying so, and start nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

POOL = """\
import jupyter_cluster as jc


def f(x):
    return x * 2

"""
UNGUARDED = POOL + "with jc.Pool(2) as p:\n    print(p.map(f, range(5)))\n"
GUARDED = POOL + 'if __name__ == "__main__":\n    with jc.Pool(2) as p:\n        print(p.map(f, range(5)))\n'
RESULT = "[0, 2, 4, 6, 8]"
FIX = 'put the code that starts it under `if __name__ == "__main__":`.'
MODES = {"forkserver": "True", "spawn": "False"}


def _ours(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("JC_TEST_SCRIPT") == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found


def run_python(args: list[str], cwd, mode: str = "forkserver", stdin: str | None = None):
    """Run ``python ARGS`` with its own marker in the environment; afterwards no process may carry it."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, JC_TEST_SCRIPT=marker, DASK_JUPYTER_CLUSTER__LOCAL__FORKSERVER=MODES[mode])
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=180
    )
    deadline = time.monotonic() + 10
    while (left := _ours(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"
    return proc


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("mode", list(MODES))
def test_unguarded_script_gets_one_sentence(tmp_path, mode):
    script = _write(tmp_path, "noguard.py", UNGUARDED)
    proc = run_python([str(script)], tmp_path, mode)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"jupyter_cluster.errors.ClusterError: the worker processes import this script ({script}) and line 7 "
        f"starts a cluster when it is imported; {FIX}"
    ), proc.stderr
    # only the script's own traceback: no worker, nanny or fork-server thread reports
    assert proc.stderr.count("Traceback") == 1, proc.stderr
    assert "bootstrapping phase" not in proc.stderr
    assert RESULT not in proc.stdout


@pytest.mark.parametrize("mode", list(MODES))
def test_guarded_script_works(tmp_path, mode):
    script = _write(tmp_path, "guarded.py", GUARDED)
    proc = run_python([str(script)], tmp_path, mode)
    assert proc.returncode == 0, proc.stderr
    assert RESULT in proc.stdout.splitlines(), proc.stdout
    # nor anything at exit (Dask's future callbacks once concurrent.futures has shut down, a
    # worker's heartbeat as it closes: tests/cluster/test_quiet_exit.py makes that one certain)
    assert "Traceback" not in proc.stderr and " - ERROR - " not in proc.stderr, proc.stderr


def test_module_run_with_dash_m_is_checked_too(tmp_path):
    _write(tmp_path, "noguard_mod.py", UNGUARDED)
    _write(tmp_path, "guarded_mod.py", GUARDED)
    proc = run_python(["-m", "noguard_mod"], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().endswith(FIX), proc.stderr
    proc = run_python(["-m", "guarded_mod"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert RESULT in proc.stdout.splitlines()


def test_dash_c_and_stdin_need_no_guard(tmp_path):
    """Workers import no main module for ``python -c`` or ``python - < script`` (whose main is "<stdin>")."""
    proc = run_python(["-c", UNGUARDED], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert RESULT in proc.stdout.splitlines()
    proc = run_python(["-"], tmp_path, stdin=UNGUARDED)
    assert proc.returncode == 0, proc.stderr
    assert RESULT in proc.stdout.splitlines()


@pytest.mark.parametrize("mode", list(MODES))
def test_worker_importing_the_script_starts_nothing(tmp_path, mode):
    """From a thread the caller's line is out of sight; each spawned worker's own start refuses in one line.

    Workers forked from the fork server do not import the script at all (issue 36: it cost each
    0.4-0.7 s of CPU before it could register), so there nothing refuses and the script just runs.
    """
    script = _write(
        tmp_path,
        "threaded.py",
        POOL
        + textwrap.dedent(
            """\
            import threading


            def run():
                with jc.Pool(2) as p:
                    print(p.map(f, range(5)))


            t = threading.Thread(target=run)
            t.start()
            t.join()
            """
        ),
    )
    proc = run_python([str(script)], tmp_path, mode)
    # the worker's thread ends at once; the worker goes on and serves the script's own Pool
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(RESULT) == 1, proc.stdout
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("jupyter_cluster: a worker process")]
    if mode == "spawn":
        assert refusals and all(line.endswith(FIX) for line in refusals), proc.stderr
    else:
        assert not refusals, proc.stderr
    assert "bootstrapping phase" not in proc.stderr


# -- the forms of the guard people write ---------------------------------------------------
def _body(code: str, indent: int = 4) -> str:
    return textwrap.indent(code, " " * indent)


USE = "with jc.Pool(2) as p:\n    print(p.map(f, range(5)))\n"
MAIN = "def main():\n" + _body(USE) + "\n\n"
GUARD_FORMS = {
    "reversed": 'if "__main__" == __name__:\n' + _body(USE),
    "and_more": "import sys\n\nif __name__ == '__main__' and len(sys.argv) >= 1:\n" + _body(USE),
    "main_called_under_guard": "import sys\n\n" + MAIN + 'if __name__ == "__main__":\n    sys.exit(main())\n',
    "function_called_by_main": "def inner():\n"
    + _body(USE)
    + '\n\ndef outer():\n    inner()\n\n\nif __name__ == "__main__":\n    outer()\n',
    "in_a_tuple": 'if __name__ in ("__main__",):\n' + _body(USE),
    "else_of_not_main": MAIN + 'if __name__ != "__main__":\n    pass\nelse:\n    main()\n',
    "inside_try": 'try:\n    if __name__ == "__main__":\n' + _body(USE, 8) + "except KeyboardInterrupt:\n    pass\n",
    "asyncio_run": "import asyncio\n\n\nasync def main():\n"
    + _body(USE)
    + '\n\nif __name__ == "__main__":\n    asyncio.run(main())\n',
    "one_line_and": MAIN + '__name__ == "__main__" and main()\n',
    "match": MAIN + 'match __name__:\n    case "__main__":\n        main()\n',
}


@pytest.mark.parametrize("form", list(GUARD_FORMS))
def test_other_forms_of_the_guard_work(tmp_path, form):
    """No false error: each form keeps the workers from starting a cluster, and the script runs."""
    script = _write(tmp_path, f"{form}.py", POOL + GUARD_FORMS[form])
    proc = run_python([str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines().count(RESULT) == 1, proc.stdout
    assert "Traceback" not in proc.stderr and "jupyter_cluster: a worker" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "form,line",
    [
        ("main_called_unguarded", MAIN + "main()\n"),
        ("or_anything", 'import sys\n\nif __name__ == "__main__" or len(sys.argv) >= 1:\n' + _body(USE)),
        ("if_true", "if True:\n" + _body(USE)),
    ],
    ids=lambda v: v if "\n" not in v else "",
)
def test_guards_that_do_not_guard_are_reported(tmp_path, form, line):
    script = _write(tmp_path, f"{form}.py", POOL + line)
    proc = run_python([str(script)], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().endswith(FIX), proc.stderr
    assert "starts a cluster when it is imported" in proc.stderr
    assert RESULT not in proc.stdout


@pytest.mark.parametrize("leave", ["sys.exit()", "raise SystemExit", 'raise ImportError("run it as a script")'])
def test_a_script_that_exits_when_imported_gets_one_sentence(tmp_path, leave):
    """``if __name__ != "__main__": sys.exit()`` ends every worker's import: say that, not "line N starts"."""
    script = _write(tmp_path, "exits.py", "import sys\n" + POOL + f'if __name__ != "__main__":\n    {leave}\n' + USE)
    proc = run_python([str(script)], tmp_path)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"jupyter_cluster.errors.ClusterError: the worker processes import this script ({script}) and line 9 "
        "ends that import (it exits when the script is not the main one), so no worker can start; "
        f"instead, {FIX}"
    ), proc.stderr
    assert proc.stderr.count("Traceback") == 1, proc.stderr
