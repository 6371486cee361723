"""The ``diffract`` command's launcher: it takes over Ctrl-C and SIGTERM before anything
of Diffract is imported, so a signal during start-up ends the command with a message and
exit 130 (143), never a traceback; :func:`diffract.cli.main` takes them over from there."""

import os
import signal
import sys


def _early(signum: int, frame: object) -> None:
    sys.stderr.write("diffract: interrupted while starting; nothing was done.\n")
    sys.stderr.flush()
    os._exit(130 if signum == signal.SIGINT else 143)


def main() -> int:
    """Run ``diffract.cli.main`` with the start-up signal handlers in place."""
    signal.signal(signal.SIGINT, _early)
    signal.signal(signal.SIGTERM, _early)
    from diffract.cli import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
