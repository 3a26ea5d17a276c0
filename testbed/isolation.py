"""Per-request fault isolation: find which requests of a failed batch the failure belongs to.

A batch operation over several requests (sampling, prompt logprobs, speculative verification or
proposal) that raises is run again one request at a time: the requests that fail alone are the culprits
and finish with RequestStatus.FINISHED_ERROR (the scheduler frees them like any other finished request),
the others keep what they got alone, and the step goes on. A batch that fails while every request
succeeds alone is no request's fault: the first error propagates, and the engine fails the whole step.

Nothing here runs until something raises: the batch paths carry no per-request try/except.
"""

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


class RunInvalid(RuntimeError):
    """An error that invalidates the whole run rather than some requests (a simulation that stopped
    following its recording): never isolated, it propagates out of Engine.step."""


def error_message(what: str, error: BaseException) -> str:
    """The message a failed request carries (Request.error, RequestOutput.error, the server's body)."""
    return f"{what} failed: {type(error).__name__}: {error}"


def find_culprits(
    run_one: Callable[[K], V], keys: Iterable[K], error: Exception, what: str
) -> tuple[dict[K, V], dict[K, str]]:
    """After a batch over `keys` raised `error`: run_one(key) for each key alone. Returns the results of
    those that succeed and {key: error message} of those that raise. Re-raises `error` if none raises
    alone (the failure is the batch's, not a request's)."""
    results: dict[K, V] = {}
    failed: dict[K, str] = {}
    for key in keys:
        try:
            results[key] = run_one(key)
        except RunInvalid:
            raise
        except Exception as e:
            logger.warning("%s failed for one request of the batch", what, exc_info=e)
            failed[key] = error_message(what, e)
    if not failed:
        raise error
    return results, failed
