"""A page opened in a real browser for the tests: Debian's chromium, headless, driven
through the DevTools protocol (websocket-client). What a page did while loading is
recorded: console messages and uncaught errors, every request it made, and what a
script evaluated in it returns; a screenshot at a given width.

    with Browser() as b:
        page = b.open("/path/report.html", width=1280)
        page.errors, page.requests, page.eval("document.title"), page.screenshot(path)

``chromium_missing()`` says why the browser tests cannot run here (None when they can).
"""
import base64
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path():
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


def chromium_missing():
    if chromium_path() is None:
        return "no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it as root)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (pip install -e '.[test]')"
    return None


class Page:
    def __init__(self, browser, ws):
        self.browser, self.ws, self.next_id = browser, ws, 0
        self.errors, self.requests = [], []

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                       for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            self.errors.append("exception: " + params["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            self.errors.append(f"log ({params['entry'].get('source')}): {params['entry'].get('text')} "
                               f"{params['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed":
            self.errors.append(f"failed to load: {params.get('errorText')}")

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path, full_page=True):
        params = {"format": "png", "captureBeyondViewport": full_page}
        data = base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return path


class Browser:
    """A headless chromium with its own profile, stopped on exit."""

    def __init__(self, timeout=60):
        self.timeout = timeout

    def __enter__(self):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        self.proc = subprocess.Popen(
            [chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-default-apps", "--hide-scrollbars", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        end = time.time() + self.timeout
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if time.time() > end or self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        self.port = int(open(port_file).read().split()[0])
        return self

    def open(self, path, width=1280, height=900, mobile=False):
        """A new tab with ``path`` (a file) loaded: its load event fired."""
        import websocket

        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?about:blank", method="PUT")
        target = json.load(urllib.request.urlopen(req, timeout=self.timeout))
        ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=self.timeout, suppress_origin=True)
        page = Page(self, ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=mobile)
        url = pathlib.Path(path).resolve().as_uri()
        page.call("Page.navigate", url=url)
        end = time.time() + self.timeout  # (loaded: this URL's document, complete)
        while not page.eval(f"location.href === {json.dumps(url)} && document.readyState === 'complete'"):
            if time.time() > end:
                raise TimeoutError(f"{path} did not load within {self.timeout} s")
            time.sleep(0.05)
        # images: decoded (not only fetched) before the page is looked at
        page.eval("Promise.all([...document.images].map(i => i.decode().catch(() => null)))")
        return page

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


# ---------------------------------------------------------------- fairseq-localness-report's page
TABLE_JS = """[...document.querySelectorAll('#results tr[data-row]')].map(tr => ({
    row: tr.dataset.row,
    state: tr.querySelector('[data-state]').dataset.state,
    verdict: (tr.querySelector('[data-verdict]') || {dataset: {}}).dataset.verdict || null,
    cells: Object.fromEntries([...tr.querySelectorAll('[data-col]')].map(c => {
        const d = c.cloneNode(true);
        d.querySelectorAll('small').forEach(s => s.remove());
        return [c.dataset.col, d.textContent.trim()];
    }))
}))"""


def _number(cell):
    """The first number of a table cell ('27.90', '27.90 ± 0.12', '<0.001', '54,880')."""
    import re

    m = re.match(r"^[<+]?(-?[\d,]*\.?\d+)", cell)
    return float(m.group(1).replace(",", "")) if m else None


def expected_cells(entry):
    """{column of results.md: the number results.json holds for it} of a row."""
    s, c = entry["summary"], entry.get("comparison") or {}
    mean = s["bleu"]["mean"]
    out = {"our BLEU": mean, "BLEU": mean}
    paper = entry["meta"].get("paper_bleu")
    if mean is not None and paper not in (None, "", "-"):
        out["delta"] = round(mean, 2) - float(paper)
    if c:
        out["Δ vs. baseline"] = out["Δ BLEU"] = c.get("delta_mean")
        p = (c.get("pooled") or {}).get("p_value")
        out["p (vs. baseline)"] = out["p"] = p
        for test, column in (("paired-bs", "p (paired bootstrap)"), ("compare-mt", "p (compare-mt)")):
            if test in (c.get("tests") or {}):
                out[column] = c["tests"][test]
    return out


def check_report_page(browser, work, screenshot):
    """The page WORK/report.html in the browser: no console error, no request outside
    file://, every image loaded, every number of the table equal to results.json's, a
    screenshot that is not blank, no sideways scrolling at a phone's width. Returns
    {row: (state, verdict)}."""
    from PIL import Image, ImageStat

    path = os.path.join(work, "report.html")
    page = browser.open(path, width=1280)
    assert page.errors == [], page.errors
    assert page.requests and all(u.startswith("file://") for u in page.requests), page.requests
    images = page.eval("[...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
    assert all(done and width > 0 for _, done, width in images), images
    rows = page.eval(TABLE_JS)
    with open(os.path.join(work, "results.json"), encoding="utf-8") as f:
        result = json.load(f)
    assert [r["row"] for r in rows] == [e["system"] for e in result["systems"]]
    for r, entry in zip(rows, result["systems"]):
        for column, want in expected_cells(entry).items():
            if column not in r["cells"]:
                continue
            got = _number(r["cells"][column])
            if want is None:
                assert got is None, (r["row"], column, r["cells"][column])
            elif r["cells"][column].startswith("<"):
                assert want < got, (r["row"], column, r["cells"][column], want)
            else:
                digits = len(r["cells"][column].split(" ")[0].split(".")[-1]) if "." in r["cells"][column] else 0
                assert got == round(want, digits), (r["row"], column, r["cells"][column], want)
    page.screenshot(screenshot)
    img = Image.open(screenshot).convert("L")
    assert img.size[0] >= 1000 and ImageStat.Stat(img).stddev[0] > 10, "blank screenshot"
    phone = browser.open(path, width=390, height=844, mobile=True)
    assert phone.errors == [], phone.errors
    assert phone.eval("document.documentElement.scrollWidth <= window.innerWidth + 1")
    return {r["row"]: (r["state"], r["verdict"]) for r in rows}
