"""Write docs/report.png: the top of the scan report of a generated recording, in headless Chromium.

    .venv/bin/python scripts/report_screenshot.py [--out docs/report.png] [--keep DIR]

Generates a synthetic fleet with injected anomalies (engine.recording.synth), scans it with the reference analyses
(engine.recording.scan_py: the findings the Spark scan reproduces exactly, without starting Spark), writes the report and
takes a screenshot of its first screens with Debian's chromium and chromedriver (selenium; the same setup as
tests/test_report_browser.py; ENGINE_CHROMIUM / ENGINE_CHROMEDRIVER name other binaries)."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    p.add_argument("--keep", type=Path, help="write the recording and the report here (default: a temp dir)")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1500, help="pixels of the page shown (from its top)")
    p.add_argument("--clients", type=int, default=160)
    p.add_argument("--days", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args(argv)

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    from engine.recording import scan_py
    from engine.bindings.report import write_report
    from engine.recording.synth import FleetConfig, generate

    chrome = shutil.which(os.environ.get("ENGINE_CHROMIUM") or "chromium")
    driver = shutil.which(os.environ.get("ENGINE_CHROMEDRIVER") or "chromedriver")
    if not chrome or not driver:
        print("report_screenshot: needs chromium and chromedriver (apt-get install chromium chromium-driver)",
              file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="rmqhb-report-"))
    generate(work / "recording", FleetConfig(clients=args.clients, groups=12, days=args.days, seed=args.seed))
    findings = scan_py.scan(work / "recording")
    index = write_report(findings, work / "report", plots=True)
    o = Options()
    o.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={args.width},{args.height}", "--lang=en-US"):
        o.add_argument(arg)
    browser = webdriver.Chrome(service=Service(driver), options=o)
    try:
        browser.get(index.as_uri())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(args.out))
    finally:
        browser.quit()
    try:  # smaller file: a palette PNG (the page is flat colours and text)
        from PIL import Image

        Image.open(args.out).convert("RGB").quantize(colors=128).save(args.out, optimize=True)
    except ImportError:
        pass
    print(f"{args.out} ({args.out.stat().st_size / 1024:.0f} KB) of {index}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
