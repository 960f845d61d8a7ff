"""Screenshot a report page in a real headless browser (Chromium), to look at it as a reader's browser shows it.

    .venv/bin/fedskew run --out runs/shot rounds=10
    .venv/bin/python benchmarks/screenshot_report.py runs/shot/report/report.html docs/img/report_page.png

Needs Chromium (Debian: ``apt-get install -y chromium``; the binary is found as ``chromium``,
``chromium-browser``, ``google-chrome`` or ``$CHROMIUM``). The page is drawn ``--width`` pixels wide in a
window ``--height`` pixels tall, and the screenshot is cut below the page's last non-white row, so a short
page leaves no blank tail. ``--scale 2`` draws at twice the pixel density (sharper text, a larger file).
Exit code 2, with one line, when Chromium is missing or fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The Chromium binary: ``$CHROMIUM``, else the first of :data:`BROWSERS` on ``PATH``."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def screenshot(page: Path, out: Path, width: int = 1280, height: int = 6000, scale: float = 1.0,
               timeout: float = 120.0) -> Path:
    """Draw ``page`` (an HTML file) in headless Chromium and save the PNG at ``out``, trimmed of the blank
    space below the page's content."""
    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found: apt-get install -y chromium (or set $CHROMIUM)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
            "--disable-extensions", f"--user-data-dir={profile}", f"--window-size={width},{height}",
            f"--force-device-scale-factor={scale}", f"--screenshot={out.resolve()}", page.resolve().as_uri(),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{browser} failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    with Image.open(out) as im:
        rgb = np.asarray(im.convert("RGB"))
    content = np.nonzero((rgb < 250).any(axis=(1, 2)))[0]
    if content.size:
        bottom = min(rgb.shape[0], int(content[-1]) + int(24 * scale))
        Image.fromarray(rgb[:bottom]).save(out, optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("page", type=Path, help="the report.html to draw")
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("--width", type=int, default=1280, help="window width in CSS pixels (default 1280)")
    p.add_argument("--height", type=int, default=6000,
                   help="window height in CSS pixels: the longest page drawn (default 6000)")
    p.add_argument("--scale", type=float, default=1.0, help="device pixel ratio (default 1)")
    args = p.parse_args(argv)
    if not args.page.is_file():
        print(f"screenshot_report: error: no such file: {args.page}", file=sys.stderr)
        return 2
    try:
        out = screenshot(args.page, args.out, args.width, args.height, args.scale)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        print(f"screenshot_report: error: {e}", file=sys.stderr)
        return 2
    with Image.open(out) as im:
        print(f"{out}: {im.size[0]}x{im.size[1]} pixels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
