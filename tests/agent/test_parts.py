"""The agent's pure parts: settings parsing, worker command and environment, output parsing,
the log budget, the outbox and the state file."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent import contention, profile
from agent.daemon import channel_options, reconnect_cap_s
from agent.devices import detect_devices, system_memory_bytes
from agent.outbox import Outbox
from agent.output import LineBudget, MetricsTracker, parse_prefixed
from agent.profile import one_reference_at_a_time, physical_cores, profile_from_result
from agent.settings import AgentSettings, DeviceRequest, parse_port_range
from agent.state import AgentState, Credentials
from agent.workers import Assignment, resolve_checkpoint_dir, worker_command, worker_env
from contracts.errors import FailedPrecondition, InvalidArgument
from proto.cpn.agent.v1 import agent_pb2
from resource_layer.convert import metrics_to_dict


def settings(**kw: object) -> AgentSettings:
    base: dict[str, object] = {"server": "127.0.0.1:50051", "region": "eu-west", "cluster": "paris-1",
                               "price_per_device_hour": 1.0}  # fmt: skip
    return AgentSettings(**{**base, **kw})  # type: ignore[arg-type]


def test_device_request_parses_auto_and_cpu_slots() -> None:
    assert DeviceRequest.parse("auto") == DeviceRequest(kind="auto")
    assert DeviceRequest.parse("CPU:4") == DeviceRequest(kind="cpu", count=4)
    for bad in ("cpu", "cpu:0", "cpu:-1", "gpu:2", "cpu:2000", ""):
        with pytest.raises(InvalidArgument, match="--devices"):
            DeviceRequest.parse(bad)


def test_port_range() -> None:
    assert parse_port_range("29600-29699") == (29600, 29699)
    for bad in ("29600", "29700-29600", "80-90", "60000-70000", "a-b"):
        with pytest.raises(InvalidArgument, match="--sync-ports"):
            parse_port_range(bad)


def test_settings_name_the_bad_field() -> None:
    s = settings(devices="cpu:2", sync_ports="30000-30010")
    assert s.devices.count == 2 and s.sync_ports == (30000, 30010)
    assert s.effective_state_file == Path("./cpn-agent/agent-state.json")
    for field, value in [("server", "no-port"), ("region", "EU"), ("cluster", ""), ("devices", "tpu:1"),
                         ("price_per_device_hour", -1), ("sync_ports", "1-2"), ("probe_port", 80),
                         ("probe_port", 70000), ("probe_port", -2)]:  # fmt: skip
        with pytest.raises(ValidationError) as err:
            settings(**{field: value})
        assert err.value.errors()[0]["loc"] == (field,)


def test_several_replicas_and_the_tls_flags() -> None:
    s = settings(server=" a.example:50051, 10.0.0.2:50051 ")
    assert s.servers == ["a.example:50051", "10.0.0.2:50051"] and s.server == "a.example:50051,10.0.0.2:50051"
    for bad in ("a:1,a:1", "a:1,", "a:1,no-port", ",".join(f"h{i}:1" for i in range(17))):
        with pytest.raises(ValidationError, match="--server"):
            settings(server=bad)
    with pytest.raises(ValidationError, match="needs --tls-ca-file"):
        settings(enroll_server="a:50052")
    m = settings(enroll_server="a:50052,b:50052", tls_ca_file="/etc/ca.crt")
    assert m.enroll_servers == ["a:50052", "b:50052"]


def assignment(config: dict[str, object], devices: tuple[int, ...] = (0, 1)) -> Assignment:
    return Assignment.from_proto(
        agent_pb2.Assignment(
            assignment_id="a1", job_id="j1", attempt=1, device_indices=list(devices), nproc=len(devices),
            worker_config_json=json.dumps(config),
        )
    )  # fmt: skip


def test_normal_path_is_torchrun_over_the_training_worker(tmp_path: Path) -> None:
    a = assignment({"job_id": "j1", "training": {"steps": 7}})
    cmd = worker_command(a, tmp_path / "cfg.json", allow_override=False)
    assert cmd == [sys.executable, "-m", "training.launch", "--standalone", "--nproc-per-node", "2",
                   "-m", "training.worker", "--config", str(tmp_path / "cfg.json")]  # fmt: skip
    assert a.total_steps == 7


def test_command_override_only_where_allowed(tmp_path: Path) -> None:
    a = assignment({"command": ["echo", "hi"]})
    assert worker_command(a, tmp_path / "c.json", allow_override=True) == ["echo", "hi"]
    with pytest.raises(InvalidArgument, match="does not allow command overrides"):
        worker_command(a, tmp_path / "c.json", allow_override=False)
    with pytest.raises(InvalidArgument, match="non-empty list of strings"):
        worker_command(assignment({"command": "echo hi"}), tmp_path / "c.json", allow_override=True)


def test_worker_env_pins_devices(tmp_path: Path) -> None:
    a = assignment({}, devices=(2, 3))
    cuda = worker_env({"PATH": "/bin"}, a, device_kind="cuda", config_path=tmp_path / "c.json")
    assert cuda["CUDA_VISIBLE_DEVICES"] == "2,3" and "OMP_NUM_THREADS" not in cuda
    assert cuda["CPN_WORKER_CONFIG"] == str(tmp_path / "c.json") and cuda["PATH"] == "/bin"
    cpu = worker_env({}, a, device_kind="cpu", config_path=tmp_path / "c.json")
    assert cpu["OMP_NUM_THREADS"] == "1" and cpu["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    ("json_text", "nproc", "reason"),
    [("not json", 1, "not JSON"), ("[1]", 1, "must be a JSON object"), ("{}", 0, "nproc: must be >= 1")],
)
def test_malformed_assignment_is_refused(json_text: str, nproc: int, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason):
        Assignment.from_proto(
            agent_pb2.Assignment(assignment_id="a", nproc=nproc, worker_config_json=json_text)
        )


def test_prefixed_lines() -> None:
    assert parse_prefixed('CPN_METRIC {"step": 1}', "CPN_METRIC ") == {"step": 1}
    assert parse_prefixed("CPN_METRIC {broken", "CPN_METRIC ") is None
    assert parse_prefixed("CPN_METRIC [1]", "CPN_METRIC ") is None
    assert parse_prefixed("hello", "CPN_METRIC ") is None


def test_metrics_tracker_keeps_running_wan_totals_and_maps_names() -> None:
    t = MetricsTracker(total_steps=10)
    t.update({"step": 1, "loss": 3.0, "compute_util": 0.4, "wall_s": 0.2,
              "sync": {"bytes_sent": {"a": 100, "b": 50}, "bytes_recv": 30, "latency_s": 0.5}})  # fmt: skip
    m = t.update({"step": 2, "loss": 2.5, "sync": {"bytes_sent": {"a": 10}}})
    assert m == {"step": 2, "total_steps": 10, "loss": 2.5, "tokens_per_s": 0.0, "compute_utilization": 0.0,
                 "wan_bytes_sent": 160, "wan_bytes_recv": 30, "sync_latency_s": 0.0,
                 "wall_time_s": 0.0, "checkpoint_step": 0}  # fmt: skip
    assert t.update({"step": 3, "wan_bytes_sent": 7, "total_steps": 12})["wan_bytes_sent"] == 7
    assert t.update({"step": 4, "checkpoint_step": 3})["checkpoint_step"] == 3
    assert t.update({"step": "x"})["step"] == 0  # garbage is zero, never a crash


def test_line_budget_drops_over_rate_and_counts_them() -> None:
    b = LineBudget(rate=10.0, burst=3)
    assert [b.admit(0.0)[0] for _ in range(5)] == [True, True, True, False, False]
    assert b.admit(0.05) == (False, 0)  # half a token so far
    assert b.admit(0.2) == (True, 3)  # one token back: forwarded, three were dropped before it


def test_outbox_sends_control_before_bulk_and_bounds_bulk() -> None:
    async def run() -> list[str]:
        box = Outbox(bulk_limit=2)
        for i in range(3):
            box.put(agent_pb2.AgentMessage(log=agent_pb2.TaskLog(line=str(i))))
        box.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1)))
        box.put(agent_pb2.AgentMessage(task_status=agent_pb2.TaskStatus(assignment_id="a")))
        box.drop_heartbeats()
        box.close()
        out = []
        while (m := await box.get()) is not None:
            out.append(m.WhichOneof("kind") + (":" + m.log.line if m.HasField("log") else ""))
        return out

    assert asyncio.run(run()) == ["task_status", "log:1", "log:2"]


def test_outbox_sends_a_tasks_queued_metrics_before_its_status() -> None:
    def metrics(aid: str, step: int) -> agent_pb2.AgentMessage:
        return agent_pb2.AgentMessage(metrics=agent_pb2.TaskMetrics(assignment_id=aid, step=step))

    async def run() -> list[str]:
        box = Outbox()
        for step in (1, 2):
            box.put(metrics("a", step))
            box.put(metrics("b", step))
        box.put(agent_pb2.AgentMessage(log=agent_pb2.TaskLog(assignment_id="a", line="x")))
        box.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1)))
        box.put(agent_pb2.AgentMessage(task_status=agent_pb2.TaskStatus(assignment_id="a", state=3)))
        box.close()
        out = []
        while (m := await box.get()) is not None:
            kind = m.WhichOneof("kind")
            out.append(f"{kind}:{m.metrics.assignment_id}{m.metrics.step}" if kind == "metrics" else kind)
        return out

    # a's metrics go ahead of a's status (but after what was already in the control lane); b's and
    # the log stay in the bulk lane
    assert asyncio.run(run()) == [
        "heartbeat", "metrics:a1", "metrics:a2", "task_status", "metrics:b1", "metrics:b2", "log",
    ]  # fmt: skip


def test_state_file_roundtrip_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    assert AgentState.load(path) == AgentState()
    creds = Credentials("h:1", "eu-west", "paris-1", "n1", "tok", "c1")
    AgentState(credentials=creds, workers={"a": {"pgid": 5, "dir": "/x"}}).save(path)
    loaded = AgentState.load(path)
    assert loaded.credentials == creds and loaded.workers == {"a": {"pgid": 5, "dir": "/x"}}
    assert path.stat().st_mode & 0o777 == 0o600
    assert creds.fits("h:1", "eu-west", "paris-1") and not creds.fits("h:1", "eu-west", "other")
    # a second replica listed later is the same control plane; an unrelated one is not
    assert creds.fits("h:1,h2:1", "eu-west", "paris-1") and not creds.fits("other:1", "eu-west", "paris-1")
    path.write_text("{oops")
    with pytest.raises(ValueError, match="remove it to register afresh"):
        AgentState.load(path)


def test_cpu_slots_are_measured() -> None:
    devices = detect_devices(DeviceRequest.parse("cpu:3"))
    assert [d.index for d in devices] == [0, 1, 2]
    assert all(
        d.kind == "cpu" and d.model == "cpu" and d.memory_gb > 0 and d.measured_tflops > 0 for d in devices
    )
    assert devices[0].memory_gb * 3 <= system_memory_bytes() / 1024**3


def test_auto_finds_cuda_devices_or_says_how_to_declare_cpu_slots() -> None:
    import torch

    if torch.cuda.is_available():
        devices = detect_devices(DeviceRequest.parse("auto"))
        assert devices and all(d.kind == "cuda" and d.measured_tflops > 0 for d in devices)
    else:
        with pytest.raises(FailedPrecondition, match="--devices cpu:N"):
            detect_devices(DeviceRequest.parse("auto"))


def test_reconnect_backoff_never_outwaits_a_heartbeat_interval() -> None:
    s = settings()
    assert s.reconnect_max_s == 2.0
    assert reconnect_cap_s(s, 2.0) == 2.0
    assert reconnect_cap_s(s, 1.0) == 1.0  # a server with faster heartbeats: retry faster
    assert reconnect_cap_s(settings(reconnect_max_s=30.0), 2.0) == 2.0  # an operator's 30 s is capped
    assert reconnect_cap_s(s, 0.1) == s.reconnect_min_s  # never a busy loop
    options = dict(channel_options(s, reconnect_cap_s(s, 1.0)))
    assert options["grpc.max_reconnect_backoff_ms"] == 1000  # the channel's own backoff too


def test_metrics_tracker_passes_the_steps_parts_only_when_measured() -> None:
    t = MetricsTracker(total_steps=10)
    assert "compute_s" not in t.update({"step": 1, "loss": 3.0})
    m = t.update({"step": 2, "data_s": 0.01, "compute_s": 0.2, "optimizer_s": 0.03, "sync_s": 0.5,
                  "checkpoint_s": 0.0, "wall_s": 0.74, "sync": {}})  # fmt: skip
    parts = ("data_s", "compute_s", "optimizer_s", "sync_s", "checkpoint_s", "step_wall_s")
    assert {k: m[k] for k in parts} == {
        "data_s": 0.01, "compute_s": 0.2, "optimizer_s": 0.03, "sync_s": 0.5, "checkpoint_s": 0.0,
        "step_wall_s": 0.74,
    }  # fmt: skip
    # What the agent sends: the optional TaskMetrics fields are set, and the server reads them back.
    msg = agent_pb2.TaskMetrics(assignment_id="a", **m)
    back = metrics_to_dict(msg)
    assert back["sync_s"] == 0.5 and back["step_wall_s"] == 0.74
    assert "compute_s" not in metrics_to_dict(agent_pb2.TaskMetrics(assignment_id="a", step=1))
    assert "compute_s" not in t.update({"step": 3, "compute_s": float("nan")})


def test_a_balanced_regions_job_step_reaches_the_server_only_where_reported() -> None:
    t = MetricsTracker(total_steps=10)
    first = agent_pb2.TaskMetrics(assignment_id="a", **t.update({"step": 1}))
    assert "job_step" not in metrics_to_dict(first)
    m = t.update({"step": 12, "job_step": 9.5})  # a fast region: past training.steps, job not done
    assert metrics_to_dict(agent_pb2.TaskMetrics(assignment_id="a", **m))["job_step"] == 9.5


def test_metrics_tracker_passes_the_wire_total_only_where_the_worker_read_it() -> None:
    t = MetricsTracker(total_steps=10)
    m = t.update({"step": 1, "sync": {"bytes_sent": {"a": 100}}})
    assert "wan_wire_bytes_sent" not in m  # unavailable, not 0
    assert "wan_wire_bytes_sent" not in metrics_to_dict(agent_pb2.TaskMetrics(assignment_id="a", **m))
    m = t.update({"step": 2, "sync": {"bytes_sent": {"a": 10}, "wire_bytes_sent_total": 140}})
    assert m["wan_wire_bytes_sent"] == 140 and m["wan_bytes_sent"] == 110  # a total vs the deltas
    assert t.update({"step": 3, "sync": {}})["wan_wire_bytes_sent"] == 140  # a step between readings
    assert t.update({"step": 4, "sync": {"wire_bytes_sent_total": -5}})["wan_wire_bytes_sent"] == 140
    back = metrics_to_dict(agent_pb2.TaskMetrics(assignment_id="a", **m))
    assert back["wan_wire_bytes_sent"] == 140 and back["wan_bytes_sent"] == 110


def test_a_reference_result_becomes_a_profile_or_nothing() -> None:
    rate = {"tflops": 0.05, "micro_batch_s": 0.004, "step_s": 0.001, "optimizer_s_per_mparam": 0.005,
            "data_s_per_mtoken": 9.0, "checkpoint_s_per_mparam": 0.1}  # fmt: skip
    result = {
        "startup_s": 7.5,
        "host_load_factor": 1.2,
        "rates": {"fp32": rate, "bf16": {**rate, "tflops": 0.08}},
    }
    p = profile_from_result(result, teardown_s=1.5, cores=2)
    assert p is not None and (p.startup_s, p.teardown_s, p.physical_cores, p.host_load_factor) == (
        7.5,
        1.5,
        2,
        1.2,
    )
    assert {r.precision: r.tflops for r in p.rates} == {"bf16": 0.08, "fp32": 0.05}
    assert p.launcher_s == 0.0  # not reported: not measured
    with_launcher = profile_from_result({**result, "launcher_s": 1.2}, teardown_s=1.5, cores=2)
    assert with_launcher is not None and with_launcher.as_dict()["launcher_s"] == 1.2
    # The launcher's part cannot exceed the whole start-up.
    assert profile_from_result({**result, "launcher_s": 8.0}, teardown_s=1.5, cores=2) is None
    assert p.as_dict()["rates"]["fp32"] == rate  # type: ignore[index]
    # The all-reduce between two CPU ranks: 0 where not reported, carried where it is, refused
    # out of bounds (a rate without its call, a negative wait).
    assert (p.collective_call_s, p.collective_gbps, p.collective_wait_s) == (0.0, 0.0, 0.0)
    collective = {"collective_call_s": 2.5e-4, "collective_gbps": 9.0, "collective_wait_s": 1e-3}
    measured = profile_from_result({**result, **collective}, teardown_s=1.5, cores=2)
    assert measured is not None and {k: measured.as_dict()[k] for k in collective} == collective
    for bad in ({"collective_call_s": 0.0}, {"collective_wait_s": -1.0}, {"collective_gbps": "fast"}):
        assert profile_from_result({**result, **collective, **bad}, teardown_s=1.5, cores=2) is None
    assert profile_from_result({**result, "startup_s": None}, teardown_s=1.0, cores=2) is None
    assert profile_from_result({**result, "rates": {"fp32": {"tflops": 1}}}, teardown_s=1.0, cores=2) is None
    assert (
        profile_from_result({**result, "rates": {"fp32": {**rate, "tflops": -1}}}, teardown_s=1, cores=2)
        is None
    )
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


def test_contention_probe_reads_runnable_threads_per_core() -> None:
    cores = os.cpu_count() or 1
    sample = contention.probe(spin_s=0.005)
    # The runnable count over the cores (this thread at least), or a spin's wall over CPU time.
    assert 1.0 / cores <= sample < 100.0
    # On a whole machine: the kernel's count over its cores, this thread included; where the
    # count is unreadable a spin (1.0 where it did not wait), and so on a share of a larger machine.
    quiet = functools.partial(contention.probe, spin_s=0.005, max_wall_s=10.0, own=lambda: None)
    for running, expect in ((1, 1 / 8), (3, 3 / 8), (8, 1.0), (20, 2.5)):
        assert quiet(cores=8, count=lambda r=running: r) == pytest.approx(expect)
    for running in (None, 0):
        got = quiet(cores=8, count=lambda r=running: r)
        assert got == 1.0 or got > contention.WAITED  # the host made it wait
    assert quiet(cores=0, count=lambda: 1) >= 1.0  # a share of a larger machine
    n = contention.runnable_threads()
    assert n is not None and n >= 1  # the reader itself runs


def test_agents_of_one_host_measure_their_reference_steps_in_turn(tmp_path: Path) -> None:
    lock = tmp_path / "reference.lock"
    entered = threading.Event()
    order: list[str] = []

    def second() -> None:
        entered.set()
        with one_reference_at_a_time(lock):
            order.append("second")

    with one_reference_at_a_time(lock):
        t = threading.Thread(target=second)
        t.start()
        entered.wait(5)
        time.sleep(0.2)  # the second agent is waiting on the lock, not measuring
        order.append("first")
    t.join(5)
    assert order == ["first", "second"]
    with one_reference_at_a_time(tmp_path / "missing-dir" / "x.lock"):  # unopenable: no turn taken
        order.append("alone")
    assert order[-1] == "alone"


def _host_lock_held(lock: Path) -> bool:
    with open(lock, "a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


def test_an_agent_settles_its_contention_in_its_own_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settled after the turn, the probes ran beside the next agent's reference step and the agent
    # registered that step's load as the host's.
    lock = tmp_path / "reference.lock"
    measured: list[object] = [object(), None]  # a profile, then a failed measurement
    monkeypatch.setattr(
        profile, "_measure_profile", lambda kind, work_dir, timeout_s, cancel: measured.pop(0)
    )
    held: list[bool] = []
    got = profile.measure_profile(
        "cpu", tmp_path, then=lambda: held.append(_host_lock_held(lock)), lock_path=lock, shared_max_age_s=0
    )
    assert got is not None and held == [True]
    assert not _host_lock_held(lock)  # the next agent's turn
    # A failed measurement registers no profile: nothing to settle after it.
    again = profile.measure_profile(
        "cpu", tmp_path, then=lambda: held.append(True), lock_path=lock, shared_max_age_s=0
    )
    assert again is None
    assert held == [True]


def test_probes_pause_while_a_co_located_agent_measures_its_reference_step(tmp_path: Path) -> None:
    # Beside another agent's reference step the idle host read 1.0-1.4 runnable threads a core
    # (0.5 alone), and an agent that then ran jobs back to back kept that figure.
    lock = tmp_path / "reference.lock"
    assert not profile.another_measuring(lock)
    with profile.one_reference_at_a_time(lock):
        assert profile.another_measuring(lock)
    assert not profile.another_measuring(lock)
    assert not _host_lock_held(lock)  # the check itself holds nothing


def test_a_figure_names_the_probes_it_kept_by_their_age() -> None:
    win = contention.Contention(window_s=100.0)
    # Two probes beside another job (3.0, 2.5) and one spike are trimmed from eight; the ages are
    # those of the middle half, oldest first, so the server can count what ran then.
    for t, sample in enumerate([1.0, 3.0, 1.1, 0.5, 2.5, 1.2, 0.6, 9.0]):
        win.add(sample, at=float(t))
    assert win.value == pytest.approx((1.0 + 1.1 + 2.5 + 1.2) / 4)
    ages = functools.partial(win.kept_ages, own_left_out=False)  # a figure that counts cpn's threads
    assert ages(now=10.0) == [10.0, 8.0, 6.0, 5.0]  # probes 0, 2, 4, 5
    assert ages(now=10.0, limit=2) == [10.0, 5.0]  # an even subset, ends kept
    # Probes older than the server reads are left out rather than sent.
    assert ages(now=5.0 + 8 * 86_400.0) == []
    assert contention.Contention().kept_ages(own_left_out=False) == []
    # One that leaves them out (this machine's /proc is readable) has nothing to subtract.
    assert contention.sees_own_threads()
    assert win.kept_ages(now=10.0) == []


def test_interquartile_mean_trims_a_quarter_from_each_end() -> None:
    assert contention.interquartile_mean([]) == 0.0  # not measured: the heartbeat says 0
    assert contention.interquartile_mean([2.0]) == 2.0
    assert contention.interquartile_mean([1.0, 9.0]) == 5.0  # too few to trim
    assert contention.interquartile_mean([6.0, 1.0, 1.2, 1.4]) == pytest.approx(1.3)  # spike gone
    assert contention.interquartile_mean([1.0, 2.0, 3.0, 4.0, 100.0, 0.0, 5.0, 6.0]) == pytest.approx(3.5)


def test_the_window_trims_a_short_burst_keeps_load_that_stays_and_forgets_old_probes() -> None:
    win = contention.Contention(window_s=10.0)
    assert win.value == 0.0
    # A burst (another agent's start-up) in the first two of ten probes of a quiet host is trimmed.
    for t, sample in enumerate([4.0, 3.5] + [1.0] * 8):
        win.add(sample, at=float(t))
    assert win.value == pytest.approx(1.0)
    # Load that stays (three more runnable threads on two cores) moves the figure once it holds
    # for more than a quarter of the window, and all of it once the quiet probes age out.
    figures = [win.add(2.5, at=10.0 + t) for t in range(11)]
    assert figures[0] < 1.25 and figures[-1] == pytest.approx(2.5)
    assert figures == sorted(figures) and 1.5 < figures[5] < 2.5


def test_settle_probes_for_its_duration_into_the_window() -> None:
    now = [100.0]
    samples = iter([3.0, 1.2, 1.1, 1.3, 1.0, 1.2, 1.1, 1.2, 1.0, 1.1, 1.2, 1.3, 1.1, 1.0, 1.2, 1.1])
    win = contention.Contention()
    figure = contention.settle(
        win,
        duration_s=3.0,
        every_s=0.2,
        measure=lambda: next(samples),
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert now[0] == pytest.approx(103.0)  # 16 probes, the last at the window's end
    assert figure == win.value and 1.1 <= figure <= 1.2  # the reference step's tail (3.0) trimmed
    assert next(samples, None) is None


def test_checkpoint_dir_is_resolved_under_the_work_dir_and_may_not_leave_it(tmp_path: Path) -> None:
    cfg = {"job_id": "j", "checkpoint": {"dir": "checkpoints/j/eu-west", "every": 5}}
    out = resolve_checkpoint_dir(cfg, tmp_path)
    assert out["checkpoint"] == {"dir": str(tmp_path.resolve() / "checkpoints/j/eu-west"), "every": 5}
    assert cfg["checkpoint"]["dir"] == "checkpoints/j/eu-west"  # the assignment's own copy is untouched
    assert resolve_checkpoint_dir({"job_id": "j"}, tmp_path) == {"job_id": "j"}
    for bad in ("/etc/cpn", "checkpoints/../../x"):
        with pytest.raises(InvalidArgument, match="checkpoint.dir"):
            resolve_checkpoint_dir({"checkpoint": {"dir": bad}}, tmp_path)
