"""Every distribution of this repository: its version, from one place, and its wheel and
sdist.

The version of every distribution is the one in ``VERSION`` at the repository's root.
The packaging files carry it too (a pyproject's ``version``, a package's
``__version__``), because an sdist built from one folder cannot read a file above it;
this tool writes them and checks them:

    python tools/dists.py version            # print it; exit 1 where a file disagrees
    python tools/dists.py version 0.3.0      # set it in VERSION and every file
    python tools/dists.py build [--out DIR]  # an sdist and a wheel of every distribution
    python tools/dists.py list               # name, folder, import packages

``build`` makes the sdist of each distribution and then its wheel from that sdist (as
``python -m build`` does), from a copy of the files git tracks in its folder (a file not
added to git, or a data file the pyproject does not list, is missing from both, and the
checks of tests/wheels see it). It builds without isolation, with the
setuptools of the running Python (./dev set-up installs it), so it needs no network.
The example pack in ``examples/`` is not built here: a third party builds theirs in its
own folder (tests/wheels builds it outside this repository).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_FILE = ROOT / "VERSION"
#: The distributions' folders (as ./dev finds them), the core first.
FOLDERS = tuple(p.parent.relative_to(ROOT).as_posix()
                for pattern in ("diffract_core", "diffract_kernels_*", "plugins/*",
                                "kernel_fun_gpu")
                for p in sorted(ROOT.glob(f"{pattern}/pyproject.toml")))
#: What every distribution's name starts with (the import names do not change).
PREFIX = "diffractml-"
_PYPROJECT_VERSION = re.compile(r'^version = "([^"]*)"$', re.M)
_INIT_VERSION = re.compile(r'^__version__ = "([^"]*)"$', re.M)


def version() -> str:
    return VERSION_FILE.read_text().strip()


def distributions() -> list[dict]:
    """Name, folder and import packages of each distribution (the core first)."""
    out = []
    for folder in FOLDERS:
        meta = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
        packages = sorted(p.parent.name for p in (ROOT / folder / "src").glob("*/__init__.py"))
        out.append({"name": meta["name"], "folder": folder, "packages": packages})
    return out


def _places() -> list[tuple[Path, re.Pattern]]:
    places = []
    for d in distributions():
        places.append((ROOT / d["folder"] / "pyproject.toml", _PYPROJECT_VERSION))
        for package in d["packages"]:
            init = ROOT / d["folder"] / "src" / package / "__init__.py"
            if _INIT_VERSION.search(init.read_text()):
                places.append((init, _INIT_VERSION))
    return places


def disagreements() -> list[str]:
    """Each file whose version is not VERSION's, as 'path: found'."""
    want = version()
    out = []
    for path, pattern in _places():
        found = pattern.findall(path.read_text())
        if found != [want]:
            out.append(f"{path.relative_to(ROOT)}: {', '.join(found) or 'no version'}")
    return out


def set_version(new: str) -> None:
    if not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", new):
        raise SystemExit(f"dists: {new!r} is not a version such as 0.3.0 or 0.3.0rc1")
    for path, pattern in _places():
        text = path.read_text()
        path.write_text(pattern.sub(lambda m: m.group(0).replace(m.group(1), new), text,
                                    count=1))
    VERSION_FILE.write_text(new + "\n")


def build(out: Path, names: list[str] | None = None) -> list[Path]:
    """An sdist and a wheel (built from the sdist) of each distribution into ``out``."""
    bad = disagreements()
    if bad:
        raise SystemExit("dists: versions disagree with VERSION (run `python tools/dists.py "
                         "version " + version() + "`):\n  " + "\n  ".join(bad))
    out.mkdir(parents=True, exist_ok=True)
    for d in distributions():
        if names and d["name"] not in names:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            # from a copy of the files git tracks: an editable install's egg-info in the
            # tree lists every file it saw, and setuptools would put those in the sdist
            # even when the pyproject forgets them
            folder = Path(scratch) / Path(d["folder"]).name
            for rel in tracked(d["folder"]):
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / d["folder"] / rel, folder / rel)
            subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(out.resolve()), str(folder)], check=True,
                           stdout=subprocess.DEVNULL)
    return sorted(out.iterdir())


def tracked(folder: str) -> list[str]:
    """The files of ``folder`` (relative to it) that git tracks, as they are on disk."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=ROOT / folder,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [f for f in listed if f and (ROOT / folder / f).is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/dists.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("version", help="print (or set) the version; check every file")
    v.add_argument("new", nargs="?")
    b = sub.add_parser("build", help="an sdist and a wheel of every distribution")
    b.add_argument("--out", type=Path, default=ROOT / "dist")
    b.add_argument("names", nargs="*", help="only these distributions")
    sub.add_parser("list", help="name, folder and import packages of each distribution")
    args = parser.parse_args(argv)
    if args.cmd == "version":
        if args.new:
            set_version(args.new)
        bad = disagreements()
        print(version())
        for line in bad:
            print(f"  disagrees: {line}", file=sys.stderr)
        return 1 if bad else 0
    if args.cmd == "build":
        for path in build(args.out, args.names):
            print(path)
        return 0
    for d in distributions():
        print(f"{d['name']:32} {d['folder']:34} {' '.join(d['packages'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
