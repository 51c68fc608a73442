"""Resource layer (ITU-T Y.2501): enrollment tokens, node registration, heartbeats and liveness,
and the ``cpn.agent.v1`` gRPC edge the node agents talk to."""
