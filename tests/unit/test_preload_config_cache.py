"""The fork server parses Dask's YAML config files once; each forked worker's ``dask.config.refresh()`` reuses them.

Runs in a fresh interpreter with a config folder of its own (``DASK_CONFIG``):
the preload changes its process's ``dask.config`` for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = """
import json, os, sys, time
import dask.config
from jupyter_cluster.backends.local import preload
parsed = []
parse = preload._parse_config_file
preload._parse_config_file = lambda path: parsed.append(os.path.basename(path)) or parse(path)
folder = os.environ["DASK_CONFIG"]
dask.config.refresh()  # as a worker's first step does
first = (list(parsed), dask.config.get("jc-test.value"))
dask.config.get("jc-test")["value"] = "changed in memory"  # what dask merged is a copy
dask.config.refresh()
again = (list(parsed), dask.config.get("jc-test.value"))
with open(os.path.join(folder, "jc-test.yaml"), "w") as f:
    f.write("jc-test:\\n  value: edited on disk\\n")  # another size: parsed again
dask.config.refresh()
print(json.dumps({"first": first, "again": again, "edited": (parsed, dask.config.get("jc-test.value"))}))
"""


def test_config_files_are_parsed_once_and_again_when_they_change(tmp_path):
    (tmp_path / "jc-test.yaml").write_text("# a comment, as the packages write them\njc-test:\n  value: 1\n")
    env = {**os.environ, "DASK_CONFIG": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first"] == [[], 1]  # parsed when the preload was imported, not at the refresh
    assert got["again"] == [[], 1]  # a change in memory did not reach the kept parse
    assert got["edited"] == [["jc-test.yaml"], "edited on disk"]
