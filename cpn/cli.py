"""The ``cpn`` command: server, agent, demo, and the client commands for users and admins.

It sits above every layer (it starts the control plane and the node agent alike), so it lives
outside them: the server layers never import the agent or torch.
"""

from __future__ import annotations

import typer

from agent.cli import agent_command
from service_layer.cli.access import keys_app, nodes_app
from service_layer.cli.admin import db_app, snapshot_app, tenants_app, tokens_app
from service_layer.cli.artifacts import artifacts_app
from service_layer.cli.demo import demo
from service_layer.cli.jobs import jobs_app, quote
from service_layer.cli.ledger import invoice, ledger_app, statement
from service_layer.cli.plan import plan_command
from service_layer.cli.queue import queue
from service_layer.cli.regions import regions_app
from service_layer.cli.server import server_command
from training.calibration_cli import calibrate_command

app = typer.Typer(
    name="cpn",
    help="Compute-power-network control plane: price- and QoS-aware placement of geo-distributed training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.command("server")(server_command)
app.command("agent")(agent_command)
app.command("demo")(demo)
app.command("quote")(quote)
app.command("plan")(plan_command)
app.command("calibrate")(calibrate_command)
app.command("queue")(queue)
app.command("invoice")(invoice)
app.command("statement")(statement)
app.add_typer(jobs_app, name="jobs")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(tokens_app, name="tokens")
app.add_typer(tenants_app, name="tenants")
app.add_typer(keys_app, name="keys")
app.add_typer(nodes_app, name="nodes")
app.add_typer(regions_app, name="regions")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(db_app, name="db")
app.add_typer(ledger_app, name="ledger")

if __name__ == "__main__":
    app()
