"""The ``cpn`` command line: the one place where server, agent and client commands meet."""
