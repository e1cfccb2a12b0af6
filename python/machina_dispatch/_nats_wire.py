"""What the NATS front and the NATS transport agree on: subjects, headers, the durable
stream's names (docs/nats.md)."""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "DURABLE_CONSUMER",
    "DURABLE_STREAM",
    "HDR_ERROR",
    "HDR_ERROR_CODE",
    "HDR_IDEMPOTENCY_KEY",
    "HDR_LEASE",
    "HDR_MSG_ID",
    "HDR_REPLY_TO",
    "HDR_REQUEST_ID",
    "HDR_TIMEOUT_MS",
    "HDR_USER",
    "HDR_WIRE_CODE",
    "IDEMPOTENCY_BUCKET",
    "QUEUE_GROUP",
    "SERVICE_NAME",
    "call_subject",
    "durable_subject",
    "tool_subject",
    "tools_subject",
]

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PREFIX = "machina"
SERVICE_NAME = "machina-toolhost"
QUEUE_GROUP = "q"  # the micro-service default: every host of the group shares the load
DURABLE_STREAM = "MACHINA_CALLS"
DURABLE_CONSUMER = "machina-hosts"
IDEMPOTENCY_BUCKET = "machina_idempotency"

# The micro-service error headers (ADR-32): a description and a numeric code.
HDR_ERROR = "Nats-Service-Error"
HDR_ERROR_CODE = "Nats-Service-Error-Code"
# The host's own wire code of a failure (e.g. "access_denied").
HDR_WIRE_CODE = "Machina-Error-Code"
# Call options for bodies that are not our envelope (seed fields, OpenAI calls).
HDR_IDEMPOTENCY_KEY = "Idempotency-Key"
HDR_LEASE = "Machina-Lease"
HDR_USER = "Machina-User"
HDR_TIMEOUT_MS = "Machina-Timeout-Ms"
# Durable mode: where the answer goes, and which request it answers.
HDR_REPLY_TO = "Machina-Reply-To"
HDR_REQUEST_ID = "Machina-Request-Id"
HDR_MSG_ID = "Nats-Msg-Id"  # JetStream's publish de-duplication

# NATS subject tokens: no whitespace, no wildcards, no empty token.
_SUBJECT_SAFE = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*")


def call_subject(prefix: str) -> str:
    """The subject that takes any call (our envelope names the tool)."""
    return f"{prefix}.call"


def tools_subject(prefix: str) -> str:
    """The subject that answers the registered tools (as ``--list`` prints them)."""
    return f"{prefix}.tools"


def tool_subject(prefix: str, aid: str) -> str | None:
    """The subject of one tool, or None when its aid cannot be a subject (that tool is
    reachable through :func:`call_subject` only)."""
    return f"{prefix}.tool.{aid}" if _SUBJECT_SAFE.fullmatch(aid) else None


def durable_subject(prefix: str) -> str:
    """The durable (JetStream) mode's subject for calls."""
    return f"{prefix}.durable.call"
