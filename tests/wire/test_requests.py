"""The one check of what every server route takes (wire/requests.py), without a server."""

from __future__ import annotations

import pytest

from jupyter_cluster.errors import ClusterError
from jupyter_cluster.wire import requests as req

ADAPT = req.Fields("adapt", {"minimum": req.count("minimum"), "maximum": req.count("maximum")}, one_of=True)


@pytest.mark.parametrize(
    "data,words",
    [
        ({"min": 2, "max": 2}, "unknown fields 'max', 'min'; adapt takes minimum and maximum."),
        ({"minimum": 1, "maxium": 2}, "unknown field 'maxium'; adapt takes minimum and maximum."),
        ({}, "give minimum and maximum."),
        ({"minimum": "2"}, "minimum must be a whole number from 0 to 10000, not '2'."),
        ({"maximum": True}, "maximum must be a whole number from 0 to 10000, not True."),
    ],
)
def test_a_field_not_taken_or_of_the_wrong_type_is_one_sentence_naming_it(data, words):
    with pytest.raises(ClusterError) as info:
        ADAPT.check(data)
    assert str(info.value) == words


def test_given_fields_are_checked_and_nulls_are_left_to_the_route():
    assert ADAPT.check({"minimum": 1, "maximum": None}) == {"minimum": 1}
    assert req.NOTHING.check({}) == {}
    with pytest.raises(ClusterError, match="unknown query argument 'x'; this request takes no query arguments."):
        req.NOTHING.check({"x": "1"}, kind="query argument")
