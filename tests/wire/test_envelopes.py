"""The events socket's envelopes and the control topic's ops (wire/envelopes.py) against those who send and read them.

The TypeScript side reads one envelope of each type from ``wire.json``
(``test_models.py`` writes it, ``contract.spec.ts`` checks it); here the
Python side: the builders give exactly their typed fields, the server takes
exactly the fields of the panel's messages, and the control ops are those the
owner carries out with the fields it reads.  ``tests/server/test_server.py``
checks the envelopes a real server pushes with :func:`check_envelope`.
"""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_cluster.cluster import control
from jupyter_cluster.server.handlers import SOCKET_MESSAGES
from jupyter_cluster.wire import envelopes as env

from .test_models import payloads

BY_TYPE = {env.message_type(m): m for m in (*env.SERVER_MESSAGES, *env.CLIENT_MESSAGES)}


def check_envelope(msg: dict[str, Any]) -> None:
    """Fail unless ``msg`` has a known type and exactly the fields (required, maybe optional) of its envelope."""
    assert isinstance(msg, dict) and msg.get("type") in BY_TYPE, msg
    required, optional = env.fields(BY_TYPE[msg["type"]])
    assert required <= set(msg) <= required | optional, (msg["type"], sorted(msg), sorted(required), sorted(optional))


def test_each_builder_gives_its_envelopes_fields():
    envelopes = payloads()["envelopes"]
    assert sorted(envelopes["server"]) == sorted(env.message_type(m) for m in env.SERVER_MESSAGES)
    assert sorted(envelopes["client"]) == sorted(env.message_type(m) for m in env.CLIENT_MESSAGES)
    for msg in (*envelopes["server"].values(), *envelopes["client"].values()):
        check_envelope(msg)
    # the fixture's envelopes carry the optional fields too, so the panel's side checks every field
    for kind, msg in envelopes["server"].items():
        required, optional = env.fields(BY_TYPE[kind])
        assert set(msg) == required | optional, kind


def test_the_server_takes_exactly_the_fields_of_the_panels_messages():
    for message in env.CLIENT_MESSAGES:
        kind = env.message_type(message)
        required, optional = env.fields(message)
        assert set(SOCKET_MESSAGES[kind].checks) == required | optional, kind


def test_a_control_request_names_an_op_the_owner_carries_out_with_the_fields_it_reads():
    assert control.OPS == env.CONTROL_OPS == ("scale", "adapt", "stop")
    request = control.make_request("c", "scale", n=3)
    required, optional = env.fields(env.ControlRequest)
    assert required <= set(request) <= required | optional and request["id"]
    with pytest.raises(ValueError, match="takes no count"):
        control.make_request("c", "scale", count=3)  # a field renamed by a sender
    with pytest.raises(ValueError, match="unknown control operation"):
        control.make_request("c", "resize", n=3)

    class Owner:  # records what the owner's handle is asked (a pure unit: no cluster)
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def scale(self, n: int) -> None:
            self.calls.append(("scale", n))

        def adapt(self, minimum: int, maximum: int | None) -> None:
            self.calls.append(("adapt", minimum, maximum))

        def close(self) -> None:
            self.calls.append(("stop",))

    owner = Owner()
    control._apply(owner, control.make_request("c", "scale", n=3))
    control._apply(owner, control.make_request("c", "adapt", minimum=1, maximum=4))
    control._apply(owner, control.make_request("c", "stop"))
    assert owner.calls == [("scale", 3), ("adapt", 1, 4), ("stop",)]
    reply = env.control_reply("abc", None)
    assert set(reply) == set(env.fields(env.ControlReply)[0]) and reply["ok"] is True
