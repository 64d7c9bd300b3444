"""Test helpers that are safe to import anywhere: unlike conftest, importing this sets no environment
(the benchmarks use it too)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
