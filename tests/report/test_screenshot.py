"""benchmarks/screenshot_report.py draws report.html in headless Chromium (issue 36, point 1).

Skipped only where no Chromium is installed (``apt-get install -y chromium``); the script then says so in
one line, which is tested too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import screenshot_report
from fedskew.report import write_report
from tests.helpers.report_runs import write_run


def test_without_chromium_the_script_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "p.html"
    page.write_text("<p>x</p>")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CHROMIUM", raising=False)
    assert screenshot_report.main([str(page), str(tmp_path / "p.png")]) == 2
    assert "no Chromium found: apt-get install -y chromium" in capsys.readouterr().err


@pytest.mark.skipif(screenshot_report.find_browser() is None, reason="no Chromium: apt-get install -y chromium")
def test_the_report_page_is_drawn_and_trimmed(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", "fedavg", 0, [0.1, 0.3, 0.5])
    page = write_report([tmp_path / "runs"])
    out = screenshot_report.screenshot(page, tmp_path / "shot.png", width=1000, height=4000)
    with Image.open(out) as im:
        width, height = im.size
        pixels = np.asarray(im.convert("L"))
    assert width == 1000 and 1000 < height < 4000  # the page's figures drawn, the blank tail cut off
    assert (pixels < 128).mean() > 0.005  # text and curves, not a blank page
