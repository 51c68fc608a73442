"""``python -m agent``: the same command as ``cpn agent``."""

import typer

from agent.cli import agent_command

if __name__ == "__main__":
    typer.run(agent_command)
