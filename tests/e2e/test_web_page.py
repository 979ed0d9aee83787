"""The status page in a real headless Chromium, and `argus logs --follow` on a real Ray job.

A real git repository (bare + clone), the session's real Ray head, the daemon as users run it
(``argus run --web-listen``: real ticks, a real status branch, the pages on their own address),
Debian's chromium and chromedriver driven by Selenium. The model is suspended (a real reconcile writes its status
document, served name and endpoint included, without a minute of vLLM start-up); the OpenAI
call itself is tested in test_daemon.py. Screenshots are taken into a temporary folder, or into
``$ARGUS_SCREENSHOTS`` when it is set: ``ARGUS_SCREENSHOTS=docs/screenshots`` refreshes the published ones
(docs/users/status.md shows them; on the session's shared head the overview would list other tests' jobs,
so they are refreshed from a run of this module alone).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply.jobs import stop_job
from reconciler.dashboard import Dashboard
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead, free_port
from reconciler.web.reader import StatusReader
from tests.support import ArgusRun, ConfigRepo, model_yaml, site_repo, wait_for

pytestmark = pytest.mark.e2e

USER = "dora"
SECRET = "wandb-Zq8v7Hs2Lk4Pp9"
XSS = "<script>alert('owned')</script>"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def command_task(command: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "Task", "workload": "command", "command": command, "gpus_per_node": 1, **extra}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``$ARGUS_SCREENSHOTS`` (docs/screenshots to refresh them), else a temporary folder."""
    folder = Path(os.environ["ARGUS_SCREENSHOTS"]) if os.environ.get("ARGUS_SCREENSHOTS") else None
    folder = folder or tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Site:
    repo: ConfigRepo
    dash: Dashboard
    url: str
    reader: StatusReader

    def doc(self, path: str) -> dict[str, Any]:
        return dict(self.reader.snapshot().docs.get(path) or {})


@pytest.fixture(scope="module")
def site(
    ray_head: RayHead, tiny_llama: Path, hf_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("web")
    repo = site_repo(root, hf_cache, ray_head.serve_port, USER)
    repo.write(f"users/{USER}/models/chat.yaml", model_yaml("argus-test/tiny-llama", suspend=True))
    # A failing run whose log tail holds user-written markup.
    repo.write(
        f"users/{USER}/tasks/crash.yaml",
        command_task(f"echo 'loading data'; echo {shlex.quote('bad row: ' + XSS)}; echo 'giving up' >&2; exit 3"),
    )
    repo.write(f"users/{USER}/tasks/hello.yaml", command_task("echo hello from dora"))
    # Invalid on purpose: the validation error quotes the user's value.
    broken = {"kind": "Model", "source": "argus-test/tiny-llama", "replicas": XSS}
    repo.write(f"users/{USER}/models/broken.yaml", broken)
    repo.commit_push("dora's objects")
    dash = Dashboard(ray_head.dashboard_url)
    listen, web = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    # `argus run` as users deploy it: the webhook on one address, the pages and API on another.
    args = ["--repo", str(repo.bare), "--ray", ray_head.dashboard_url, "--listen", listen, "--web-listen", web]
    args += ["--observe-interval", "1", "--endpoint", ray_head.serve_url + "/v1", "--cache-dir", str(root / "cache")]
    daemon = ArgusRun(args, root / "daemon.log", {**os.environ, "WANDB_API_KEY": SECRET}).start()
    url = f"http://{web}"
    try:
        daemon.wait_serving(url + "/healthz")
        yield Site(repo, dash, url, StatusReader(str(repo.bare)))
    finally:
        daemon.stop()
        for job in dash.get("/api/jobs/") or []:
            sid = str(job.get("submission_id", ""))
            if sid.startswith(f"argus--{USER}--") and job.get("status") in ("PENDING", "RUNNING"):
                stop_job(dash, sid)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require("selenium")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        require("chromium (Debian packages chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1440,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def no_injected_script(driver: Any) -> None:
    """The page's only script is its own, and no alert opened."""
    from selenium.common.exceptions import NoAlertPresentException

    sources = driver.execute_script("return Array.from(document.scripts).map(s => s.src || s.textContent)")
    assert all(s.endswith("/static/app.js") for s in sources), sources
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - raises when no alert is open


def test_overview_lists_the_objects_of_a_real_reconcile(site: Site, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    wait_for(
        lambda: (
            site.doc(f"users/{USER}/tasks/crash.yaml").get("state") == "FAILED"
            and site.doc(f"users/{USER}/tasks/hello.yaml").get("state") == "SUCCEEDED"
            and any(r.get("log_tail") for r in site.doc(f"users/{USER}/tasks/crash.yaml").get("runs", []))
        ),
        "crash FAILED with its log tail and hello SUCCEEDED on the status branch",
        timeout=180,
    )
    browser.get(site.url + "/")
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "table.objects a.obj")]
    paths = [link.removeprefix(site.url) for link in links]
    assert paths[0] == f"/users/{USER}/tasks/crash"  # what needs attention first
    assert {f"/users/{USER}/tasks/hello", f"/users/{USER}/models/chat", f"/users/{USER}/tasks/crash"} <= set(paths)
    assert "FAILED" in browser.find_element(By.CSS_SELECTOR, "table.objects tbody tr").text
    errors = browser.find_element(By.CSS_SELECTOR, "section.errors").text
    assert f"users/{USER}/models/broken.yaml" in errors and XSS in errors  # shown as text
    no_injected_script(browser)
    browser.get(site.url + f"/?user={USER}&state=FAILED")
    rows = browser.find_elements(By.CSS_SELECTOR, "table.objects tbody tr")
    assert len(rows) == 1 and "crash" in rows[0].text
    browser.get(site.url + "/")
    assert browser.save_screenshot(str(shots / "overview.png"))


def test_failed_task_page_shows_its_log_tail_as_text(site: Site, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site.url + f"/users/{USER}/tasks/crash")
    tail = browser.find_element(By.CSS_SELECTOR, "pre.log-tail").text
    assert "loading data" in tail and f"bad row: {XSS}" in tail
    assert "exit code 3" in browser.find_element(By.CSS_SELECTOR, "table.runs").text
    # with JavaScript the whole output loads from the log API
    wait_for(lambda: "giving up" in browser.find_element(By.ID, "live-log").text, "the live log", timeout=30)
    # what argus submitted, read from Ray: the command as written, user markup included, as text
    spec = lambda: browser.find_element(By.ID, "deployed-spec").text  # noqa: E731
    wait_for(lambda: "bad row: <script>alert(" in spec(), "the deployed spec", timeout=30)
    assert '"argus-user": "dora"' in spec()
    no_injected_script(browser)


def test_model_page_shows_the_openai_example(site: Site, browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    doc = site.doc(f"users/{USER}/models/chat.yaml")
    served = doc["served_name"]
    assert served.startswith(f"{USER}-") and served.endswith("-chat")
    browser.get(site.url + f"/users/{USER}/models/chat")
    python = browser.find_element(By.ID, "openai-python").text
    curl = browser.find_element(By.ID, "openai-curl").text
    assert f'model="{served}"' in python and f'base_url="{doc["endpoint"]}"' in python
    assert f"{doc['endpoint']}/chat/completions" in curl and served in curl
    assert browser.save_screenshot(str(shots / "model.png"))


def test_argus_logs_follows_a_running_job_redacted(site: Site) -> None:
    path = f"users/{USER}/tasks/talker.yaml"
    script = 'for i in $(seq 1 10); do echo "step $i of 10 key $WANDB_API_KEY"; sleep 1; done'
    site.repo.write(path, command_task(script))
    site.repo.commit_push("talker")
    sid = wait_for(lambda: site.doc(path).get("submission_id"), "talker submitted", timeout=60)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler.cli", "logs", f"{USER}/tasks/talker", "--follow", "--server", site.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    arrivals: list[tuple[float, str]] = []
    for line in proc.stdout:
        arrivals.append((time.monotonic() - started, line.rstrip("\n")))
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    lines = [text for _, text in arrivals]
    steps = [t for t, text in arrivals if text.startswith("step ")]
    assert len(steps) == 10, lines
    # Printed while the job ran: the last step arrived seconds after the first. (How many steps
    # come in the first batch depends on how soon the follower starts on a busy machine: the
    # job prints one a second, so a follower that joins at step 8 still sees two more arrive.)
    assert steps[-1] - steps[0] >= 1.5, arrivals
    assert all(SECRET not in text for text in lines) and "step 1 of 10 key ***" in lines
    assert lines[-1] == f"[argus: run {sid} SUCCEEDED]"
    # the same through the API, and a run of someone else's task is refused
    with urllib.request.urlopen(f"{site.url}/api/v1/logs/{USER}/tasks/talker?run={sid}") as resp:
        assert "step 10 of 10 key ***" in resp.read().decode()
    crash_sid = site.doc(f"users/{USER}/tasks/crash.yaml")["submission_id"]
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "logs",
            f"{USER}/tasks/talker",
            "--run",
            crash_sid,
            "--server",
            site.url,
        ],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "is not a run of" in refused.stderr
    # a suspended model has no Serve application: said plainly, exit 1
    model = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "logs", f"{USER}/models/chat", "--server", site.url],
        capture_output=True,
        text=True,
    )
    assert model.returncode == 1 and "Serve runs no application" in model.stderr
