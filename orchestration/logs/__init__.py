"""Workers' log lines per task: the bounds and their rotation (pure) and the table's reads and writes."""
