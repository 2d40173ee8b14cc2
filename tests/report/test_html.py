"""report.html is one self-contained file that a browser renders: every table and every plot,
the plots inline, every image loaded, and a screenshot that is not blank.

The browser is Debian's headless Chromium (`apt-get install -y chromium`); without it the
browser test is skipped and says why. The page is loaded from a copy with one script added
at its end, which on `load` paints a banner green when every <img> has decoded with a
non-zero size, red otherwise; the screenshot then shows both the page and that verdict.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from report.write import Written

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PNG = b"\x89PNG\r\n\x1a\n"
BANNER_PX = 24  # height of the verdict banner at the top of the screenshot
CHECK_IMAGES = """
<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const ok = images.filter((i) => i.complete && i.naturalWidth > 0).length;
  const banner = document.createElement("div");
  banner.style.cssText = "position:fixed;top:0;left:0;width:100%%;height:%dpx;z-index:9;" +
    "background:" + (ok === images.length && images.length === %d ? "#00ff00" : "#ff0000");
  document.body.appendChild(banner);
});
</script>
"""


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables: list[str] = []
        self.scripts = 0
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values.get("src") or "")
        elif tag == "table":
            self.tables.append(values.get("id") or "")
        elif tag == "script":
            self.scripts += 1
        elif tag in ("link", "a") and values.get("href"):
            self.links.append(values["href"] or "")


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


@pytest.fixture(params=["handmade", "multi", "real"])
def written(request: pytest.FixtureRequest) -> Written:
    return request.getfixturevalue(f"{request.param}_report")


def test_the_html_is_self_contained_with_every_table_and_plot(written: Written):
    page = _parse(written.html)
    assert page.tables == [t.key for t in written.tables if t.key in page.tables]
    assert set(page.tables) == {t.key for t in written.tables}
    assert len(page.images) == len(written.plots)
    assert all(src.startswith("data:image/png;base64,") for src in page.images), (
        "plots are inline, not linked"
    )
    inline = sorted(base64.b64decode(src.split(",", 1)[1]) for src in page.images)
    assert inline == sorted(plot.path.read_bytes() for plot in written.plots)
    assert page.scripts == 0 and page.links == []  # nothing to fetch, nothing to run


def _browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _screenshot(browser: str, page: Path, out: Path, profile: Path) -> np.ndarray:
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--window-size=1280,5000",
            "--virtual-time-budget=10000",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and out.is_file(), result.stderr[-2000:]
    assert out.read_bytes().startswith(PNG)
    return imread(out)[:, :, :3]


def test_the_html_renders_in_headless_chromium_with_every_image_loaded(
    written: Written, tmp_path: Path
):
    browser = _browser()
    if browser is None:
        pytest.skip(
            "headless Chromium is not installed (apt-get install -y chromium): the browser "
            "check of report.html needs it"
        )
    probe = written.html.with_name("report-probe.html")
    html = written.html.read_text()
    script = CHECK_IMAGES % (BANNER_PX, len(written.plots))
    probe.write_text(re.sub(r"</body>", script + "</body>", html, count=1))
    try:
        pixels = _screenshot(browser, probe, tmp_path / "shot.png", tmp_path / "profile")
    finally:
        probe.unlink()
    banner = pixels[: BANNER_PX - 4, :, :].reshape(-1, 3).mean(axis=0)
    assert banner == pytest.approx([0.0, 1.0, 0.0], abs=0.05), (
        "the banner is not green: some image did not load"
    )
    page = pixels[BANNER_PX:]
    not_white = (page < 0.9).any(axis=2).mean()
    assert not_white > 0.02, f"the screenshot is nearly blank ({not_white:.3%} not white)"
    rgb = (page * 255).astype(np.uint32)
    colours = np.unique(rgb[:, :, 0] << 16 | rgb[:, :, 1] << 8 | rgb[:, :, 2])
    assert len(colours) > 50, "a rendered page with plots has many colours"
    # The plots' first colour (#0072B2) is on screen: a plot was painted, not just text.
    blue = np.abs(page - np.array([0x00, 0x72, 0xB2]) / 255).max(axis=2) < 0.03
    assert blue.sum() > 200
