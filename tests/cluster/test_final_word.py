"""The final word a stopping owner leaves the Jupyter server (``cluster.final_word.leave_final_word``): the cluster's size."""

from __future__ import annotations

import time

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


def _reporting(x):
    import jupyter_cluster as jc

    for step in range(3):
        jc.report(step=step, topic="final-word-topic", trial=x, loss=1.0 / (step + 1 + x))
    return x


def test_the_final_word_carries_this_processs_copy_of_the_runs_topics():
    # A server still subscribing when the cluster stopped had the runs' rows and none of their metrics.
    handle = jc.start(name="final-word-topics", workers=2, threads=1, processes=False)
    try:
        from jupyter_cluster import telemetry
        from jupyter_cluster.telemetry.topic_store import store

        telemetry.attach(handle.client)  # what a kernel's first map does (widgets.metrics)
        with jc.run("final-word-run"):  # its reports carry the run (a %%parallel sweep's: each its item too)
            assert jc.map(_reporting, [0, 1, 2], progress=False) == [0, 1, 2]

        deadline = time.monotonic() + 30
        while store("final-word-topic").received < 9:
            assert time.monotonic() < deadline, "the reports never reached this process"
            time.sleep(0.05)
    finally:
        handle.close()
    words = [data for path, data in registry.final_words() if data.get("key") == "final-word-topics"]
    assert len(words) == 1, words
    run = words[0]["jobs"][0]["run"]
    topics = {t["model"]["topic"]: t for t in words[0]["topics"]}
    assert list(topics) == ["final-word-topic"], list(topics)  # only the topics its runs reported to
    assert list(topics["final-word-topic"]["runs"]) == [run]
    (item,) = topics["final-word-topic"]["runs"][run].values()  # a run-level report (no item tags)
    assert item["final"]["loss"] > 0 and item["steps"] == 2, item
