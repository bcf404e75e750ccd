"""Screenshots of the formats page and the API index at 1280 px, and an overflow check.

    python docs/screenshots.py [--out DIR] [--site DIR] [--width 1280] [--browser PATH]

Builds the site (`mkdocs build --strict`) into a temporary folder unless `--site` names a
built one, opens each page in headless Chromium at the given width, saves a PNG of the
first screen and one of the whole page, and checks that nothing on the page is wider than
the window:

- the document itself (`document.documentElement.scrollWidth <= width`);
- every table and code block: the theme wraps wide ones in a box that scrolls sideways,
  so the page stays narrow while the table is cut off; each must fit its box
  (`scrollWidth <= clientWidth`);
- every name in a format table (`code` in a cell) stays on one line: no name is broken
  mid-word.

Exit status 1 lists what overflowed. Needs `pip install playwright` and a Chromium:
playwright's own (`playwright install chromium`) or the system's (`apt-get install
chromium`; found on the PATH, or given with `--browser`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"formats": "formats/index.html", "api": "api/index.html"}

# Run in the page: what is wider than its room. Material wraps tables in a scrolling box and
# lets code blocks scroll, so the document's width alone would hide a cut-off table.
OVERFLOW = """
(width) => {
  const problems = [];
  const doc = document.documentElement.scrollWidth;
  if (doc > width) problems.push(`document is ${doc} px wide`);
  const label = (el) => (el.innerText || "").trim().split("\\n")[0].slice(0, 60);
  for (const el of document.querySelectorAll("article table, article pre > code")) {
    if (el.scrollWidth > el.clientWidth + 1) {
      problems.push(`${el.tagName.toLowerCase()} ${el.scrollWidth} px in ${el.clientWidth} px: `
                    + JSON.stringify(label(el)));
    }
  }
  for (const el of document.querySelectorAll(".format-table td code")) {
    if (el.getClientRects().length > 1) problems.push(`name broken: ${el.innerText}`);
  }
  return problems;
}
"""


def build(site: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
    )


def browser_path(given: str | None) -> str | None:
    """The Chromium to run: `--browser`, else the system's, else playwright's own (None)."""
    if given:
        return given
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


# Headless, without a sandbox (root in a container), a GPU or any network of its own: no
# QUIC, first-run page, component updates or sync. playwright adds a fresh profile folder.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _local_only(route: Any) -> None:
    """Load the site's own files; refuse anything else (the theme's web fonts), so the
    page is laid out in the same local fonts wherever it runs, network or not."""
    if route.request.url.startswith("file:"):
        route.continue_()
    else:
        route.abort()


def shoot(site: Path, out: Path, width: int, browser: str | None) -> list[str]:
    """Save the PNGs; return the overflow problems, each prefixed with its page."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    problems = []
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=browser, args=CHROMIUM_ARGS)
        page = chromium.new_page(viewport={"width": width, "height": 900})
        page.route("**/*", _local_only)
        for name, path in PAGES.items():
            page.goto((site / path).as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=out / f"{name}-{width}.png")
            page.screenshot(path=out / f"{name}-{width}-full.png", full_page=True)
            tables = page.locator("h3:has(+ .format-table)")
            if tables.count():  # the formats page: a screen from its first table on
                page.evaluate(
                    "(el) => window.scrollTo(0, el.offsetTop - 60)", tables.first.element_handle()
                )
                page.screenshot(path=out / f"{name}-{width}-tables.png")
            problems += [f"{path}: {p}" for p in page.evaluate(OVERFLOW, width)]
        chromium.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--site", type=Path, help="a built site (default: build one)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--browser", help="path of a Chromium executable")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp)
            build(site)
        problems = shoot(site, args.out, args.width, browser_path(args.browser))
    for name in PAGES:
        print(f"wrote {args.out / f'{name}-{args.width}.png'} and its -full.png")
    if problems:
        print(f"overflow at {args.width} px:", *problems, sep="\n  ")
        return 1
    print(f"no horizontal overflow at {args.width} px")
    return 0


if __name__ == "__main__":
    sys.exit(main())
