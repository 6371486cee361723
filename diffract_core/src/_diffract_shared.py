"""Is the ``diffract`` package here shared with another distribution? A module outside
the package, so that the ``diffract`` command (its launcher) still says so when the other
distribution's files have replaced the package's own; ``import diffract`` asks it too."""

import functools
import os

#: Distributions of the package registry with a ``diffract`` package of their own (as
#: their dist-info folders spell them): the original Diffract (``diffract-core``) and
#: ``diffract``, a tool that diffs Python objects.
OTHERS = ("diffract_core", "diffract")


def shared_with(folder: str, package: str, others: tuple[str, ...]) -> str | None:
    """'name version' of a distribution in ``others`` whose record lists files of
    ``package`` in ``folder`` (a site-packages), or None. Reads the folder's listing and
    those records only: importing importlib.metadata costs more than ``import diffract``."""
    entries = os.listdir(folder) if os.path.isdir(folder) else []
    for entry in entries:
        stem, _, version = entry.removesuffix(".dist-info").partition("-")
        if entry.endswith(".dist-info") and stem.lower() in others:  # only their records
            try:
                with open(os.path.join(folder, entry, "RECORD"), encoding="utf-8") as record:
                    if any(r.startswith(package + "/") for r in record):
                        plain = "".join(c for c in version if c.isalnum() or c in "._+")[:40]
                        return f"{stem.replace('_', '-').lower()} {plain}"
            except OSError:
                pass
    return None


@functools.cache  # once a process
def say_if_shared() -> None:
    """One line on stderr, once a process, when a distribution in :data:`OTHERS` also
    installed files of a ``diffract`` package where this one is: pip lets the last one
    installed overwrite the other's files, and uninstalling either breaks the other."""
    other = shared_with(os.path.dirname(__file__), "diffract", OTHERS)
    if other:
        os.write(2, (f"diffract: the package 'diffract' here belongs to two distributions, "
                     f"diffractml-core (Diffract) and {other} (another library of the same "
                     f"import name), whose files overwrite each other; keep one: pip "
                     f"uninstall {other.split()[0]}, then pip install --force-reinstall "
                     f"--no-deps diffractml-core\n").encode())
