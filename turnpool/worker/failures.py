"""The failure classes: why an env failed, as data carried in every failed env's info.

Every failed env's result carries its class in ``info["failure"]`` (with
``info["retryable"]``) and `turnpool.worker.results.TurnResult.failure`, set where it is
decided (the host, the deadline, the backend, the pool); nothing reads a class out of a
message text. This module depends on nothing in turnpool but the sandbox's error type, which
`failure_of_exception` imports when it is called.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any


class Failure(str, enum.Enum):
    """Why an env failed, as carried in ``info["failure"]`` of every failed env (with
    ``info["retryable"]``): the one list of failure classes. A member is its string (``==``,
    ``hash``, ``str``, f-strings and JSON all see ``"env_error"`` etc.), so infos and metrics
    keyed by class name are unchanged; infos hold the plain string (`failure_info`).

    >>> Failure.of(None), Failure.of("timeout").retryable, f"{Failure.WORKER_LOST}"
    (<Failure.ENV_ERROR: 'env_error'>, True, 'worker_lost')
    """

    ENV_ERROR = "env_error"              # env code raised
    TIMEOUT = "timeout"                  # a step or reset ran past its deadline
    WORKER_LOST = "worker_lost"          # the worker holding the env died (or was killed)
    UNPICKLABLE = "unpicklable"          # an action or result could not cross a process boundary
    POLICY_ERROR = "policy_error"        # the policy could not produce a reply for the env
    CONSTRUCT_ERROR = "construct_error"  # the env could not be built
    SANDBOX_ERROR = "sandbox_error"      # the sandbox running the env's untrusted code failed

    # print as the plain string (as `enum.StrEnum` does, which Python 3.10 lacks)
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]

    @property
    def retryable(self) -> bool:
        """Whether running the episode again from the same seed can succeed (the env itself
        is not to blame)."""
        return self in _RETRYABLE

    @classmethod
    def of(cls, value: object) -> Failure:
        """The class ``value`` names (a member or its string); `ENV_ERROR` when it names none
        (``None``, an unknown word): the one reading of a failure class."""
        try:
            return _BY_NAME.get(value, Failure.ENV_ERROR)  # type: ignore[call-overload]
        except TypeError:  # unhashable: names no class
            return Failure.ENV_ERROR


_RETRYABLE = frozenset({Failure.TIMEOUT, Failure.WORKER_LOST, Failure.POLICY_ERROR,
                        Failure.SANDBOX_ERROR})
_BY_NAME: dict[str, Failure] = {f.value: f for f in Failure}

#: Failure class name -> retryable, for readers that want plain strings (`Failure` is the
#: source).
FAILURE_CLASSES: dict[str, bool] = {f.value: f.retryable for f in Failure}



def failure_of_exception(exc: BaseException) -> Failure:
    """The class of an exception raised by env code: `Failure.SANDBOX_ERROR` when the sandbox
    that runs the env's untrusted code failed (`turnpool.sandbox.SandboxError`), else
    `Failure.ENV_ERROR`."""
    from turnpool.sandbox import SandboxError
    return Failure.SANDBOX_ERROR if isinstance(exc, SandboxError) else Failure.ENV_ERROR



def failure_info(failure: str) -> dict[str, Any]:
    """``{"failure": failure, "retryable": ...}`` for a class of `Failure` (the info holds
    the plain string)."""
    if failure not in _BY_NAME:
        raise ValueError(f"unknown failure class {failure!r}; one of {list(FAILURE_CLASSES)}")
    cls = _BY_NAME[failure]
    return {"failure": cls.value, "retryable": cls.retryable}


def failure_of(info: Mapping[str, Any]) -> Failure:
    """The failure class of a failed env's info (`Failure.ENV_ERROR` when it names none)."""
    return Failure.of(info.get("failure"))

