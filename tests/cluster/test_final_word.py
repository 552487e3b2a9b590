"""The final word a stopping owner leaves the Jupyter server (``cluster.final_word.leave_final_word``): the cluster's size."""

from __future__ import annotations

import jupyter_cluster as jc
from jupyter_cluster.state import registry


def test_the_final_word_gives_the_size_the_scheduler_counts():
    # The size came from the client's cached worker list, which may be empty right after its refresh
    # and, in some distributed versions, lists only a few workers: the scheduler's totals now.
    handle = jc.start(name="final-word-size", workers=3, threads=2, memory_limit="1GiB", processes=False)
    try:
        assert jc.map(abs, [-1, -2], progress=False) == [1, 2]  # a job: what makes the final word worth leaving
    finally:
        handle.close()
    words = [data for path, data in registry.final_words() if data.get("key") == "final-word-size"]
    assert len(words) == 1, words
    summary = words[0]["summary"]
    assert (summary["n_workers"], summary["cores"], summary["memory_limit"]) == (3, 6, 3 * 2**30), summary
