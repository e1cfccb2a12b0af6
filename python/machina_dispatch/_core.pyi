"""Type stubs for the compiled module machina_dispatch._core."""

from collections.abc import Callable
from typing import Any

__version__: str
MAX_REQUEST_BYTES: int
MAX_OUTPUT_BYTES: int
BUILTIN_PLUGIN_FILE: str
RESULT_FIELDS: tuple[str, ...]


def error_kinds() -> list[tuple[str, str, bool, str]]: ...
def llm_function_names(aids: list[str] | list[bytes]) -> list[str]: ...
def advertised_input_schema(schema_json: str) -> str: ...
def host_options() -> list[str]: ...
def host_option_table() -> list[dict[str, Any]]: ...
def loads_plugin_libraries(plugins: list[str] | None) -> bool: ...
def issue_lease(aid: str, ttl_s: float = 60.0, secret: str | None = None) -> str: ...
def call(
    host: Host,
    aid: str,
    input_json: str,
    session: Session,
    idempotency_key: str | None,
    lease_token: str | None,
    timeout_ms: int | None,
    ds_state_json: str | None,
    user: str | None = None,
    /,
) -> Any: ...
# InProcess.call compiled: an instance method (see machina_dispatch.inprocess).
_inprocess_call: Any

class InProcessState:
    """What InProcess.call needs of an open InProcess transport (its ``_fast``)."""
    host: Host
    default_timeout_ms: int
    def __init__(self, host: Host, default_timeout_ms: int, input_text: Callable[[str, Any], str | Any],
                 state_text: Callable[[str, Any], str | Any | None], apply_state: Callable[[Any, Any], None],
                 timeout_ms: Callable[[float], int]) -> None: ...

def run_to_completion(executable: str, argv: list[str], env: list[str] | None, input: bytes, timeout_s: float,
                      max_stdout: int, tail_bytes: int = 4096) -> tuple[str, bytes, int, str, str]: ...

class ChildProcess:
    pid: int
    input_fd: int
    stdout_fd: int
    exit_code: int
    def __init__(self, executable: str, argv: list[str], env: list[str] | None = None,
                 tail_bytes: int = 4096) -> None: ...
    def tail(self) -> str: ...
    def close_input(self) -> None: ...
    def exited(self) -> bool: ...
    def wait_exit(self, timeout_s: float) -> bool: ...
    def kill(self) -> None: ...
    def end(self, drain_s: float = 1.0) -> str: ...

def round_trip(fd_in: int, fd_out: int, line: bytes, timeout_s: float, write_lock: Any,
               spin_us: int = ..., id: int = ..., aid: str | None = ...) -> tuple[int, bytes, int, Any]: ...
def encode_request(
    id: int,
    aid: str,
    input_json: str,
    idempotency_key: str | None = None,
    lease_token: str | None = None,
    timeout_ms: int | None = None,
    ds_state_json: str | None = None,
    user: str | None = None,
    /,
) -> bytes: ...
def encode_requests(calls: list[tuple[Any, ...]]) -> bytes: ...
def decode_responses(data: bytes, start: int, aids: dict[int, str]) -> tuple[list[tuple[int, Any]], int]: ...
def decode_response(line: bytes, aid: str) -> Any: ...
def delta_between(before: str, after: str) -> str: ...
def _configure_results(cls: type, kinds: dict[str, str]) -> None: ...
def _configure_errors(cls: type) -> None: ...

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
        idempotency_max_key_bytes: int = ...,
        idempotency_max_bytes: int = ...,
        breaker_threshold: int = ...,
        breaker_window_ms: int = ...,
        breaker_cooldown_ms: int = ...,
        timeout_ms: int = ...,
        max_timeout_ms: int = ...,
        tool_timeouts_ms: dict[str, int] = ...,
        max_stuck_calls: int = ...,
        isolation: str = ...,
        worker_executable: str | None = ...,
        isolation_workers: int = ...,
        limit_cpu_s: int = ...,
        limit_memory_mb: int = ...,
        limit_open_files: int = ...,
        limit_file_size_mb: int = ...,
        no_network: bool = ...,
        worker_env: list[str] = ...,
        python_workers: int = ...,
        python_memory_mb: int = ...,
        container_runtime: str = ...,
        skill_tick_ms: int = ...,
        audit_db: str = ...,
        audit_jsonl: str = ...,
        audit_retention_days: int = ...,
        audit_max_rows: int = ...,
        audit_required: str = ...,
        audit_jsonl_max_mb: int = ...,
    ) -> None: ...
    def load_plugin(self, path: str) -> list[str]: ...
    def load_tools(self, path: str) -> list[str]: ...
    def add_packs(self, packs: list[str] = ..., policy: str | None = ...) -> list[str]: ...
    def load_default_tools(self, plugins: list[str] | None = None, packs: list[str] | None = None,
                           policy: str | None = None, tools: list[str] = ..., *, builtin_plugin: str) -> list[str]: ...
    def list_tools(self) -> list[dict[str, Any]]: ...
    def resolve_tool(self, name: str) -> str | None: ...
    def call_json(self, request: str | bytes, session: Session, aid: str = "", front: str = "python",
                  local_caller: bool = True) -> str: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def session_started(self, id: str) -> None: ...
    def session_ended(self, id: str) -> None: ...
    @property
    def idempotency_entries(self) -> int: ...
