"""model_cdn's exception tree, by the rules tests/test_exception_trees.py holds every
package to: each exception lives in (or is re-exported from) ``_errors``, is exported
from ``model_cdn``, derives from ``CdnError`` and is drawn where it sits.
"""

from __future__ import annotations

import importlib

import model_cdn
from model_cdn import CdnError

from . import test_exception_trees as trees

# None left: AdminApiError lives in _errors (the admin client stays in model_cdn as its
# library client); SimulatorError moved out with the simulator (tandem.simulator).
PENDING: set[str] = set()


def test_every_cdn_exception_is_in_errors_exported_and_under_cdn_error() -> None:
    errors = importlib.import_module("model_cdn._errors")
    defined = trees.defined_exceptions("model_cdn")
    assert {"CdnError", "HttpError", "RolloutStateError", "BrokerError"} <= set(defined)
    for name, cls in defined.items():
        assert issubclass(cls, CdnError), f"{name} does not derive from CdnError"
        if name in PENDING:
            continue
        assert getattr(errors, name, None) is cls, f"{name} is not in model_cdn._errors"
        assert getattr(model_cdn, name, None) is cls, f"model_cdn does not export {name}"
        assert name in model_cdn.__all__, f"{name} is missing from model_cdn.__all__"


def test_the_drawn_cdn_tree_is_the_class_tree() -> None:
    trees.test_the_drawn_tree_is_the_class_tree("model_cdn", CdnError)


def test_an_http_answer_carries_its_status_and_headers() -> None:
    from model_cdn.http._errors import status_of

    denied = model_cdn.AuthDenied(429, "slow down", {"Retry-After": "3"})
    assert isinstance(denied, model_cdn.AuthError)
    assert (status_of(denied), denied.headers) == (429, {"Retry-After": "3"})
    past_end = model_cdn.RangeNotSatisfiableError(10)
    assert (status_of(past_end), past_end.headers) == (416, {"Content-Range": "bytes */10"})
