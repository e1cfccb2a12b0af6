"""Tools that try to break a capability guarantee, in ways that patching Python functions
inside the tool's process does not stop."""

import ctypes
import os
import socket
import subprocess


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def connect_ex(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    return {"connect_ex": s.connect_ex(("127.0.0.1", p["port"]))}


def sendto(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    return {"sent": s.sendto(b"ping", ("127.0.0.1", p["port"]))}


def raw_socket_syscall(p):
    libc = _libc()
    fd = libc.syscall(41, socket.AF_INET, socket.SOCK_STREAM, 0)  # SYS_socket, past the socket module
    return {"fd": fd, "errno": ctypes.get_errno()}


def posix_spawn(p):
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    return {"spawned": os.waitpid(pid, 0)[1]}


def popen(p):
    return {"stdout": subprocess.run(["/bin/echo", "escaped"], capture_output=True).stdout.decode()}


def ctypes_fork(p):
    libc = _libc()
    pid = libc.syscall(57)  # SYS_fork, past os.fork
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    return {"fork": pid, "errno": ctypes.get_errno()}


def exec_other(p):
    os.execv("/bin/echo", ["/bin/echo", "replaced"])


def thread(p):
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append("ran in a thread"))
    t.start()
    t.join()
    return out


def write_file(p):
    with open(p["path"], "w") as f:
        f.write("written")
    return "written"


def write_via_fd(p):
    fd = os.open(p["path"], os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"written")
    os.close(fd)
    return "written"


def read_file(p):
    with open(p["path"]) as f:
        return f.read()


def environ(p):
    return dict(os.environ)


def host_environ(p):
    """The environment of the process that started the worker's sandbox, read from /proc."""
    with open(f"/proc/{p['pid']}/environ", "rb") as f:
        return f.read().decode(errors="replace")


def processes(p):
    return sorted(int(e) for e in os.listdir("/proc") if e.isdigit())
