"""What the NATS transport and the hosts it calls (machina-toolhost --nats) agree on:
subjects and the durable mode's headers (docs/nats.md)."""

from __future__ import annotations

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "HDR_MSG_ID",
    "HDR_REPLY_TO",
    "HDR_REQUEST_ID",
    "call_subject",
    "durable_subject",
    "tools_subject",
]

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_PREFIX = "machina"

# Durable mode: where the answer goes, and which request it answers.
HDR_REPLY_TO = "Machina-Reply-To"
HDR_REQUEST_ID = "Machina-Request-Id"
HDR_MSG_ID = "Nats-Msg-Id"  # JetStream's publish de-duplication


def call_subject(prefix: str) -> str:
    """The subject that takes any call (our envelope names the tool)."""
    return f"{prefix}.call"


def tools_subject(prefix: str) -> str:
    """The subject that answers the registered tools (as ``--list`` prints them)."""
    return f"{prefix}.tools"


def durable_subject(prefix: str) -> str:
    """The durable (JetStream) mode's subject for calls."""
    return f"{prefix}.durable.call"
