"""The keeper and the parent-death tie, on real processes: a tree ends with its parent, whatever
signal ends the parent, and a keeper exits as its child did."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from contracts.lifetime import Watched, keeper_command, tied_env
from tests.processes import marked_env, wait_for_process, wait_until_gone

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# A child that ignores SIGTERM and starts a grandchild in a session of its own, as torchrun starts
# its ranks: out of reach of any signal to the child's process group.
STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(301)"], start_new_session=True)
    print("ready", flush=True)
    time.sleep(300)
""")


def test_a_keeper_ends_the_tree_after_the_grace_and_exits_as_its_child() -> None:
    env, mark = marked_env()
    argv, fds = keeper_command([sys.executable, "-c", STUBBORN], grace_s=0.5)
    keeper = subprocess.Popen(argv, pass_fds=fds, env=env, stdout=subprocess.PIPE)
    assert keeper.stdout is not None and keeper.stdout.readline() == b"ready\n"
    keeper.send_signal(signal.SIGTERM)  # forwarded, ignored; then SIGKILL to the whole tree
    assert keeper.wait(30) == -signal.SIGKILL
    assert wait_until_gone(mark) == {}

    # A child that ends on its own: its code, and what it left behind ends with the keeper.
    script = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])"
    )
    script += "; sys.exit(3)"
    env, mark = marked_env()
    argv, fds = keeper_command([sys.executable, "-c", script], grace_s=5)
    assert subprocess.run(argv, pass_fds=fds, env=env, timeout=30).returncode == 3
    assert wait_until_gone(mark) == {}

    argv, fds = keeper_command(["/nonexistent/program"], grace_s=0)
    out = subprocess.run(argv, pass_fds=fds, capture_output=True, text=True, timeout=30)
    assert out.returncode == 127 and "cannot run '/nonexistent/program'" in out.stderr


# A parent that starts a keeper from a thread that then ends (as the agent's reference step and
# pip builds are started), and a tied child from its main thread; then waits to be killed.
PARENT = textwrap.dedent(f"""
    import subprocess, sys, threading, time
    sys.path.insert(0, {str(REPO)!r})
    from contracts.lifetime import keeper_command, tied_env

    def keep():
        argv, fds = keeper_command([sys.executable, "-c", {STUBBORN!r}], grace_s=60)
        subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.DEVNULL)

    t = threading.Thread(target=keep)
    t.start()
    t.join()
    tied = "import sys; sys.path.insert(0, {str(REPO)!r}); from contracts.lifetime import die_with_parent; "
    tied += "die_with_parent(); " + "import time; time.sleep(300)"
    subprocess.Popen([sys.executable, "-c", tied], env=tied_env())
    print("started", flush=True)
    time.sleep(300)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_parent_takes_its_kept_trees_and_tied_children_along(sig: signal.Signals) -> None:
    env, mark = marked_env()
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=env, stdout=subprocess.PIPE)
    assert parent.stdout is not None and parent.stdout.readline() == b"started\n"
    wait_for_process(mark, "-c import time; time.sleep(301)")  # the kept child's own child
    wait_for_process(mark, "die_with_parent(); import time")  # the tied child
    parent.send_signal(sig)
    parent.wait(30)
    assert wait_until_gone(mark) == {}


def test_a_tied_child_whose_parent_is_already_gone_exits_at_once() -> None:
    # The parent's pid in the environment is not this child's parent: it went before the tie.
    env = tied_env() | {"PYTHONPATH": str(REPO)}
    env["CPN_DIE_WITH_PARENT"] = "1"
    code = "from contracts.lifetime import die_with_parent; die_with_parent(); print('alive')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "alive" not in out.stdout


def test_a_watched_keeper_gives_its_code_and_cpu_time_and_is_stopped_when_due_or_cancelled() -> None:
    # Ends on its own: its exit code, and the CPU time it spent (read at the reaping, not lost
    # to a watcher that reaped it first).
    spin = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.exit(3)"
    argv, fds = keeper_command([sys.executable, "-c", spin], grace_s=0)
    watched = Watched(subprocess.Popen(argv, pass_fds=fds), time.monotonic() + 300)
    code, cpu_s = watched.reap()
    assert code == 3 and cpu_s >= 0.3

    # Past its deadline: the keeper is stopped and ends the whole tree (grandchild included).
    env, mark = marked_env()
    argv, fds = keeper_command([sys.executable, "-c", STUBBORN], grace_s=0)
    proc = subprocess.Popen(argv, pass_fds=fds, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    code, _ = Watched(proc, time.monotonic()).reap()
    assert code == -signal.SIGKILL
    assert wait_until_gone(mark) == {}

    # Cancelled: the same, at the event.
    env, mark = marked_env()
    cancel = threading.Event()
    argv, fds = keeper_command([sys.executable, "-c", STUBBORN], grace_s=0)
    proc = subprocess.Popen(argv, pass_fds=fds, env=env, stdout=subprocess.PIPE)
    watched = Watched(proc, time.monotonic() + 300, cancel)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    cancel.set()
    assert watched.reap()[0] == -signal.SIGKILL
    assert wait_until_gone(mark) == {}
