"""The generation guide's picture of the page: serve a model, generate in headless Chromium, hover a token.

    python docs/page_screenshot.py --checkpoint runs/small --out docs/serve_page.png

Needs the dev extra (playwright) and a Chromium on PATH (Debian: apt-get install chromium).
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time

from playwright.sync_api import sync_playwright

from minigpt.cli.serve import ServeOptions, build_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", default="docs/serve_page.png")
    parser.add_argument("--prompt", default="ROMEO:\n")
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hover", type=int, default=18, help="which generated token to inspect (from 0)")
    args = parser.parse_args()
    browser_path = next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if browser_path is None:
        raise SystemExit("error: no Chromium on PATH")

    server, sock = build_server(ServeOptions(checkpoint=args.checkpoint, port=0, access_log=False))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    host, port = sock.getsockname()[:2]
    try:
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(f"http://{host}:{port}/")
            page.wait_for_function("document.getElementById('status').textContent === 'ready'")
            page.fill("#prompt", args.prompt)
            page.fill("#max_tokens", str(args.tokens))
            page.fill("#seed", str(args.seed))
            page.click("#go")
            page.wait_for_function("!document.getElementById('go').disabled", timeout=120_000)
            page.hover(f"#output .tok >> nth={args.hover}")
            page.wait_for_selector("#attention .chip")
            page.screenshot(path=args.out)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    print(args.out)


if __name__ == "__main__":
    main()
