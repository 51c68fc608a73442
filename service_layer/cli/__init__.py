"""The ``cpn`` command line (typer + rich)."""
