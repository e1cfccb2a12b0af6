"""Type stubs for the compiled module machina_dispatch._core."""

from typing import Any

__version__: str
MAX_REQUEST_BYTES: int
MAX_OUTPUT_BYTES: int
BUILTIN_PLUGIN_FILE: str

class HostError(RuntimeError): ...

def error_kinds() -> list[tuple[str, str, bool]]: ...
def issue_lease(aid: str, ttl_s: float = 60.0, secret: str | None = None) -> str: ...

class Session:
    def __init__(self, delta: bool = True) -> None: ...
    @property
    def delta(self) -> bool: ...
    def state_json(self) -> str: ...

class Host:
    def __init__(
        self,
        *,
        max_request_bytes: int = ...,
        max_output_bytes: int = ...,
        idempotency_ttl_ms: int = ...,
        idempotency_max_entries: int = ...,
        breaker_threshold: int = ...,
        breaker_window_ms: int = ...,
        breaker_cooldown_ms: int = ...,
    ) -> None: ...
    def load_plugin(self, path: str) -> list[str]: ...
    def list_tools(self) -> list[dict[str, Any]]: ...
    def call_json(self, request: str | bytes, session: Session, aid: str = "") -> str: ...
    @property
    def idempotency_entries(self) -> int: ...
