"""One strategy per sync mode, run on the cluster leader (``base.Strategy``)."""
