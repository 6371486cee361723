"""A listener on the loopback address that accepts every connection and never answers:
the server behind the deadline tests (object storage, Ray by address)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[str, list[socket.socket]]]:
    """``("127.0.0.1:PORT", the connections accepted so far)``; closed on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # kept open, never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", held
    finally:
        stop.set()
        thread.join()
        for sock in held:
            sock.close()
        listener.close()
