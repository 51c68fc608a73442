"""Cross-region sync between cluster leaders over gRPC (see ``engine.SyncEngine``)."""
