"""Run a module with every non-loopback network connection refused and recorded.

    python -m tests.support.network_guard RECORD_FILE module.name [args...]

Patches ``socket.socket.connect`` and ``socket.getaddrinfo`` before the module is imported; any
attempt to reach a host other than localhost raises and is appended to RECORD_FILE.
"""

from __future__ import annotations

import runpy
import socket
import sys

LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}


def install(record_file: str) -> None:
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def record(target: str) -> None:
        with open(record_file, "a") as handle:
            handle.write(target + "\n")

    def guarded_connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and self.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            record(f"connect {host}")
            raise ConnectionRefusedError(f"network blocked by test: {host}")
        return real_connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host not in LOOPBACK and host is not None:
            record(f"resolve {host}")
            raise socket.gaierror(f"network blocked by test: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = guarded_connect
    socket.getaddrinfo = guarded_getaddrinfo


if __name__ == "__main__":
    install(sys.argv[1])
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
