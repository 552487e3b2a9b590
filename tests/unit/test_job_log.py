"""The jobs log's trim (telemetry.job_log.trim): pure, no scheduler."""

from __future__ import annotations

from collections import deque

from jupyter_cluster.telemetry.job_log import trim


def _log(*sizes):
    return deque(
        (float(k), {"job": k, "items": tuple(range(n)), "item_count": n} if n else {"job": k})
        for k, n in enumerate(sizes)
    )


def test_trim_keeps_the_newest_items_within_the_budget_and_never_changes_a_message():
    log = _log(3, 0, 4, 5, 2)
    originals = [m for _, m in log]
    assert trim(log, keep=8) == 7  # 2 + 5; the 4 would pass 8
    assert [len(m.get("items", ())) for _, m in log] == [0, 0, 0, 5, 2]
    assert [ts for ts, _ in log] == [0.0, 1.0, 2.0, 3.0, 4.0]  # same times: readers tell events apart by them
    assert all(m["item_count"] == n for (_, m), n in zip(log, (3, 0, 4, 5, 2)) if n)
    assert all(len(m["items"]) == n for m, n in zip(originals, (3, 0, 4, 5, 2)) if n)  # copies were trimmed


def test_trim_keeps_the_newest_job_whole_whatever_its_size():
    log = _log(5, 50)
    assert trim(log, keep=10) == 50
    assert "items" not in log[0][1] and len(log[1][1]["items"]) == 50
