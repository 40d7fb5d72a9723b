"""``tandem models``: publish model versions, list them, assign them to devices.

``publish`` runs the publish pipeline (``model_cdn.publish``, which needs
onnx and onnxruntime and loads only when the command runs) behind a
progress bar (``_publish_view``); ``list`` reads the registry; ``assign``
signs assignments, stores them and publishes them retained on MQTT.
Failures are one line on stderr, ``tandem models <command>: <why>``: exit 1
when the work failed, 2 when the command line was wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from ._common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    MqttCaOption,
    MqttCertOption,
    MqttKeyOption,
    PrefixOption,
    RegistryOption,
    SignKeyOption,
    StoreOption,
    clean_errors,
    fail,
    load_key,
    mqtt_settings,
    open_registry_for,
    ratio_text,
)
from ._publish_view import print_published, read_labels, with_progress

__all__ = ["models_app"]

_MODEL_AT_VERSION = re.compile(r"([^@]+)@([1-9][0-9]{0,17})")
QUANTIZE = ("int8-static", "int8-dynamic", "fp16", "none")
FORMATS = ("onnx", "tflite")

models_app = typer.Typer(no_args_is_help=True, add_completion=False)


@models_app.callback()
def _models() -> None:
    """Publish model versions, list them, assign them to devices."""


@models_app.command("list")
def models_list(
    name: Annotated[
        str | None, typer.Argument(help="Show this model's versions.", show_default=False)
    ] = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
) -> None:
    """List models with their latest version, or one model's versions.

    Example: tandem models list mnist --registry sqlite:///./tandem-cdn/registry.db
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    command = "models list"
    with clean_errors(command):
        reg = open_registry_for(registry, create=False)
        try:
            if name is None:
                table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
                for column in ("model", "latest", "versions", "published"):
                    table.add_column(column, no_wrap=True)
                table.add_column("blob", overflow="ellipsis")  # gives way when narrow
                models = reg.list_models()
                for model in models:
                    records = reg.list_versions(model)
                    last = records[-1]
                    table.add_row(
                        model,
                        str(last.version),
                        str(len(records)),
                        last.published_at,
                        last.blob_digest.removeprefix("sha256:")[:12],
                    )
                empty = not models
            else:
                table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
                for column in ("version", "published", "method", "agreement", "accuracy"):
                    table.add_column(column, no_wrap=True)
                table.add_column("blob", overflow="ellipsis")
                records = reg.list_versions(name)
                for record in records:
                    q = record.manifest.get("signed", {}).get("quantization", {})
                    table.add_row(
                        str(record.version),
                        record.published_at,
                        str(q.get("method", "—")),
                        ratio_text(q.get("agreement")),
                        ratio_text(q.get("accuracy")),
                        record.blob_digest.removeprefix("sha256:")[:12],
                    )
                empty = not records
        finally:
            reg.close()
    if empty:
        typer.echo("no models yet" if name is None else f"{name} has no versions")
    else:
        Console().print(table)


@models_app.command("assign")
def models_assign(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODEL@VERSION", help="What to run, e.g. mnist@3.", show_default=False
        ),
    ],
    device: Annotated[
        list[str],
        typer.Option("--device", help="Device id (repeat for several).", show_default=False),
    ],
    sign_key: SignKeyOption = None,  # required; checked so the message names the env variable
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            envvar="TANDEM_BROKER",
            help="MQTT broker URL; without it the assignment is only stored (devices poll).",
        ),
    ] = None,
    rollback: Annotated[
        bool, typer.Option("--rollback", help="Allow going below the device's highest version.")
    ] = False,
    rollout: Annotated[str | None, typer.Option("--rollout", help="Rollout id to record.")] = None,
    ttl_days: Annotated[
        float, typer.Option("--ttl-days", help="Days until devices ignore this assignment.")
    ] = 30.0,
    prefix: PrefixOption = "tandem/v1",
    registry: RegistryOption = DEFAULT_REGISTRY,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
) -> None:
    """Tell devices which version to run: sign, store, and publish retained on MQTT.

    Example: tandem models assign mnist@3 --device cam-1 --device cam-2
    --sign-key ~/.tandem/publisher.key --broker mqtt://broker:1883
    """
    from model_cdn import CdnError, make_assignment, publish_assignment
    from shared import Topics, validate_name

    command = "models assign"
    match = _MODEL_AT_VERSION.fullmatch(target)
    if match is None:
        fail(command, f"write the target as MODEL@VERSION (e.g. mnist@3), got {target!r}", 2)
    model, version = match.group(1), int(match.group(2))
    with clean_errors(command):
        try:
            validate_name(model, "model name")
            for d in device:
                validate_name(d, "device id")
            settings = mqtt_settings(broker, mqtt_ca, mqtt_cert, mqtt_key)
            topics = Topics(prefix)
        except ValueError as e:
            fail(command, str(e), 2)
        key = load_key(sign_key, command)
        reg = open_registry_for(registry, create=False)
        try:
            reg.get_version(model, version)
            for d in device:
                doc = make_assignment(
                    key,
                    device=d,
                    model=model,
                    version=version,
                    rollback=rollback,
                    rollout=rollout,
                    ttl_days=ttl_days,
                )
                reg.put_assignment(d, model, doc)
                if settings is not None:
                    try:
                        publish_assignment(settings, topics, d, doc)
                    except CdnError as e:
                        raise CdnError(f"{d}: assignment stored, but not published: {e}") from e
                    typer.echo(f"{d}: {model}@{version} stored and published to {settings.url}")
                else:
                    typer.echo(f"{d}: {model}@{version} stored (no --broker: devices poll the CDN)")
        finally:
            reg.close()


@models_app.command("publish")
def models_publish(
    source: Annotated[
        Path,
        typer.Argument(help="The float model: an ONNX file.", show_default=False),
    ],
    name: Annotated[str, typer.Option("--name", help="Model name.", show_default=False)],
    version: Annotated[
        int | None, typer.Option("--version", help="Version number (default: the latest + 1).")
    ] = None,
    quantize: Annotated[
        str, typer.Option("--quantize", help=f"One of {', '.join(QUANTIZE)}.")
    ] = "int8-static",
    calibration: Annotated[
        Path | None,
        typer.Option("--calibration", help="Calibration inputs (.npy, or .npz with 'inputs')."),
    ] = None,
    validation: Annotated[
        Path | None,
        typer.Option(
            "--validation", help="Held-out inputs and optional 'labels' (.npz) for validation."
        ),
    ] = None,
    min_agreement: Annotated[
        float,
        typer.Option(
            "--min-agreement", help="Refuse to publish below this quantized-vs-float agreement."
        ),
    ] = 0.97,
    format: Annotated[str, typer.Option("--format", help="onnx or tflite.")] = "onnx",
    tflite_file: Annotated[
        Path | None, typer.Option("--tflite-file", help="The converted .tflite (--format tflite).")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option("--labels", help="A text file with one class label per line.")
    ] = None,
    expires_in_days: Annotated[
        float, typer.Option("--expires-in-days", help="Devices refuse the manifest after this.")
    ] = 365.0,
    sign_key: SignKeyOption = None,  # required; checked so the message names the env variable
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Quantize, validate, compress, sign and register a model version.

    The quantized model must agree with the float one on at least
    --min-agreement of the validation samples, or nothing is published.

    Example: tandem models publish mnist.onnx --name mnist --calibration calib.npz
    --validation val.npz --sign-key ~/.tandem/publisher.key
    """
    command = "models publish"
    if quantize not in QUANTIZE:
        fail(command, f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}", 2)
    if format not in FORMATS:
        fail(command, f"--format must be onnx or tflite, got {format!r}", 2)
    if not 0 <= min_agreement <= 1:
        fail(command, f"--min-agreement must be between 0 and 1, got {min_agreement}", 2)
    if not source.is_file():
        fail(command, f"no model file {source}", 2)
    with clean_errors(command):
        key = load_key(sign_key, command)
        try:
            from model_cdn.publish import load_samples, publish_model
        except ImportError as e:
            fail(command, f"the publish pipeline needs {e.name!r}: install tandem[cdn]")
        from model_cdn import open_store

        calibration_inputs = load_samples(calibration)[0] if calibration else None
        validation_samples = load_samples(validation) if validation else None
        label_list = read_labels(labels) if labels else None
        reg = open_registry_for(registry, create=True)
        try:
            result = with_progress(
                lambda progress: publish_model(
                    source,
                    name=name,
                    registry=reg,
                    store=open_store(store),
                    signing_key=key,
                    version=version,
                    quantize=quantize,  # type: ignore[arg-type]  # checked above
                    calibration=calibration_inputs,
                    validation=validation_samples,
                    min_agreement=min_agreement,
                    format=format,  # type: ignore[arg-type]
                    tflite_file=tflite_file,
                    labels=label_list,
                    expires_in_days=expires_in_days,
                    progress=progress,
                )
            )
        finally:
            reg.close()
    print_published(result)
