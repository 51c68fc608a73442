"""Training data: the synthetic Markov language, memory-mapped token files, per-replica streams."""
