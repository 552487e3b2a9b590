"""What each server route takes, checked in one place: a request's JSON fields and query arguments.

Every route of :mod:`jupyter_cluster.server.handlers` names a :class:`Fields`
(none taken is :data:`NOTHING`); :meth:`Fields.check` refuses a field or
argument the route does not know, or one of the wrong type, with one sentence
naming it, before any work is done.  A misspelt ``{"min": 2}`` once went
unnoticed and scaled a cluster down to zero workers (issue 37.6).

Nothing here imports tornado: the handlers translate :class:`ClusterError` to a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ClusterError
from .models import validate_count, validate_name, validate_size

#: checks a field's value: returns it (or what it means) or raises :class:`ClusterError`
Check = Callable[[Any], Any]

#: query arguments any route takes: Jupyter's own (its token login and XSRF form field)
JUPYTER_ARGUMENTS = frozenset({"token", "_xsrf"})


def cache_buster(key: str, value: str) -> bool:
    """Whether a query argument is JupyterLab's cache buster: ``?<milliseconds>`` with no value.

    JupyterLab 4.6's ServerConnection adds one to GET requests so that no
    browser cache answers them; it is no argument of ours, and refusing it
    refused every panel GET (the New dialog's backends, the detached jobs).
    """
    return key.isdigit() and not value


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def count(what: str, minimum: int = 0) -> Check:
    """A whole number from ``minimum`` to :data:`~.models.MAX_WORKERS` (``what`` names it in the error)."""
    return lambda value: validate_count(value, what, minimum)


def size(what: str) -> Check:
    """A memory size (:func:`~.models.validate_size`)."""
    return lambda value: validate_size(value, what)


def name(value: Any) -> str:
    """A cluster name (:func:`~.models.validate_name`)."""
    return validate_name(value)


def text(what: str, longest: int = 1000) -> Check:
    """A text of 1 to ``longest`` characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not 1 <= len(value) <= longest:
            raise ClusterError(f"{what} must be a text of 1 to {longest} characters, not {_shown(value)}.")
        return value

    return check


@dataclass(frozen=True)
class Fields:
    """The fields one route takes.

    Parameters
    ----------
    what : str
        The route's request in words, for the error ("a new cluster", "adapt").
    checks : mapping
        Field name -> :data:`Check`.  A field given as JSON ``null`` (or not
        given) is left out of what :meth:`check` returns: the route's default.
    required : tuple of str
        Fields that must be given (not null); ``hint`` says how.
    one_of : bool
        At least one field must be given (an empty request would do something no one asked for).
    hint : str
        The sentence's second part when a required field is missing, e.g. ``'give {"workers": N}'``.
    """

    what: str
    checks: Mapping[str, Check] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    one_of: bool = False
    hint: str = ""

    def check(self, data: Mapping[str, Any], kind: str = "field") -> dict[str, Any]:
        """The given fields, checked; :class:`ClusterError` (one sentence naming the field) for any other.

        ``kind`` is what the fields are called in the sentence ("field", "query argument").
        """
        unknown = sorted(str(k) for k in data if k not in self.checks)
        if unknown:
            shown = ", ".join(repr(k[:40]) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            takes = f"takes {_listed(list(self.checks))}" if self.checks else f"takes no {kind}s"
            raise ClusterError(f"unknown {kind}{'s' if len(unknown) > 1 else ''} {shown}; {self.what} {takes}.")
        given = {k: v for k, v in data.items() if v is not None}
        missing = [k for k in self.required if k not in given]
        if missing or (self.one_of and not given):
            raise ClusterError(f"{self.hint or 'give ' + _listed(list(missing or self.checks))}.")
        return {k: self.checks[k](v) for k, v in given.items()}


#: a route that takes no fields (or no query arguments)
NOTHING = Fields("this request")
