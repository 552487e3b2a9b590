"""Attach to a scheduler that already runs somewhere else."""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError
from . import Backend, StartedCluster
from .cli import Option


class AddressBackend(Backend):
    """A cluster we only connect to; stopping detaches and never shuts it down."""

    name = "address"
    cli_options = (Option("address", "the running scheduler's address, like tcp://host:8786", None, "URL"),)
    api_options = ("security",)

    def start(self, address: str | None = None, security: Any = None, **options: Any) -> StartedCluster:
        self.check_options(options)
        if not address:
            raise ClusterError("the address backend needs a scheduler address, e.g. tcp://127.0.0.1:8786.")
        if "://" not in address:
            address = "tcp://" + address
        return StartedCluster(address=address, dashboard_link=None, cluster=None, security=security)
