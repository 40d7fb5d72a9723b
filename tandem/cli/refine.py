"""``tandem models refine``: fine-tune an edge model on what its fleet offloaded, publish it.

A thin shell over ``tandem.learning.refine_model`` (mounted into ``tandem
models`` by the command table): parse the options, run the job behind a
progress bar, print both models' figures on the held-out sets, and, with
``--rollout``, ask the CDN's rollout service for a staged rollout of the new
version with the agreement gate. A refused candidate prints the same figures
and why, publishes nothing and exits 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ._admin import (
    CaOption,
    admin_call,
    admin_client,
    admin_errors,
    parse_duration,
    parse_fraction,
    parse_labels,
)
from ._common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    RegistryOption,
    SignKeyOption,
    StoreOption,
    clean_errors,
    fail,
    load_key,
    open_registry_for,
)
from ._refine_options import (
    BaseOption,
    CalibrationOption,
    CdnOption,
    CloudModelOption,
    ExamplesOption,
    HoldoutOption,
    MaxAgreementDropOption,
    MaxForgettingOption,
    MinAgreementOption,
    MinGainOption,
    NameArgument,
    OutOption,
    ReplayOption,
    RolloutOption,
    SeedOption,
    SoakOption,
    TargetOption,
    TokenOption,
    TrainerOption,
    TrainerOptionsOption,
    ValidationOption,
)

if TYPE_CHECKING:
    from model_cdn import AdminClient
    from model_cdn.publish import PublishTarget
    from shared import SigningKey
    from tandem.learning import RefineReport, RefineSettings

__all__ = ["refine"]

COMMAND = "models refine"


def refine(
    name: NameArgument,
    examples: ExamplesOption,
    base: BaseOption,
    validation: ValidationOption,
    calibration: CalibrationOption = None,
    replay: ReplayOption = None,
    trainer: TrainerOption = "tandem.learning:distill",
    trainer_option: TrainerOptionsOption = None,
    cloud_model: CloudModelOption = None,
    holdout: HoldoutOption = "20%",
    min_gain: MinGainOption = "0%",
    max_forgetting: MaxForgettingOption = "0.5%",
    min_agreement: MinAgreementOption = "97%",
    seed: SeedOption = 0,
    out: OutOption = Path("refine-output"),
    sign_key: SignKeyOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
    cdn: CdnOption = None,
    token: TokenOption = None,
    ca: CaOption = None,
    rollout: RolloutOption = None,
    target: TargetOption = None,
    soak: SoakOption = "10m",
    max_agreement_drop: MaxAgreementDropOption = "2%",
) -> None:
    """Fine-tune an edge model on the examples its fleet offloaded, and publish it if better.

    Reads the examples the hub collected (the cloud's answers are the
    targets), holds out --holdout of them, trains with --trainer (default:
    distillation from the float model of the version in service, --base, with
    --replay mixed in), quantizes like the version in service and compares
    both on the held-out examples and --validation. A worse candidate is
    refused (exit 1, nothing published); a better one goes through the
    publish pipeline. With --rollout it then goes out in waves, gated on
    edge-cloud agreement against the version in service.

    Example: tandem models refine mnist-edge --examples ./examples --base edge_float.onnx
    --validation validation.npz --calibration calibration.npz --replay train.npz
    --sign-key keys/publisher.key
    """
    if rollout is not None and cdn is None:
        fail(COMMAND, "--rollout needs --cdn: the CDN's rollout service runs it", 2)
    labels = parse_labels(target or [], "--target", COMMAND)
    soak_s = parse_duration(soak, "--soak", COMMAND)
    shares = _shares(
        holdout=holdout,
        min_gain=min_gain,
        max_forgetting=max_forgetting,
        min_agreement=min_agreement,
        max_agreement_drop=max_agreement_drop,
    )
    settings = _settings(
        {
            "model": name,
            "examples": examples,
            "base": base,
            "validation": validation,
            "calibration": calibration,
            "replay": replay,
            "trainer": trainer,
            "trainer_options": _options(trainer_option or []),
            "cloud_model": cloud_model,
            "seed": seed,
            "out_dir": out,
        },
        shares,
    )
    client = None if cdn is None else admin_client(COMMAND, cdn, token, ca)
    report = _refine_or_exit(settings, client, registry, store, sign_key, out)
    _print_figures(report)
    typer.echo(f"published {name}@{report.version}; float model and report in {out}")
    if rollout is not None and client is not None:
        _start_rollout(client, name, report, rollout, labels, soak_s, shares["max_agreement_drop"])


def _shares(**texts: str) -> dict[str, float]:
    """Each share option (``20%``, ``0.2``) as a fraction; exit 2 on a bad one."""
    return {
        name: parse_fraction(text, f"--{name.replace('_', '-')}", COMMAND)
        for name, text in texts.items()
    }


def _settings(fields: dict[str, Any], shares: dict[str, float]) -> RefineSettings:
    """The job's settings; exit 2 for a file that is not there or a setting that cannot work."""
    from tandem.learning import RefineSettings

    for what in ("base", "validation", "calibration", "replay"):
        path = fields[what]
        if path is not None and not path.is_file():
            fail(COMMAND, f"no file {path}", 2)
    try:
        return RefineSettings(
            **fields,
            holdout=shares["holdout"],
            min_gain=shares["min_gain"],
            max_forgetting=shares["max_forgetting"],
            min_agreement=shares["min_agreement"],
        )
    except ValueError as e:
        fail(COMMAND, str(e), 2)


def _refine_or_exit(
    settings: RefineSettings,
    client: AdminClient | None,
    registry: str,
    store: str,
    sign_key: Path | None,
    out: Path,
) -> RefineReport:
    """The published candidate's report; a refused one prints why and exits 1."""
    from tandem.learning import RefineRefusedError

    with clean_errors(COMMAND), admin_errors(COMMAND):
        key = load_key(sign_key, COMMAND)
        try:
            return _run(settings, client, registry, store, key)
        except RefineRefusedError as e:
            _print_figures(e.report)
            for why in e.report.refusals:
                typer.echo(f"refused: {why}")
            fail(COMMAND, f"nothing published; the report is in {out / 'refine-report.json'}")


def _start_rollout(
    client: AdminClient,
    name: str,
    report: RefineReport,
    waves: str,
    labels: dict[str, str],
    soak_s: float,
    max_agreement_drop: float,
) -> None:
    body: dict[str, Any] = {
        "model": name,
        "version": report.version,
        "waves": waves,
        "soak_s": soak_s,
        "max_agreement_drop": max_agreement_drop,
    }
    if labels:
        body["target"] = labels
    status = admin_call(COMMAND, client.start_rollout, body)
    typer.echo(
        f"rollout {status.get('id')} started: {name}@{report.version} in waves {waves}; "
        f"watch it with: tandem rollout status {status.get('id')} --watch"
    )


def _options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(COMMAND, f"--trainer-option takes KEY=VALUE, got {pair!r}", 2)
        options[key] = value
    return options


def _run(
    settings: RefineSettings,
    client: AdminClient | None,
    registry: str,
    store: str,
    key: SigningKey,
) -> RefineReport:
    from model_cdn import open_store
    from model_cdn.publish import AdminApiTarget, LocalTarget
    from tandem.learning import refine_model

    from ._models_view import with_progress

    reg = None if client is not None else open_registry_for(registry, create=False)
    try:
        target: PublishTarget
        if client is not None:
            target = AdminApiTarget(client)
        else:
            assert reg is not None
            target = LocalTarget(reg, open_store(store), trusted_keys=[key.public_key])
        report: RefineReport = with_progress(
            lambda progress: refine_model(
                settings, target=target, signing_key=key, progress=progress
            )
        )
        return report
    finally:
        if reg is not None:
            reg.close()


def _print_figures(report: RefineReport) -> None:
    from rich.console import Console
    from rich.table import Table

    examples = report.examples
    table = Table(
        title=f"{report.model}: {examples.get('collected', 0)} collected examples "
        f"({examples.get('training', 0)} to train, {report.held_out} held out) from "
        f"{examples.get('devices', 0)} devices"
    )
    table.add_column("model")
    table.add_column(f"agrees with the cloud ({report.held_out} held out)", justify="right")
    table.add_column(f"validation accuracy ({report.validation})", justify="right")
    for figures in (report.current, report.candidate):
        table.add_row(
            figures.label,
            f"{figures.held_out_agreement:.2%}",
            f"{figures.validation_accuracy:.2%}",
        )
    Console().print(table)
