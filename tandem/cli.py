"""The ``tandem`` command: one entry point whose subcommands load their package lazily.

``tandem --help`` imports nothing heavy; ``tandem hub`` imports the hub only
when it runs, so a device with ``tandem[edge]`` never pays for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
import typer

__all__ = ["main"]

# name -> (module, attribute, one-line help). The attribute is a typer app or a
# typer-annotated function.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": (
        "tandem._demo_cli",
        "demo",
        "Run the whole system on one machine on real MNIST digits and print the comparison.",
    ),
    "hub": (
        "cloud_hub._cli",
        "hub",
        "Serve a model repository to edge agents over MQTT, with dynamic batching.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[cmd_name]
        try:
            target: Any = getattr(importlib.import_module(module_name), attr)
        except ImportError as e:
            raise click.ClickException(
                f"'tandem {cmd_name}' needs a package that is not installed ({e.name}); "
                "install tandem[all]"
            ) from e
        if not isinstance(target, typer.Typer):
            single = typer.Typer(add_completion=False)
            single.command(name=cmd_name)(target)
            target = single
        command = typer.main.get_command(target)
        command.name = cmd_name
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tandem")
def cli() -> None:
    """Tandem: edge-cloud collaborative inference.

    Devices answer with a small local model and offload heavy or uncertain
    requests over MQTT to a batching GPU hub, falling back to the local answer
    when the cloud is slow or gone.
    """


def main() -> None:
    cli(prog_name="tandem")


if __name__ == "__main__":
    main()
