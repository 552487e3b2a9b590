"""The detached jobs' part of the magics: ``%cluster jobs``, ``%cluster job NAME``, ``%%parallel --detach NAME``.

Only translation: the work is :mod:`jupyter_cluster.detached.jobs`'.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from IPython.core.error import UsageError

from ..detached import jobs as detached_jobs


def job_command(shell: Any, args: argparse.Namespace) -> None:
    """``%cluster jobs`` (a table) and ``%cluster job NAME [--out VAR] [--cancel] [--resume]``."""
    if args.command == "jobs":
        print_jobs(detached_jobs.jobs())
        return None
    job = detached_jobs.job(args.name)
    if args.out is not None and not args.out.isidentifier():
        raise UsageError(f"%cluster job: --out needs a variable name, not {args.out!r}.")
    if args.cancel:
        print(f"Detached job {job.name!r}: {job.cancel()}")
        return None
    if args.resume:
        job.resume()
        done, total = job.progress
        print(f"Detached job {job.name!r} resumed on {job.cluster!r}: {total - done} items left to run.")
        return None
    if args.out is not None:
        results = job.result()
        shell.user_ns[args.out] = results
        print(f"Detached job {job.name!r}: {len(results)} results in {args.out}.")
        return None
    print(repr(job))
    return None


def print_jobs(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("No detached jobs. Start one with %%parallel x in items --detach NAME on a kept cluster.")
        return
    print(f"{'name':<20} {'cluster':<14} {'state':<10} {'done/total':<12} {'started':<20} {'duration':<10} where")
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])) if r.get("started") else "-"
        duration = f"{r['duration']:.1f}s" if r.get("duration") is not None else "-"
        where = " ".join(str(x) for x in (r.get("notebook"), r.get("cell")) if x) or "-"
        print(
            f"{r['name']:<20} {str(r['cluster']):<14} {r['state']:<10} {str(r['done']) + '/' + str(r['total']):<12} "
            f"{started:<20} {duration:<10} {where}"
        )


def kept_cluster_for(name: str) -> Any:
    """The kept cluster a ``%%parallel --detach NAME`` cell runs on, once its name is known to be free."""
    from ..state import job_store

    job_store.check_name(name)
    handle = detached_jobs._kept_cluster(None)
    if job_store.read_meta(name) is not None:
        raise UsageError(
            f"a detached job named {name!r} already exists; choose another name, or drop it with "
            f"jupyter_cluster.job({name!r}).remove()."
        )
    return handle


def submit_cell(func: Any, tap: Any, name: str, header: str, cell: str, count: Any, options: dict[str, Any]) -> None:
    """Hand a ``%%parallel`` cell to its kept cluster's host as detached job ``name``; print the one line."""
    items = list(tap)
    first = next((ln for ln in cell.splitlines() if ln.strip()), "")
    where = f"In[{count}]" if count is not None else "cell"
    job = detached_jobs.submit(
        func,
        items,
        name=name,
        cluster=options["client"],
        cell=f"{where}: %%parallel {header} | {first.strip()[:60]}",
        label=f"%%parallel {header} --detach {name}",
        run_tag=tap.tag,
        **{k: options[k] for k in ("chunksize", "retries", "timeout", "errors", "resources", "shared")},
    )
    print(job.summary_line())
