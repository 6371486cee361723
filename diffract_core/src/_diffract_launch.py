"""The ``diffract`` command's launcher: Ctrl-C or SIGTERM before ``diffract.cli.main``
takes them over (while Diffract is imported) ends it with exit 130 (143), no traceback."""

import os
import signal


def _early(signum: int, frame: object) -> None:
    os.write(2, b"diffract: interrupted while starting; nothing was done.\n")
    os._exit(130 if signum == signal.SIGINT else 143)


def main() -> int:
    signal.signal(signal.SIGINT, _early)
    signal.signal(signal.SIGTERM, _early)
    from _diffract_shared import say_if_shared

    say_if_shared()
    from diffract import cli

    return cli.exit_process(cli.main())

