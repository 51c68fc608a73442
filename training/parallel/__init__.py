"""Intra-cluster parallelism: degrees and mesh, process-group setup, sharding plans (TP, FSDP2, DDP),
pipeline stages, and the whole-replica gather/scatter used by the cross-region hook."""
