"""The options of ``tandem models refine``, declared once (``refine`` names them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "BaseOption",
    "CalibrationOption",
    "CdnOption",
    "CloudModelOption",
    "ExamplesOption",
    "HoldoutOption",
    "MaxAgreementDropOption",
    "MaxForgettingOption",
    "MinAgreementOption",
    "MinGainOption",
    "NameArgument",
    "OutOption",
    "ReplayOption",
    "RolloutOption",
    "SeedOption",
    "SoakOption",
    "TargetOption",
    "TokenOption",
    "TrainerOption",
    "TrainerOptionsOption",
    "ValidationOption",
]

NameArgument = Annotated[
    str,
    typer.Argument(help="The edge model to refine, as the CDN names it.", show_default=False),
]
ExamplesOption = Annotated[
    str,
    typer.Option(
        "--examples",
        help="Where the hub collects: the store of config.json's 'collection' "
        "(a path, file:// or s3:// URL).",
        show_default=False,
    ),
]
BaseOption = Annotated[
    Path,
    typer.Option(
        "--base", help="The float ONNX model of the version in service.", show_default=False
    ),
]
ValidationOption = Annotated[
    Path,
    typer.Option(
        "--validation",
        help="Original held-out data with labels (.npz: inputs, labels): what must not get worse.",
        show_default=False,
    ),
]
CalibrationOption = Annotated[
    Path | None,
    typer.Option("--calibration", help="Calibration inputs for static INT8 (.npy/.npz)."),
]
ReplayOption = Annotated[
    Path | None,
    typer.Option(
        "--replay",
        help="Original training data (.npz: inputs, labels) mixed into training "
        "against forgetting.",
    ),
]
TrainerOption = Annotated[
    str, typer.Option("--trainer", help="MODULE:FUNC called with a TrainingData.")
]
TrainerOptionsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trainer-option",
        help="KEY=VALUE for the trainer (repeat); distill takes epochs, lr, batch_size, "
        "temperature, replay_weight, weight_decay.",
        show_default=False,
    ),
]
CloudModelOption = Annotated[
    str | None,
    typer.Option("--cloud-model", help="Only examples collected for this hub model."),
]
HoldoutOption = Annotated[
    str, typer.Option("--holdout", help="Share of the examples kept out to judge.")
]
MinGainOption = Annotated[
    str,
    typer.Option("--min-gain", help="Held-out agreement with the cloud the new version must gain."),
]
MaxForgettingOption = Annotated[
    str,
    typer.Option("--max-forgetting", help="Validation accuracy it may lose."),
]
MinAgreementOption = Annotated[
    str, typer.Option("--min-agreement", help="The publish gate: quantized vs float.")
]
SeedOption = Annotated[int, typer.Option("--seed", help="Seeds the split and the training.")]
OutOption = Annotated[
    Path, typer.Option("--out", help="Where the new float model and the report go.")
]
CdnOption = Annotated[
    str | None,
    typer.Option(
        "--cdn", help="Publish through this CDN's admin API instead of --registry/--store."
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TANDEM_CDN_ADMIN_TOKEN",
        help="With --cdn: the admin token, or an API key with models:publish "
        "(and rollout:admin for --rollout).",
        show_default=False,
    ),
]
RolloutOption = Annotated[
    str | None,
    typer.Option(
        "--rollout",
        help="With --cdn: start a staged rollout of the new version in these waves "
        "(e.g. 25%,100%).",
    ),
]
TargetOption = Annotated[
    list[str] | None,
    typer.Option("--target", help="With --rollout: label=value the devices must have."),
]
SoakOption = Annotated[str, typer.Option("--soak", help="With --rollout: each wave's soak.")]
MaxAgreementDropOption = Annotated[
    str,
    typer.Option(
        "--max-agreement-drop",
        help="With --rollout: the agreement gate (edge-cloud agreement it may lose).",
    ),
]
