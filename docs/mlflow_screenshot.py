"""The README's MLflow screenshot: the runs page of a workflow's store, every invocation expanded.

Needs the distribution's Chromium (`apt-get install chromium`) and Playwright, which drives it
(`pip install playwright`; no browser download: the system Chromium is used):

    python docs/mlflow_screenshot.py runs/cpu-study/results/mlflow/mlruns.db docs/images/mlflow-ui.png
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

EXPANDER = "div.ag-cell button:has(svg path[d^='M7.25 7.25V4.5'])"  # the "+" beside a parent run


def main(store: str, out: str, port: int = 5079) -> None:
    server = subprocess.Popen(
        ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{Path(store).resolve()}", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        query = f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=diversed"
        experiment = json.load(urllib.request.urlopen(query))["experiment"]["experiment_id"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(f"{url}/#/experiments/{experiment}/runs")
            page.wait_for_timeout(8000)
            while page.locator(EXPANDER).count():
                page.locator(EXPANDER).first.click()
                page.wait_for_timeout(1000)
            page.screenshot(path=out)
            browser.close()
    finally:
        server.terminate()
        server.wait()
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
