"""An independent reference for the planner: a discrete-event simulation of one training iteration.

    from benchmarks.sim import simulate
    result = simulate(spec, option, snapshot)        # SimResult: step time, breakdown, bytes per link

Written from what the worker does (``training/``), apart from the planner's cost model: it shares
only the plain data types (job spec, snapshot, plan option) and the model's parameter count.
Modules: ``network`` (event queue, max-min fair flows), ``collectives`` (rings, gossip),
``schedule`` (GPipe/1F1B per pipeline), ``workload`` (FLOPs and bytes per stage), ``links``
(which resources a message crosses), ``simulate`` (the iteration).
"""

from benchmarks.sim.simulate import SimResult, simulate

__all__ = ["SimResult", "simulate"]
