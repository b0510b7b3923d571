"""A report page rendered by headless Chromium (Debian's chromium-headless-shell, which CI
installs): the counts the page writes on its own body once its scripts and images ran."""

import html
import re
import shutil
import subprocess

BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")
NO_BROWSER = ("no headless Chromium (CI installs chromium-headless-shell from Debian; apt-get "
              "install it to run this)")


def rendered_counts(page) -> dict[str, int | str]:
    """``data-*`` counts of the rendered page: tables, images, images-rendered, errors,
    overflowing; and ``overflow-what``, the first elements that stick out (tag: text)."""
    dom = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    counts: dict[str, int | str] = {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(\d+)"', dom)}
    what = re.search(r'data-overflow-what="([^"]*)"', dom)
    counts["overflow-what"] = html.unescape(what.group(1)) if what else ""
    return counts
