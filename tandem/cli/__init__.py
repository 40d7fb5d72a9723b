"""The ``tandem`` command: one entry point whose subcommands load their package lazily.

``tandem --help`` imports no subcommand's module (nor the packages behind
them); ``tandem hub`` imports the hub only when it runs, so a device with
``tandem[edge]`` never pays for torch.

One module per command group, each a thin shell (parse options, call a
library function, print): ``hub``, ``keys``, ``models``, ``cdn``, ``fleet``
and ``rollout`` (``models refine`` lives in ``refine``, mounted into the
``models`` group by ``SUBCOMMANDS``); ``_common`` holds the options and one-line errors they
share, ``_admin`` what the commands that talk to the CDN's admin API share,
and the ``_*_view`` modules how results look in a terminal. ``python -m
tandem.cli`` runs the same command.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

__all__ = ["app", "main"]

# name -> (module, attribute, one-line help). The attribute is a typer app or a
# typer-annotated function.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": (
        "tandem.cli._demo_view",
        "demo",
        "Run the whole system on one machine on real MNIST digits and compare modes.",
    ),
    "hub": (
        "tandem.cli.hub",
        "hub",
        "Serve a model repository to edge agents over MQTT, with dynamic batching.",
    ),
    "keys": (
        "tandem.cli.keys",
        "keys_app",
        "Publisher signing keys (generate) and HTTP API keys with scopes (create, list, revoke).",
    ),
    "models": (
        "tandem.cli.models",
        "models_app",
        "Publish quantized, signed model versions; list them; assign them to devices.",
    ),
    "cdn": (
        "tandem.cli.cdn",
        "cdn_app",
        "Serve models, manifests, blobs and assignments over HTTP.",
    ),
    "fleet": (
        "tandem.cli.fleet",
        "fleet_app",
        "Device MQTT passwords and the broker's ACL; list the devices the CDN has seen.",
    ),
    "rollout": (
        "tandem.cli.rollout",
        "rollout_app",
        "Staged, health-gated model rollouts: start, watch, pause, resume, abort, roll back.",
    ),
}


# group -> {name: (module, attribute, one-line help)}: commands that appear in a group but
# live in a module of their own, mounted when the group is resolved.
SUBCOMMANDS: dict[str, dict[str, tuple[str, str, str]]] = {
    "models": {
        "refine": (
            "tandem.cli.refine",
            "refine",
            "Fine-tune an edge model on what its fleet offloaded; publish it if better.",
        ),
    },
}


class LazyGroup(TyperGroup):
    """Resolves a subcommand by importing its module only when it is invoked."""

    _listing = False  # while rendering --help, commands are shown from COMMANDS alone

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, short = COMMANDS[cmd_name]
        if self._listing:
            return TyperCommand(name=cmd_name, help=short, short_help=short)
        try:
            target: Any = getattr(importlib.import_module(module_name), attr)
        except ImportError as e:
            typer.echo(
                f"error: 'tandem {cmd_name}' needs {e.name!r}, which is not installed; "
                "install tandem[all]",
                err=True,
            )
            raise typer.Exit(2) from e
        if not isinstance(target, typer.Typer):
            single = typer.Typer(add_completion=False)
            single.command(name=cmd_name)(target)
            target = single
        command = typer.main.get_command(target)
        command.name = cmd_name
        for sub_name, (sub_module, sub_attr, _) in SUBCOMMANDS.get(cmd_name, {}).items():
            single = typer.Typer(add_completion=False)
            single.command(name=sub_name)(getattr(importlib.import_module(sub_module), sub_attr))
            command.add_command(typer.main.get_command(single), sub_name)  # type: ignore[attr-defined]
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    cls=LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"tandem {version('tandem')}")
        except PackageNotFoundError:
            typer.echo("tandem (not installed as a package)")
        raise typer.Exit()


@app.callback()
def root(
    _version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Tandem: edge-cloud collaborative inference.

    Devices answer with a small local model and offload heavy or uncertain
    requests over MQTT to a batching GPU hub, falling back to the local answer
    when the cloud is slow or gone.
    """


def main() -> None:
    app(prog_name="tandem")
