"""``python -m cpn``: the same as the ``cpn`` command."""

from cpn.cli import app

if __name__ == "__main__":
    app()
