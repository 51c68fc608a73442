"""Reading Slurm's parsable output: ``scontrol -o`` records, GRES strings, job ends."""

from __future__ import annotations

from pathlib import Path

from agent.slurm import end_of
from agent.slurm_cli import JobEnd, job_end_from_jobcomp, job_end_from_sacct, parse_record, read_tail
from agent.slurm_nodes import gres_gpus, node_from_record, slot_devices, unavailable_slots

# jobcomp/filetxt as Slurm 23/24 writes it: one record per ended job, a requeued job more than once.
JOBCOMP = (
    "JobId=12 UserId=root(0) GroupId=root(0) Name=cpn-a JobState=PREEMPTED Partition=debug "
    "TimeLimit=5 StartTime=2026-11-29T12:08:41 EndTime=2026-11-29T12:09:41 NodeList=localhost "
    "NodeCnt=1 ProcCnt=2 WorkDir=/tmp/x y ReservationName= Tres=cpu=2,node=1 Account= QOS= WcKey= "
    "Cluster=unknown SubmitTime=2026-11-29T12:08:38 EligibleTime=2026-11-29T12:08:38 "
    "DerivedExitCode=0:0 ExitCode=0:15 \n"
    "JobId=13 UserId=root(0) GroupId=root(0) Name=wrap JobState=FAILED ExitCode=3:0 \n"
    "JobId=12 UserId=root(0) GroupId=root(0) Name=cpn-a JobState=OUT_OF_MEMORY ExitCode=0:9 \n"
)

GPU_NODE = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=16 CPUAlloc=8 CPUTot=64 CPULoad=1.00 "
    "Gres=gpu:a100:4(S:0-1) GresUsed=gpu:a100:1(IDX:0) NodeAddr=gpu01 RealMemory=512000 "
    "State=MIXED+DRAIN Reason=bad fan [root@2026-11-29T10:00:00]"
)


def test_records_keep_values_with_spaces_and_gres_counts_gpus() -> None:
    record = parse_record(GPU_NODE)
    assert record["Reason"] == "bad fan [root@2026-11-29T10:00:00]" and record["CPUTot"] == "64"
    assert gres_gpus("gpu:a100:4(S:0-1)") == ("a100", 4)
    assert gres_gpus("gpu:2,shard:8") == ("", 2) and gres_gpus("(null)") == ("", 0)
    node = node_from_record(record)
    assert (node.gpus, node.gpus_used, node.gpu_model) == (4, 1, "a100")
    assert not node.usable and node.free_gpus == 0  # draining: it takes no new job


def test_the_registered_slots_are_the_gpus_of_nodes_taking_jobs_and_the_unavailable_the_rest() -> None:
    up = node_from_record(parse_record(GPU_NODE.replace("State=MIXED+DRAIN", "State=MIXED")))
    drained = node_from_record(parse_record(GPU_NODE.replace("gpu01", "gpu02")))
    devices = slot_devices([up, drained], cpu_tflops=0.1, gpu_memory_gb=80.0, gpu_tflops=300.0)
    assert [(d.index, d.kind, d.model) for d in devices] == [(i, "cuda", "a100") for i in range(4)]
    # One GPU held by another user's job: unavailable, unless it is cpn's own started job.
    assert unavailable_slots([up, drained], registered=4, held=0) == 1
    assert unavailable_slots([up, drained], registered=4, held=1) == 0
    # Drained since the agent registered: every slot is unavailable.
    assert unavailable_slots([drained], registered=4, held=0) == 4
    # Nothing takes jobs: the whole cluster is registered, and Slurm queues cpn's tasks.
    assert len(slot_devices([drained], cpu_tflops=0.1, gpu_memory_gb=80.0, gpu_tflops=300.0)) == 4


def test_slurm_ends_map_to_a_reason_and_whether_the_task_was_lost() -> None:
    assert end_of("7", JobEnd("COMPLETED", 0, 0), False) == (0, None, False)
    assert end_of("7", JobEnd("FAILED", 3, 0), False) == (3, None, False)
    assert end_of("7", JobEnd("PREEMPTED", 0, 15), False) == (143, "Slurm ended job 7 as PREEMPTED", True)
    assert end_of("7", JobEnd("TIMEOUT", 0, 0), False)[1:] == ("Slurm ended job 7 as TIMEOUT", True)
    assert end_of("7", JobEnd("NODE_FAIL", 0, 0), False)[2] is True
    oom = end_of("7", JobEnd("OUT_OF_MEMORY", 0, 9), False)
    assert oom[1] == "out of memory: Slurm killed job 7 at its memory limit" and oom[2] is False
    assert end_of("7", JobEnd("CANCELLED", 0, 15), True)[1:] == ("Slurm ended job 7 as CANCELLED", False)
    assert end_of("7", JobEnd("CANCELLED", 0, 15), False)[2] is True
    assert job_end_from_sacct("CANCELLED by 0|0:15") == JobEnd("CANCELLED", 0, 15)


def test_the_jobcomp_file_gives_a_jobs_last_end() -> None:
    assert job_end_from_jobcomp(JOBCOMP, "12") == JobEnd("OUT_OF_MEMORY", 0, 9)
    assert job_end_from_jobcomp(JOBCOMP, "13") == JobEnd("FAILED", 3, 0)
    assert job_end_from_jobcomp(JOBCOMP, "1") is None and job_end_from_jobcomp("", "12") is None


def test_a_long_jobcomp_file_is_read_from_its_tail_at_a_line_start(tmp_path: Path) -> None:
    path = tmp_path / "jobcomp.txt"
    path.write_text(JOBCOMP * 50)
    tail = read_tail(str(path), limit=len(JOBCOMP) + 10)
    assert tail.startswith("JobId=") and tail.endswith(JOBCOMP.splitlines(keepends=True)[-1])
    assert job_end_from_jobcomp(tail, "12") == JobEnd("OUT_OF_MEMORY", 0, 9)
    assert read_tail(str(tmp_path / "absent")) == ""
