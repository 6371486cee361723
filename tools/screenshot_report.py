"""Render a Diffract HTML report in headless Chromium to a PNG, for a person to look at.

    python tools/screenshot_report.py REPORT.html [OUT.png] [--width 1280] [--height 4000]

Without REPORT.html (``-``) it runs ``diffract demo`` into a temporary folder first and
shoots its report. It uses the first of: a ``chromium``/``chromium-browser``/
``google-chrome``/``headless_shell`` binary on PATH (``--headless --screenshot``), or
Playwright's Chromium (``pip install playwright && playwright install chromium``). The
report needs no network: this also checks that it renders offline. Not part of the
test suite (no browser on CI); the tests parse the report instead.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
            "headless_shell")


def with_binary(binary: str, report: Path, out: Path, width: int, height: int) -> None:
    subprocess.run([binary, "--headless=new", "--disable-gpu", "--no-sandbox",
                    "--hide-scrollbars", f"--window-size={width},{height}",
                    f"--screenshot={out}", report.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)


def with_playwright(report: Path, out: Path, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch()
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(report.resolve().as_uri())
        page.screenshot(path=str(out), full_page=True)
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", default="-")
    parser.add_argument("out", nargs="?", default="report.png")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=4000)
    args = parser.parse_args()
    if args.report == "-":
        folder = Path(tempfile.mkdtemp(prefix="diffract-shot-"))
        subprocess.run([sys.executable, "-m", "diffract.cli", "demo", "--out", str(folder)],
                       check=True)
        report = folder / "report.html"
    else:
        report = Path(args.report)
    if not report.is_file():
        print(f"screenshot_report: {report} is not a file", file=sys.stderr)
        return 2
    out = Path(args.out)
    binary = next((b for b in map(shutil.which, BINARIES) if b), None)
    try:
        if binary is not None:
            with_binary(binary, report, out, args.width, args.height)
        else:
            with_playwright(report, out, args.width, args.height)
    except ImportError:
        print("screenshot_report: no Chromium found. Install one (apt install chromium) or "
              "pip install playwright && playwright install chromium.", file=sys.stderr)
        return 2
    print(f"wrote {out} from {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
