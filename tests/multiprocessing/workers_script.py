"""A script written for ``multiprocessing``: Process workers, two Queues, a Pipe, a Manager dict, a Pool.

tests/multiprocessing/test_script.py runs it as is and with its import line
changed to ``import jupyter_cluster.multiprocessing as mp``, and compares the outputs.
"""

import multiprocessing as mp


def worker(jobs, results, conn, shared):
    done = 0
    while True:
        job = jobs.get()
        if job is None:
            break
        shared[job] = job * job
        results.put((job, job * job))
        done += 1
    conn.send(("worker done", done >= 0))
    conn.close()


def pool_task(x, q):
    q.put(x * 10)
    return x + 1


if __name__ == "__main__":
    jobs, results = mp.Queue(), mp.Queue()
    manager = mp.Manager()
    shared = manager.dict()
    workers = []
    for _ in range(3):
        here, there = mp.Pipe()
        process = mp.Process(target=worker, args=(jobs, results, there, shared))
        process.start()
        workers.append((process, here))
    for job in range(10):
        jobs.put(job)
    for _ in workers:
        jobs.put(None)
    print("results", sorted(results.get(timeout=60) for _ in range(10)))
    print("pipes", [here.recv() for _, here in workers])
    for process, _ in workers:
        process.join(60)
        print("exitcode", process.exitcode, "alive", process.is_alive())
    print("shared", sorted(shared.items()))
    pool_queue = manager.Queue()
    with mp.Pool(2) as pool:
        print("pool", pool.starmap(pool_task, [(i, pool_queue) for i in range(5)]))
    print("pool queue", sorted(pool_queue.get(timeout=30) for _ in range(5)))
    manager.shutdown()
