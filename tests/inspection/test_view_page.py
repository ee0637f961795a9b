"""`shardpoint view`: the page in a real headless browser (Debian's chromium + chromedriver,
driven by selenium): it loads, shows the tree, a search finds a key, the NaN tensor is flagged,
the change per layer is drawn; a screenshot is kept as an artefact."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import shardpoint as sp
from shardpoint.cli import main

webdriver = pytest.importorskip("selenium.webdriver")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: where screenshots are kept (bench-out/ is git-ignored scratch; override with the env var)
ARTEFACTS = os.environ.get("SHARDPOINT_ARTEFACTS", "bench-out")


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        if os.environ.get("SHARDPOINT_REQUIRE_OPTIONAL") == "1":
            pytest.fail("chromium / chromedriver missing (make test installs them)")
        pytest.skip("chromium / chromedriver not installed")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield d
    d.quit()


def _checkpoints(tmp_path, n_layers: int) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    a, b = {}, {}
    for i in range(n_layers):
        w = rng.standard_normal((8, 8)).astype(np.float32)
        a[f"model/layers.{i}/attn/w"] = w
        b[f"model/layers.{i}/attn/w"] = w + (0.5 if i == 3 else 0.0)
        a[f"model/layers.{i}/norm/b"] = b[f"model/layers.{i}/norm/b"] = np.zeros(8, np.float16)
    a["model/layers.7/attn/w"][2, 2] = np.nan
    b["model/layers.7/attn/w"] = a["model/layers.7/attn/w"]
    pa, pb = str(tmp_path / "step0"), str(tmp_path / "step1")
    sp.save_file(a, pa)
    sp.save_file(b, pb)
    return pa, pb


def _wait_ready(d) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(d, 20).until(lambda d: d.execute_script("return document.body.dataset.ready"))


def test_page_in_headless_chromium(tmp_path, browser, capsys) -> None:
    from selenium.webdriver.common.by import By

    pa, pb = _checkpoints(tmp_path, 2000)  # 4000 keys: the list must be virtualised
    html = str(tmp_path / "page.html")
    assert main(["view", pa, pb, "-o", html, "--stats"]) == 0
    browser.get("file://" + html)
    _wait_ready(browser)
    rows = browser.find_elements(By.CSS_SELECTOR, "#list .row")
    assert 0 < len(rows) < 100  # only the rows in view are in the DOM
    assert rows[0].get_attribute("data-key") == "model/layers.0/attn/w"
    assert "4,000 of 4,000" in browser.find_element(By.ID, "count").text
    # search
    box = browser.find_element(By.ID, "search")
    box.send_keys("layers.1234/norm")
    rows = browser.find_elements(By.CSS_SELECTOR, "#list .row")
    assert [r.get_attribute("data-key") for r in rows] == ["model/layers.1234/norm/b"]
    box.clear()
    box.send_keys("layers.7/attn")
    (row,) = browser.find_elements(By.CSS_SELECTOR, "#list .row")
    # the NaN tensor is flagged in its row and in the health box
    assert "bad" in row.get_attribute("class") and "NaN 1" in row.text
    assert "model/layers.7/attn/w" in browser.find_element(By.ID, "health").text
    # change per layer: the moved layer first
    bars = browser.find_element(By.ID, "bars").text.splitlines()
    assert bars[0].startswith("model/layers.3/attn")
    assert browser.find_element(By.ID, "dtypes").text.count("float") == 2
    os.makedirs(ARTEFACTS, exist_ok=True)
    shot = os.path.abspath(os.path.join(ARTEFACTS, "view-test.png"))
    box.clear()
    box.send_keys("layers.7")
    assert browser.save_screenshot(shot) and os.path.getsize(shot) > 10_000
    print(f"screenshot: {shot}")


def test_page_escapes_keys(tmp_path, browser) -> None:
    p = str(tmp_path / "ck")
    sp.save_file({"</script><b>x": np.ones(2, np.float32)}, p)
    html = str(tmp_path / "p.html")
    assert main(["view", p, "-o", html]) == 0
    browser.get("file://" + html)
    _wait_ready(browser)
    (row,) = browser.find_elements("css selector", "#list .row")
    assert row.get_attribute("data-key") == "</script><b>x"
