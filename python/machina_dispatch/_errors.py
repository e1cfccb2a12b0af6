"""One exception hierarchy for every transport.

Each failure has a *kind*: the dispatch error types (``timeout``, ``crash``,
``parse_error``, ``not_found``, ``exception``) for what goes wrong around the host, and,
for errors the host itself reports, the wire ``code`` (``tool_not_found``,
``tool_error``, ``lease_required``, …) — except ``tool_crashed``, which is a ``crash``
too. Each kind has one exception class; the classes also derive from the builtin that
fits, so ``except TimeoutError`` or ``except LookupError`` work as expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _core

if TYPE_CHECKING:
    from ._result import ToolResult

__all__ = [
    "AccessDenied",
    "AuditUnavailable",
    "BreakerOpen",
    "Cancelled",
    "CapabilityRefused",
    "DispatchError",
    "ExecutableNotFound",
    "HostError",
    "IdempotencyConflict",
    "InternalError",
    "InvalidInput",
    "LeaseError",
    "LeaseRejected",
    "LeaseRequired",
    "Overloaded",
    "ProtocolError",
    "RequestRejected",
    "SystemFailure",
    "TargetNotFound",
    "ServiceError",
    "ToolCrashed",
    "ToolError",
    "ToolFailed",
    "ToolFault",
    "ToolNotFound",
    "ToolTimeout",
    "ToolhostError",
    "error_class",
    "kind_of_code",
]


class ToolhostError(Exception):
    """A call that did not succeed.

    Attributes:
        kind: the error type (a dispatch error type, or the host's wire code).
        aid: the tool that was called.
        detail: what happened, for people and logs.
        code: the host's wire code, or ``None`` if the host gave no answer.
        result: the full :class:`~machina_dispatch.ToolResult`.
    """

    kind: str = "exception"

    def __init__(self, result: ToolResult) -> None:
        message = f"{result.aid}: {result.error}" if result.aid else result.error
        hint = (result.details or {}).get("hint")
        super().__init__(f"{message} ({hint})" if hint else message)
        self.result = result
        self.aid = result.aid
        self.detail = result.error
        self.code = result.code
        if result.kind:
            self.kind = result.kind  # the exact kind (the class may stand for several)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.result,))


# --- failures around the host (the dispatch error types) ---------------------------


class HostError(ToolhostError, RuntimeError):
    """The host cannot be set up: an invalid option or flag, a plugin that cannot be loaded,
    lease enforcement without a usable secret. Raised when a transport (or ``Host``) is
    made — never by a call — by every transport alike."""

    kind = "host_error"

    def __init__(self, problem: str | ToolResult) -> None:
        if isinstance(problem, str):
            from ._result import ToolResult

            problem = ToolResult.failure("", "host_error", problem)
        super().__init__(problem)


class ToolTimeout(ToolhostError, TimeoutError):
    """The call overran its deadline (the host's ``timeout``, or no answer in time)."""

    kind = "timeout"


class ToolCrashed(ToolhostError):
    """The process running the call died: the host itself (spawn, pool), or an isolated
    tool's worker (``tool_crashed``)."""

    kind = "crash"


class ProtocolError(ToolhostError, ValueError):
    """The host's answer could not be read (``parse_error``), or there was none
    (``empty_output``)."""

    kind = "parse_error"


class ExecutableNotFound(ToolhostError, FileNotFoundError):
    """The ``machina-toolhost`` executable was not found (``not_found``)."""

    kind = "not_found"


class DispatchError(ToolhostError):
    """Something failed on the Python side (``exception``)."""

    kind = "exception"


# --- errors the host reports -------------------------------------------------------


class ToolNotFound(ToolhostError, LookupError):
    kind = "tool_not_found"


class InvalidInput(ToolhostError, ValueError):
    """The input is not JSON (``invalid_input``) or does not match the tool's schema
    (``schema_violation``); the tool did not run."""

    kind = "invalid_input"


class RequestRejected(ToolhostError, ValueError):
    """The request itself was refused (``malformed_request``, ``request_too_large``,
    ``invalid_ds_state``); nothing ran."""

    kind = "malformed_request"


class LeaseError(ToolhostError, PermissionError):
    """The lease gate refused the call."""


class LeaseRequired(LeaseError):
    """The tool needs a lease (``details``: ``tier``, ``aid``)."""

    kind = "lease_required"


class LeaseRejected(LeaseError):
    """The lease was refused (``details``: ``reason``)."""

    kind = "lease_rejected"


class IdempotencyConflict(ToolhostError, ValueError):
    kind = "idempotency_conflict"


class BreakerOpen(ToolhostError):
    """The tool's circuit breaker is open (``BREAKER_TRIP``); retry after the cool-down."""

    kind = "breaker_open"


class ToolError(ToolhostError):
    """The tool ran and failed (status ``TOOL_ERROR``)."""


class ToolFailed(ToolError):
    """The tool declined or failed on its own terms (``tool_error``)."""

    kind = "tool_error"


class ToolFault(ToolError):
    """The tool broke its contract (``tool_fault``, ``invalid_output``,
    ``output_too_large``)."""

    kind = "tool_fault"


class CapabilityRefused(ToolhostError, PermissionError):
    """A capability guarantee the tool requires cannot be enforced on this machine
    (``guarantee_blocked``) or is not covered by the tool's HTTP service
    (``coverage_missing``); the tool did not run."""

    kind = "guarantee_blocked"


class ServiceError(ToolError, ConnectionError):
    """An HTTP tool service failed: no connection (``service_unavailable``), an HTTP error
    status (``service_http_error``), an answer that is not one (``service_bad_response``)."""

    kind = "service_unavailable"


class Cancelled(ToolhostError):
    """The call was cancelled at its caller's request (``cancelled``; MCP's
    ``notifications/cancelled``) before it ended."""

    kind = "cancelled"


class AccessDenied(ToolError, PermissionError):
    """A tool pack's policy refused the call (``access_denied``: a path outside the roots or
    denied by name, a command not allowed; ``rate_limited``: past the tool's rate limit).
    The message starts with the service error type (``AccessDenied: ...``)."""

    kind = "access_denied"


class TargetNotFound(ToolError, FileNotFoundError):
    """What a tool pack's call named is not there (``target_not_found``: a file, a
    directory, a command); the message starts with ``NotFound:``."""

    kind = "target_not_found"


class SystemFailure(ToolError, OSError):
    """A tool pack's call failed on the system's side (``system_error``: disk full, a
    command that cannot be confined here); the message starts with ``SystemError:``."""

    kind = "system_error"


class Overloaded(ToolhostError):
    """Too many inline calls are stuck past their deadline (``overloaded``)."""

    kind = "overloaded"


class AuditUnavailable(ToolhostError):
    """The audit store cannot record (a full disk), and the call is one it must record
    before it is answered (``audit_unavailable``, ``--audit-required``): refused before the
    tool ran, or, when the call's own record failed, its output withheld. Retry once the
    store records again."""

    kind = "audit_unavailable"


class InternalError(ToolhostError):
    """A defect in the host (``internal_error``)."""

    kind = "internal_error"


# Wire code -> error kind, where they differ (every other code is its own kind).
_KIND_OF_CODE = {"tool_crashed": "crash"}

# Kind -> class. Every kind the host can report must be here (a test checks it against
# the core's list of codes).
_CLASS_OF_KIND: dict[str, type[ToolhostError]] = {
    "timeout": ToolTimeout,
    "crash": ToolCrashed,
    "parse_error": ProtocolError,
    "empty_output": ProtocolError,
    "not_found": ExecutableNotFound,
    "exception": DispatchError,
    "host_error": HostError,
    "request_too_large": RequestRejected,
    "malformed_request": RequestRejected,
    "invalid_ds_state": RequestRejected,
    "tool_not_found": ToolNotFound,
    "lease_required": LeaseRequired,
    "lease_rejected": LeaseRejected,
    "idempotency_conflict": IdempotencyConflict,
    "breaker_open": BreakerOpen,
    "invalid_input": InvalidInput,
    "schema_violation": InvalidInput,
    "tool_error": ToolFailed,
    "tool_fault": ToolFault,
    "output_too_large": ToolFault,
    "invalid_output": ToolFault,
    "guarantee_blocked": CapabilityRefused,
    "coverage_missing": CapabilityRefused,
    "service_unavailable": ServiceError,
    "service_http_error": ServiceError,
    "service_bad_response": ServiceError,
    "cancelled": Cancelled,
    "access_denied": AccessDenied,
    "rate_limited": AccessDenied,
    "target_not_found": TargetNotFound,
    "system_error": SystemFailure,
    "overloaded": Overloaded,
    "internal_error": InternalError,
    "audit_unavailable": AuditUnavailable,
}

CODES: tuple[str, ...] = tuple(code for code, _status, _breaker, _type in _core.error_kinds())


def kind_of_code(code: str) -> str:
    """The error kind of a wire code."""
    return _KIND_OF_CODE.get(code, code)


def error_class(kind: str) -> type[ToolhostError]:
    """The exception class raised for an error kind."""
    return _CLASS_OF_KIND.get(kind, DispatchError)


def kind_table() -> dict[str, str]:
    """Every wire code the core knows -> its kind (for the result factory)."""
    return {code: kind_of_code(code) for code in CODES}
