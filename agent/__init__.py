"""The node agent: finds and measures devices, registers, heartbeats, and runs assigned workers
under torchrun (``cpn agent``)."""
