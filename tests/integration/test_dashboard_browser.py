"""The dashboard in a real browser (Debian's headless Chromium, driven by Playwright) against a
real broker and engine: list, filter, open an instance, read its timeline, raise an event
from the page and see the instance complete. A failing run leaves a screenshot."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright

from engine.ui.server import DashboardServer
from engine.ui.source import DashboardSource
from tests.engine_harness import RunningEngine, running_engine, wait_until

pytestmark = pytest.mark.kafka

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 60_000
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


@pytest.fixture
def browser() -> Iterator[BrowserContext]:
    """A fresh profile each time (Playwright passes it as --user-data-dir)."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run bash .ci/setup (apt-get chromium)"
    profile = tempfile.mkdtemp(prefix="turnstile-chromium-")
    with sync_playwright() as p:
        instance = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield instance
        finally:
            instance.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


@pytest.fixture
def dashboard(engine: RunningEngine) -> Iterator[DashboardServer]:
    server = DashboardServer(DashboardSource(engine.settings), port=0, allow_actions=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_dashboard_lists_filters_shows_and_acts(
    engine: RunningEngine, dashboard: DashboardServer, browser: BrowserContext, tmp_path: Path
) -> None:
    client = engine.client
    echoes = [client.start("t.echo", i, tags={"team": "web"}) for i in range(3)]
    waiting = client.start("t.wait_event", {"event": "go"}, instance_id=f"ui-{uuid.uuid4().hex}")
    failed = client.start("t.raises", "bad input")
    for instance_id in [*echoes, failed]:
        client.wait_for_completion(instance_id, timeout=60)
    client.wait_for_start(waiting, timeout=60)

    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        _walk_through(page, dashboard.url, echoes, waiting, failed)
    except BaseException:
        shot = tmp_path / "dashboard-failure.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")
        raise
    finally:
        page.close()
    final = client.wait_for_completion(waiting, timeout=60)
    assert final.output == {"input": {"event": "go"}, "got": {"ok": True}}


def _walk_through(page: Page, url: str, echoes: list[str], waiting: str, failed: str) -> None:
    # the list shows every instance
    page.goto(url)
    rows = page.locator("#instances tbody tr")
    expect(rows).to_have_count(5)
    for instance_id in [*echoes, waiting, failed]:
        expect(page.locator(f'tr[data-instance="{instance_id}"]')).to_be_visible()
    expect(page.locator('#by-status [data-count="COMPLETED"]')).to_have_text("COMPLETED 3")
    expect(page.locator('#by-status [data-count="RUNNING"]')).to_have_text("RUNNING 1")
    expect(page.locator('#by-status [data-count="FAILED"]')).to_have_text("FAILED 1")
    expect(page.locator("#token-box")).to_be_hidden()  # no token set

    # a failed instance shows its failure: type, message, stack
    page.click(f'tr[data-instance="{failed}"] a')
    expect(page.locator("#failure .failure-type")).to_have_text("BadInputError")
    expect(page.locator("#failure")).to_contain_text("cannot handle 'bad input'")
    expect(page.locator("#failure .stack")).to_contain_text("Traceback")
    page.go_back()

    # filter by name, then by status and tag
    page.fill("#filters input[name=name]", "t.wait_event")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(page.locator(f'tr[data-instance="{waiting}"]')).to_be_visible()
    page.fill("#filters input[name=name]", "")
    page.fill("#filters input[name=status]", "completed")
    page.fill("#filters input[name=tag]", "team=web")
    page.click("#filters button[type=submit]")
    expect(rows).to_have_count(3)
    expect(page.locator(f'tr[data-instance="{waiting}"]')).to_have_count(0)

    # two a page: "Next page" shows the third, then there is no next page
    page.goto(f"{url}/#/?status=completed&tag=team%3Dweb&limit=2")
    expect(rows).to_have_count(2)
    first = set(rows.evaluate_all("rows => rows.map((r) => r.dataset.instance)"))
    page.click("#next-page")
    expect(rows).to_have_count(1)
    expect(page.locator("#next-page")).to_have_count(0)
    assert first | {rows.first.get_attribute("data-instance")} == set(echoes)
    page.click("#first-page")
    expect(rows).to_have_count(2)

    # a bad filter is answered with a clear error
    page.fill("#filters input[name=status]", "sleepy")
    page.click("#filters button[type=submit]")
    expect(page.locator("#error")).to_contain_text("unknown status 'sleepy'")

    # open the waiting instance from the list; its timeline is there
    page.goto(f"{url}/#/?name=t.wait_event")
    page.click(f'tr[data-instance="{waiting}"] a')
    expect(page.locator("h1")).to_have_text(waiting)
    expect(page.locator("h1 + p [data-status]")).to_have_attribute("data-status", "RUNNING")
    expect(page.locator('#timeline [data-kind="ExecutionStarted"]')).to_have_count(1)
    expect(page.locator("#input")).to_contain_text('"event": "go"')

    # raise the event it waits for; the page confirms and shows it completed
    page.fill("#raise-event input[name=name]", "go")
    page.fill("#raise-event input[name=data]", '{"ok": true}')
    page.click("#raise-event button[type=submit]")
    expect(page.locator('#outcome [data-outcome="observed"]')).to_be_visible()
    expect(page.locator("h1 + p [data-status]")).to_have_attribute("data-status", "COMPLETED")
    expect(page.locator('#timeline [data-kind="EventRaised"]')).to_have_count(1)
    expect(page.locator('#timeline [data-kind="ExecutionCompleted"]')).to_have_count(1)
    expect(page.locator("#output")).to_contain_text('"ok": true')

    # the replicas page names the processor and shows lag per partition
    page.click("nav a[href='#/replicas']")
    expect(page.locator("#members-processors")).to_contain_text("processor-0")
    expect(page.locator("#lag-processors tbody tr")).to_have_count(6)  # 3 topics x 2

    page.click("nav a[href='#/dead-letters']")
    expect(page.locator("h1")).to_have_text("Dead letters (0)")


def test_the_api_refuses_bad_requests_with_what_to_do(engine: RunningEngine) -> None:
    import httpx

    source = DashboardSource(engine.settings)
    server = DashboardServer(source, port=0, allow_actions=True, token="s3cret").start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            missing = http.get("/api/instances/no-such-instance")
            assert missing.status_code == 404
            assert "no instance 'no-such-instance'" in missing.json()["error"]
            assert http.get("/api/instances?limit=0").status_code == 400
            bad_token = http.get("/api/instances?page_token=junk")
            assert bad_token.status_code == 400
            assert "next_page_token of the previous page" in bad_token.json()["error"]
            url = "/api/instances/anything/actions/raise-event"
            unauthorised = http.post(url, json={"name": "go"})
            assert unauthorised.status_code == 401
            headers = {"X-Turnstile-Token": "s3cret"}
            bad = http.post(url, json={"name": "go", "data": "{nope"}, headers=headers)
            assert bad.status_code == 400
            assert "not JSON" in bad.json()["error"]
            unknown = http.post("/api/instances/x/actions/explode", json={}, headers=headers)
            assert unknown.status_code == 400
            assert "use one of raise-event" in unknown.json()["error"]
            gone = http.post(url, json={"name": "go"}, headers=headers)
            assert gone.status_code == 404
    finally:
        server.stop()
    read_only = DashboardServer(DashboardSource(engine.settings), port=0).start()
    try:
        with httpx.Client(base_url=read_only.url, timeout=60) as http:
            refused = http.post("/api/instances/x/actions/terminate", json={})
            assert refused.status_code == 403
            assert "--allow-actions" in refused.json()["error"]
            assert http.get("/api/config").json()["actions"] is False
    finally:
        read_only.stop()


def test_each_action_is_confirmed_by_the_status_it_changes(engine: RunningEngine) -> None:
    import httpx

    client = engine.client
    parent = client.start(
        "t.parent_with_child", {"event": "go"}, instance_id=f"p-{uuid.uuid4().hex}"
    )
    child = f"{parent}:child"
    client.wait_for_start(child, timeout=60)
    source = DashboardSource(engine.settings, confirm_s=3.0)
    server = DashboardServer(source, port=0, allow_actions=True).start()

    def act(instance_id: str, action: str, status: int = 200, **body: object) -> dict[str, object]:
        url = f"/api/instances/{instance_id}/actions/{action}"
        with httpx.Client(base_url=server.url, timeout=120) as http:
            answer = http.post(url, json=body)
        assert answer.status_code == status, answer.text
        result: dict[str, object] = answer.json()
        return result

    try:
        # resuming an instance that is not suspended is refused, with the reason
        assert "neither suspended" in str(act(parent, "resume", status=409)["error"])
        suspended = act(parent, "suspend", reason="look")
        assert suspended["outcome"] == "observed"
        assert isinstance(suspended["status"], dict)
        assert suspended["status"]["status"] == "SUSPENDED"
        assert act(parent, "resume")["outcome"] == "observed"
        terminated = act(parent, "terminate", reason="enough", recursive=True)
        assert terminated["outcome"] == "observed"
        assert client.wait_for_completion(child, timeout=60).status.value == "TERMINATED"
        # an event for an ended instance is refused by the processor, and the user sees why
        late = act(child, "raise-event", status=409, name="go")
        assert "refused" in str(late["error"]) and "TERMINATED" in str(late["error"])
        # so is resuming one that ended
        assert "TERMINATED" in str(act(child, "resume", status=409)["error"])
        # a cancel: the code cleans up and the instance ends CANCELLED
        tidy = client.start("t.cleans_up", None, instance_id=f"c-{uuid.uuid4().hex}")
        client.wait_for_start(str(tidy), timeout=60)
        assert act(str(tidy), "cancel", reason="from the dashboard")["outcome"] == "observed"
        assert client.wait_for_completion(str(tidy), timeout=60).status.value == "CANCELLED"
        assert act(parent, "purge")["outcome"] == "observed"
        # the dashboard saw the tombstone; this client's own view reads it a moment later
        wait_until(lambda: client.get(parent) is None, timeout=30, what="the purge")
    finally:
        server.stop()


def test_the_instance_page_asks_queries_even_without_actions(
    engine: RunningEngine, browser: BrowserContext, tmp_path: Path
) -> None:
    """A query is a read: a dashboard started without --allow-actions answers it."""
    tally = engine.client.start("t.tally", 3, instance_id=f"ui-q-{uuid.uuid4().hex}")
    engine.client.wait_for_start(tally, timeout=60)
    server = DashboardServer(DashboardSource(engine.settings), port=0).start()
    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        import httpx

        with httpx.Client(base_url=server.url, timeout=60) as http:
            url = f"/api/instances/{tally}/query"
            assert http.post(url, json={"name": "count"}).json() == {"name": "count", "result": 3}
            bad = http.post(url, json={"name": "plus", "args": '{"n": 1}'})
            assert bad.status_code == 400 and "JSON list" in bad.json()["error"]
            assert http.post(url, json={"name": "plus", "args": "[1"}).status_code == 400
            gone = http.post("/api/instances/no-such-instance/query", json={"name": "count"})
            assert gone.status_code == 404
        page.goto(f"{server.url}/#/instance/{tally}")
        expect(page.locator("h1")).to_have_text(tally)
        page.fill("#query input[name=name]", "plus")
        page.fill("#query input[name=args]", "[4]")
        page.click("#query button[type=submit]")
        expect(page.locator('#query-answer [data-query="answered"]')).to_have_text("7")
        page.fill("#query input[name=name]", "total")
        page.fill("#query input[name=args]", "")
        page.click("#query button[type=submit]")
        refused = page.locator('#query-answer [data-query="refused"]')
        expect(refused).to_contain_text("its queries: 'count', 'peek', 'plus'")
        page.fill("#query input[name=name]", "peek")
        page.click("#query button[type=submit]")
        expect(refused).to_contain_text("read-only")
    except BaseException:
        shot = tmp_path / "dashboard-query-failure.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")
        raise
    finally:
        page.close()
        server.stop()


def test_the_instance_page_sends_updates_as_an_action(
    engine: RunningEngine, dashboard: DashboardServer, browser: BrowserContext, tmp_path: Path
) -> None:
    """An update changes the instance, so it is an action: refused by a dashboard without
    --allow-actions; with them, the page shows the handler's result, or the validator's
    rejection and the names the workflow knows."""
    ledger = engine.client.start("t.ledger", 10, instance_id=f"ui-u-{uuid.uuid4().hex}")
    engine.client.wait_for_start(ledger, timeout=60)
    closed = DashboardServer(DashboardSource(engine.settings), port=0).start()
    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        import httpx

        url = f"/api/instances/{ledger}/update"
        with httpx.Client(base_url=closed.url, timeout=60) as http:
            off = http.post(url, json={"name": "deposit", "arg": "1"})
            assert off.status_code == 403 and "--allow-actions" in off.json()["error"]
        with httpx.Client(base_url=dashboard.url, timeout=60) as http:
            done = http.post(url, json={"name": "deposit", "arg": "5"})
            assert done.json() == {"name": "deposit", "result": 15}
            assert http.post(url, json={"name": "", "arg": "5"}).status_code == 400
        page.goto(f"{dashboard.url}/#/instance/{ledger}")
        expect(page.locator("h1")).to_have_text(ledger)
        page.fill("#update input[name=name]", "deposit")
        page.fill("#update input[name=arg]", "4")
        page.click("#update button[type=submit]")
        expect(page.locator('#update-answer [data-update="answered"]')).to_have_text("19")
        page.fill("#update input[name=arg]", "-3")
        page.click("#update button[type=submit]")
        refused = page.locator('#update-answer [data-update="refused"]')
        expect(refused).to_contain_text("a deposit is positive, not -3")
        page.fill("#update input[name=name]", "withdraw")
        page.click("#update button[type=submit]")
        expect(refused).to_contain_text("its updates: 'deposit'")
    except BaseException:
        shot = tmp_path / "dashboard-update-failure.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"dashboard screenshot: {shot}")
        raise
    finally:
        page.close()
        closed.stop()
    accepted = [e.body for e in engine.history(ledger) if e.body.KIND == "UpdateAccepted"]
    assert len(accepted) == 2  # the rejected and unknown updates wrote nothing
