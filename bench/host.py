"""What the benchmarks read off this host (Linux /proc) and ask of it: a process's resident memory, the load
average, a free loopback port."""

from __future__ import annotations

import socket
from pathlib import Path


def rss_mib(pid: int) -> float:
    """Resident memory of a process (VmRSS), in MiB; NaN where /proc does not say."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_average() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def free_port() -> int:
    """A loopback TCP port free now (the OS's choice), for a server started next."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
