"""Workers' log lines through the real path: TaskLog messages on a node's gRPC stream, batched into
the table, read back over REST (a page, JSON or text) and followed as SSE until the job ends, on
SQLite with the in-process bus and on PostgreSQL with Redis."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from orchestration.db.base import utcnow
from orchestration.logs import store
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import settings_for
from tests.resource_layer.test_stream import Stream
from tests.service_layer.browser import CHROMIUM, Browser
from tests.service_layer.harness import ADMIN_KEY, Registered, new_tenant, seed_fleet, small_spec, wait_placed

MAX_LINES = 50


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerHandle]:
    settings = settings_for(
        db_url,
        data_dir=tmp_path,
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        heartbeat_interval_s=10.0,
        heartbeat_misses=6,
        log_max_lines_per_task=MAX_LINES,
        log_flush_s=0.05,
    )
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


class Node:
    """A node's Connect stream as an agent holds it: Hello first, then what the test sends."""

    def __init__(self, server: ServerHandle, reg: Registered) -> None:
        self.channel = grpc.insecure_channel(server.grpc_target)
        self.stream = Stream(agent_pb2_grpc.AgentServiceStub(self.channel))
        self.stream.send(hello=agent_pb2.Hello(node_id=reg.node_id, node_token=reg.node_token))
        assert self.stream.recv().WhichOneof("kind") == "ack"

    def log(self, task_id: str, *lines: str, stream: str = "stdout") -> None:
        for line in lines:
            self.stream.send(log=agent_pb2.TaskLog(assignment_id=task_id, stream=stream, line=line))

    def status(self, task_id: str, state: int) -> None:
        self.stream.send(
            task_status=agent_pb2.TaskStatus(assignment_id=task_id, state=state, result_json="{}")
        )

    def close(self) -> None:
        self.stream.close()
        self.channel.close()


def wait_until(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def placed(
    server: ServerHandle, admin: CpnClient
) -> Iterator[tuple[CpnClient, dict[str, Any], dict[str, Node]]]:
    """Alice's job placed on the seeded fleet, and a live stream for each node it runs on."""
    nodes = seed_fleet(server, admin)
    _, alice = new_tenant(admin, server, "alice")
    job = wait_placed(alice, alice.submit(spec=small_spec("logged"), choice="cheapest")["id"])
    by_node = {r.node_id: r for r in nodes.values()}
    streams = {t["node_id"]: Node(server, by_node[t["node_id"]]) for t in job["tasks"]}
    try:
        yield alice, job, streams
    finally:
        for s in streams.values():
            s.close()
        alice.close()


def _texts(page: dict[str, Any]) -> list[str]:
    return [line["line"] for line in page["lines"]]


def test_lines_are_stored_per_task_and_read_back(server: ServerHandle, admin: CpnClient, placed: Any) -> None:
    alice, job, streams = placed
    task = job["tasks"][0]
    node = streams[task["node_id"]]
    node.log(task["id"], "hello from rank 0", "step 1 done")
    node.log(task["id"], "a warning", stream="stderr")
    page = wait_until(
        lambda: (p := alice.logs(job["id"])) and len(p["lines"]) == 3 and p, "three lines stored"
    )
    assert _texts(page) == ["hello from rank 0", "step 1 done", "a warning"]
    first = page["lines"][0]
    assert (first["task_id"], first["region"], first["stream"], first["dropped"]) == (
        task["id"],
        task["region"],
        "stdout",
        0,
    )
    assert page["lines"][2]["stream"] == "stderr" and page["status"] == "placed"
    seqs = [line["seq"] for line in page["lines"]]
    assert seqs == sorted(seqs) and page["next_after"] == seqs[-1] and page["more"] is False

    assert _texts(alice.logs(job["id"], tail=1)) == ["a warning"]
    assert _texts(alice.logs(job["id"], after=seqs[0])) == ["step 1 done", "a warning"]
    more = alice.logs(job["id"], limit=2)
    assert more["more"] is True and _texts(alice.logs(job["id"], after=more["next_after"])) == ["a warning"]
    assert _texts(alice.logs(job["id"], task=task["id"][:8])) == _texts(page)  # a prefix, as jobs show prints
    assert admin.logs(job["id"])["lines"] == page["lines"]  # an admin reads every tenant's

    text = httpx.get(
        f"{server.http_url}/v1/jobs/{job['id']}/logs",
        params={"format": "text"},
        headers=alice._headers,  # noqa: SLF001
    )
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    assert text.text.splitlines()[0] == f"[{task['id'][:8]}/{task['region']} stdout] hello from rank 0"
    assert text.headers["x-cpn-next-after"] == str(seqs[-1])


def test_a_node_cannot_write_into_another_nodes_task(server: ServerHandle, admin: CpnClient) -> None:
    nodes = seed_fleet(server, admin)
    job = wait_placed(admin, admin.submit(spec=small_spec("one"), choice="cheapest")["id"])
    task = job["tasks"][0]
    other = next(r for r in nodes.values() if r.node_id != task["node_id"])
    own = next(r for r in nodes.values() if r.node_id == task["node_id"])
    intruder, owner = Node(server, other), Node(server, own)
    try:
        intruder.log(task["id"], "not mine")
        owner.log(task["id"], "mine")
        page = wait_until(lambda: (p := admin.logs(job["id"]))["lines"] and p, "the owner's line")
        time.sleep(0.3)  # several flushes: the intruder's line would be there by now
        assert _texts(admin.logs(job["id"])) == ["mine"], page
    finally:
        intruder.close()
        owner.close()


def test_a_chatty_task_is_rotated_to_its_bound_with_a_marker(placed: Any) -> None:
    alice, job, streams = placed
    task = job["tasks"][0]
    node = streams[task["node_id"]]
    node.log(task["id"], *[f"line {i}" for i in range(300)])
    last = wait_until(
        lambda: (p := alice.logs(job["id"], tail=1))["lines"] and p["lines"][0]["line"] == "line 299" and p,
        "the last line",
    )
    assert last
    page = alice.logs(job["id"], task=task["id"])
    lines = page["lines"]
    assert len(lines) <= MAX_LINES
    marker, kept = lines[0], lines[1:]
    assert marker["stream"] == "cpn" and marker["dropped"] == 300 - len(kept)
    assert marker["line"] == f"[cpn] {marker['dropped']} older lines rotated out"
    assert _texts({"lines": kept}) == [f"line {i}" for i in range(300 - len(kept), 300)]


def test_follow_streams_lines_live_and_ends_with_the_job(placed: Any) -> None:
    alice, job, streams = placed
    tasks = job["tasks"]
    first = streams[tasks[0]["node_id"]]
    first.log(tasks[0]["id"], "before following")
    wait_until(lambda: alice.logs(job["id"])["lines"], "the first line stored")

    events: list[dict[str, Any]] = []
    got = threading.Event()

    def follow() -> None:
        for event in alice.follow_logs(job["id"]):
            events.append(event)
            got.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait_until(lambda: events, "the history")
    assert events[0]["data"]["line"] == "before following" and events[0]["id"] == str(
        events[0]["data"]["seq"]
    )
    for t in tasks:
        streams[t["node_id"]].status(t["id"], agent_pb2.TASK_STATE_RUNNING)
    for i in range(3):  # each line arrives while the job runs, before the next is sent
        first.log(tasks[0]["id"], f"live {i}")
        wait_until(lambda i=i: any(e["data"].get("line") == f"live {i}" for e in events), f"live {i}", 10)
    assert reader.is_alive()

    last = streams[tasks[-1]["node_id"]]
    last.log(tasks[-1]["id"], "the last words")  # sent just before the task's end: still delivered
    for t in tasks:
        streams[t["node_id"]].status(t["id"], agent_pb2.TASK_STATE_SUCCEEDED)
    reader.join(20)
    assert not reader.is_alive(), "the stream did not end with the job"
    lines = [e["data"]["line"] for e in events if e["event"] == "message"]
    assert lines == ["before following", "live 0", "live 1", "live 2", "the last words"]
    assert events[-1] == {"event": "end", "id": None, "data": {"status": "succeeded"}}

    # resumed from the last id (Last-Event-ID or after): only the end
    resume = httpx.get(
        f"{alice.base_url}/v1/jobs/{job['id']}/logs",
        params={"follow": "1"},
        headers={**alice._headers, "Last-Event-ID": events[-2]["id"]},  # noqa: SLF001
        timeout=10,
    )
    assert resume.text.strip() == 'event: end\ndata: {"status":"succeeded"}'
    assert [e["data"]["line"] for e in alice.follow_logs(job["id"], tail=1) if e["event"] == "message"] == [
        "the last words"
    ]


BAD = [
    {"tail": 0},
    {"tail": 10_001},
    {"after": -1},
    {"after": 1 << 63},
    {"limit": 0},
    {"limit": 10_001},
    {"task": "abc"},
    {"task": "not-hex!"},
    {"task": "a" * 33},
    {"format": "xml"},
    {"follow": "maybe"},
    {"follow": "1", "format": "text"},
]


def test_bad_parameters_are_422_naming_the_field_and_strangers_get_404(
    server: ServerHandle, admin: CpnClient, placed: Any
) -> None:
    alice, job, _ = placed
    url = f"{server.http_url}/v1/jobs/{job['id']}/logs"
    for params in BAD:
        r = httpx.get(url, params=params, headers=alice._headers)  # noqa: SLF001
        assert r.status_code == 422, (params, r.text)
        body = r.json()
        field = "format" if "format" in params else next(iter(params))
        assert field in r.text, (params, body)
    with pytest.raises(ApiError) as unknown_task:
        alice.logs(job["id"], task="abcd")
    assert unknown_task.value.status == 404 and "task" in unknown_task.value.message

    _, bob = new_tenant(admin, server, "bob")
    with bob:
        for call in (lambda: bob.logs(job["id"]), lambda: list(bob.follow_logs(job["id"]))):
            with pytest.raises(ApiError) as hidden:
                call()
            assert hidden.value.status == 404
    assert httpx.get(url).status_code == 401
    doc = httpx.get(f"{server.http_url}/openapi.json", timeout=10).json()["paths"]["/v1/jobs/{job_id}/logs"][
        "get"
    ]
    assert {"401", "404", "422", "429"} <= set(doc["responses"])
    assert {p["name"] for p in doc["parameters"]} >= {"task", "tail", "after", "limit", "follow", "format"}


@pytest.mark.browser
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium is not installed")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_job_page_shows_the_newest_lines_live_in_chromium(
    server: ServerHandle, placed: Any, tmp_path: Path
) -> None:
    alice, job, streams = placed
    task = job["tasks"][0]
    node = streams[task["node_id"]]
    node.log(task["id"], "hello <b>not bold</b>", "second line")
    node.log(task["id"], "trouble ahead", stream="stderr")
    wait_until(lambda: len(alice.logs(job["id"])["lines"]) == 3, "three lines stored")

    browser = Browser(tmp_path / "profile")  # development server on loopback: no sign-in
    try:
        page = f"/dashboard/jobs/{job['id']}"
        browser.open(server.http_url + page, page)
        text = "document.getElementById('job-log-lines').innerText"
        shown = browser.evaluate(text)
        prefix = f"[{task['id'][:8]}/{task['region']}"
        assert f"{prefix} stdout] hello <b>not bold</b>" in shown  # escaped: shown as text, not markup
        assert browser.evaluate("document.querySelectorAll('#job-log-lines b').length") == 0
        assert browser.evaluate("document.querySelectorAll('.log-line.log-stderr').length") == 1

        browser.evaluate("window.__sameDocument = true")
        node.log(task["id"], "a line that arrives while the page is open")
        browser.wait_for(f"{text}.includes('a line that arrives while the page is open')", timeout_s=15)
        assert browser.evaluate("window.__sameDocument") is True
        assert browser.evaluate("document.querySelector('#job-logs h2').textContent") == "Logs"
        node.log(task["id"], *[f"bulk {i}" for i in range(120)])
        browser.wait_for(f"{text}.includes('bulk 119')", timeout_s=15)
        stored = alice.logs(job["id"])["lines"]  # rotated to this file's bound (50), under the 100 shown
        assert browser.evaluate("document.querySelectorAll('.log-line').length") == len(stored) <= MAX_LINES
        assert "older lines rotated out" in browser.evaluate(
            "document.querySelector('.log-line.log-cpn').innerText"
        )
        box = "document.getElementById('job-log-lines')"
        assert browser.evaluate(f"{box}.scrollHeight > {box}.clientHeight")  # more than fits
        assert browser.evaluate(f"Math.abs({box}.scrollTop)") < 2  # opened at the bottom: the newest
        shot = browser.screenshot(tmp_path / "job-logs.png")
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_line_committed_after_a_newer_one_was_streamed_is_still_streamed(
    server: ServerHandle, placed: Any
) -> None:
    """Two writers (replicas) of one job: A takes its seqs first but commits after B."""
    alice, job, _ = placed
    job_id, task_id = job["id"], job["tasks"][0]["id"]
    events: list[dict[str, Any]] = []

    def collect() -> None:
        for event in alice.follow_logs(job_id):
            events.append(event)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    time.sleep(0.5)  # the stream is open and subscribed
    factory, bus = server.ctx.session_factory, server.ctx.bus
    slow = factory()
    slow.begin()
    store.append(slow, [store.new_line(job_id, task_id, "stdout", "taken first, committed last", utcnow())])
    late = store.newest(slow, [job_id])[job_id]
    with factory() as s, s.begin():
        store.append(
            s, [store.new_line(job_id, task_id, "stdout", "taken second, committed first", utcnow())]
        )
        early = store.newest(s, [job_id])[job_id]
    bus.publish(store.logs_channel(job_id), {"kind": "task.logs", "job_id": job_id, "seq": early})
    wait_until(lambda: len(events) == 1, "the first committed line")
    assert late < early
    slow.commit()
    slow.close()
    bus.publish(store.logs_channel(job_id), {"kind": "task.logs", "job_id": job_id, "seq": late})
    wait_until(lambda: len(events) == 2, "the line committed late", timeout=10)
    assert [e["data"]["line"] for e in events] == [
        "taken second, committed first",
        "taken first, committed last",
    ]
    time.sleep(4)  # past the settle time, and another read: nothing is sent twice
    bus.publish(store.logs_channel(job_id), {"kind": "task.logs", "job_id": job_id, "seq": early})
    time.sleep(0.5)
    assert len(events) == 2
