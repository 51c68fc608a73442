"""Reads the node's GPUs through NVML every few seconds on a thread of its own, so heartbeats carry
fresh samples without an NVML call on the event loop, and health verdicts (an XID, new ECC errors)
reach the control plane while the agent runs, not only at start-up."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from agent.gpu_reading import XidEvent, parse_reading
from agent.gpu_telemetry import MAX_XID_KEPT, GpuState, gpu_state, with_past_events
from agent.nvml import Nvml
from contracts.errors import CpnError
from contracts.registration import DeviceReport

log = logging.getLogger(__name__)


class GpuWatch:
    def __init__(
        self, devices: Sequence[DeviceReport], interval_s: float = 5.0, nvml: Callable[[], Nvml] = Nvml
    ) -> None:
        self._devices = tuple(devices)
        self._interval = interval_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._state: GpuState | None = None
        self._events: list[XidEvent] = []
        self._thread = threading.Thread(target=self._run, name="gpu-watch", daemon=True)

    def start(self) -> GpuWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def latest(self) -> GpuState | None:
        with self._lock:
            return self._state

    def _run(self) -> None:
        try:
            session = self._nvml()
        except CpnError as exc:
            log.warning("GPU watch: %s; heartbeats carry no GPU samples", exc.message)
            return
        try:
            while not self._stop.is_set():
                self._read_once(session)
                self._stop.wait(self._interval)
        finally:
            session.close()

    def _read_once(self, session: Nvml) -> None:
        try:
            reading = parse_reading(session.read())
        except Exception as exc:  # noqa: BLE001 (a failed read: the previous state stands, said once a period)
            log.warning("GPU watch: NVML reading failed: %s", exc)
            return
        reading = with_past_events(reading, self._events)
        self._events = list(reading.xid_events)[-MAX_XID_KEPT:]
        state = gpu_state(reading, self._devices)
        with self._lock:
            before, self._state = self._state, state
        if state.node_health and (before is None or before.node_health != state.node_health):
            log.error("GPU health: this node needs cordoning: %s", state.node_health)
