"""``%%spmd``: a cell as the ranks of a ``torch.distributed`` group; ``client`` in the kernel, ``worker`` on the ranks."""
