"""``%%spmd``: a cell as the ranks of a ``torch.distributed`` group.

In the kernel: :mod:`.client` (:func:`~.client.run` and :func:`~.client.spmd`: the tasks and
their wait), :mod:`.groups` (which workers are the ranks, reused while they live) and
:mod:`.output` (the ranks' printed output, live).  On the ranks: :mod:`.worker` (the rank's
state and set-up, what ``Client.run`` calls), :mod:`.task` (the cell's run) and
:mod:`.rendezvous` (the keys on rank 0's worker).
"""
