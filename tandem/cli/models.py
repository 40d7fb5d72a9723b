"""``tandem models``: publish model versions, list them, pull them, assign them to devices.

``publish`` runs the publish pipeline (``model_cdn.publish``, which needs
onnx and onnxruntime and loads only when the command runs) behind a
progress bar, and hands the release to one of two targets: the CDN's admin
API (``--cdn URL``, with ``--token``), or the registry and store named by
``--registry`` and ``--store`` (the default), through the same library
call the server makes. ``assign`` signs assignments and, likewise, sends
them through the admin API (the CDN stores them and publishes them on its
broker) or stores them in ``--registry`` and publishes them on ``--broker``.
``list`` reads the registry. ``pull`` writes one version's model file,
verified against ``--trusted-key`` (``model_cdn.pull_model``), from the CDN
(``--cdn``) or the registry and store. Failures are one line on stderr, ``tandem
models <command>: <why>``: exit 1 when the work failed, 2 when the command
line was wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._admin import CaOption, admin_client, admin_errors
from ._common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    AssignerKeyOption,
    MqttCaOption,
    MqttCertOption,
    MqttKeyOption,
    PrefixOption,
    RegistryOption,
    SignedCommand,
    SignKeyOption,
    StoreOption,
    TrustedKeysOption,
    clean_errors,
    fail,
    load_key,
    load_trusted_key,
    mqtt_settings,
    open_registry_for,
    required_in_help,
)
from ._models_view import (
    models_table,
    print_published,
    read_labels,
    versions_table,
    with_progress,
)

if TYPE_CHECKING:
    from model_cdn import AdminClient, Registry
    from model_cdn.publish import PublishTarget
    from shared import MqttSettings, SigningKey, Topics

__all__ = ["models_app"]

_MODEL_AT_VERSION = re.compile(r"([^@]+)@([1-9][0-9]{0,17})")
QUANTIZE = ("int8-static", "int8-dynamic", "fp16", "none")
FORMATS = ("onnx", "tflite")

models_app = typer.Typer(no_args_is_help=True, add_completion=False)


@models_app.callback()
def _models() -> None:
    """Publish model versions, list them, assign them to devices."""


# No TANDEM_CDN_URL here: a variable set for 'tandem rollout' must not move publishing.
TargetCdnOption = Annotated[
    str | None,
    typer.Option(
        "--cdn",
        help="Go through this CDN's admin API (http:// or https://) instead of writing "
        "--registry and --store here.",
        show_default=False,
    ),
]
TargetTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TANDEM_CDN_ADMIN_TOKEN",
        help="With --cdn: the CDN's admin token, or an API key with models:publish "
        "(publish; models:read too where reads are guarded) or rollout:admin (assign).",
        show_default=False,
    ),
]


# -- tandem models list ---------------------------------------------------------


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
    from rich.console import Console

    with clean_errors("models list"):
        reg = open_registry_for(registry, create=False)
        try:
            if name is None:
                models = reg.list_models()
                table, empty = models_table(reg, models), not models
            else:
                records = reg.list_versions(name)
                table, empty = versions_table(records), not records
        finally:
            reg.close()
    if empty:
        typer.echo("no models yet" if name is None else f"{name} has no versions")
    else:
        Console().print(table)


# -- tandem models assign -------------------------------------------------------

AssignBrokerOption = Annotated[
    str | None,
    typer.Option(
        "--broker",
        envvar="TANDEM_BROKER",
        help="MQTT broker URL; without it the assignment is only stored (devices poll). "
        "Not with --cdn: the CDN publishes on its own broker.",
    ),
]


@models_app.command("assign", cls=SignedCommand)
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
    sign_key: AssignerKeyOption = None,  # required; checked so the message names the env var
    broker: AssignBrokerOption = None,
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
    cdn: TargetCdnOption = None,
    token: TargetTokenOption = None,
    ca: CaOption = None,
) -> None:
    """Tell devices which version to run: sign, store, and publish retained on MQTT.

    With --cdn the signed assignments go through the CDN's admin API: the CDN
    checks and stores them and publishes them on its own broker. Without it
    they are stored in --registry and published on --broker from here.

    Example: tandem models assign mnist@3 --device cam-1 --device cam-2
    --sign-key ~/.tandem/publisher.key --broker mqtt://broker:1883
    """
    from model_cdn import make_assignment
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
            if cdn is not None and settings is not None:
                raise ValueError("--broker does not go with --cdn: the CDN publishes on its own")
        except ValueError as e:
            fail(command, str(e), 2)
        client = None if cdn is None else admin_client(command, cdn, token, ca)
        key = load_key(sign_key, command)
        docs = {
            d: make_assignment(
                key,
                device=d,
                model=model,
                version=version,
                rollback=rollback,
                rollout=rollout,
                ttl_days=ttl_days,
            )
            for d in device
        }
        if client is not None:
            _assign_through(command, client, model, version, docs)
        else:
            _assign_here(registry, settings, topics, key, model, docs)


def _assign_through(
    command: str, client: AdminClient, model: str, version: int, docs: dict[str, Any]
) -> None:
    with admin_errors(command):
        for d, doc in docs.items():
            answer = client.put_assignment(d, model, doc)
            if answer.get("published"):
                typer.echo(f"{d}: {model}@{version} stored and published by {client.url}")
            else:
                typer.echo(
                    f"{d}: {model}@{version} stored by {client.url} (no broker: devices poll)"
                )


def _assign_here(
    registry: str,
    settings: MqttSettings | None,
    topics: Topics,
    key: SigningKey,
    model: str,
    docs: dict[str, Any],
) -> None:
    """Through the library call the admin API makes (``model_cdn.assign_version``): checked,
    stored, and published on ``settings``' broker by the one ``AssignmentSender``."""
    from model_cdn import AssignmentNotPublishedError, AssignmentSender, assign_version

    reg = open_registry_for(registry, create=False)
    sender = None
    try:
        if settings is not None:
            sender = AssignmentSender.connect(settings, topics, lazy=True)
        for d, doc in docs.items():
            try:
                done = assign_version(reg, sender, d, model, doc, trusted_keys=[key.public_key])
            except AssignmentNotPublishedError as e:
                raise AssignmentNotPublishedError(f"{d}: {e}") from e
            if settings is None:
                typer.echo(
                    f"{d}: {model}@{done.version} stored (no --broker: devices poll the CDN)"
                )
            else:
                typer.echo(f"{d}: {model}@{done.version} stored and published to {settings.url}")
    finally:
        if sender is not None:
            sender.close()
        reg.close()


# -- tandem models publish ------------------------------------------------------

SourceArgument = Annotated[
    Path,
    typer.Argument(
        help="The float model: an ONNX file; or an ONNX Runtime GenAI model folder "
        "(genai_config.json, model, tokenizer), published as one package.",
        show_default=False,
    ),
]
SmokePromptOption = Annotated[
    str | None,
    typer.Option(
        "--smoke-prompt",
        help="A model folder: the prompt of the greedy smoke generation devices re-run "
        "(default 'The ').",
        show_default=False,
    ),
]
NameOption = Annotated[str, typer.Option("--name", help="Model name.", show_default=False)]
VersionOption = Annotated[
    int | None, typer.Option("--version", help="Version number (default: the latest + 1).")
]
QuantizeOption = Annotated[
    str | None,
    typer.Option(
        "--quantize",
        help=f"One of {', '.join(QUANTIZE)}. Default: int8-static; with --format tflite the "
        "file is published as converted (none).",
        show_default=False,
    ),
]
CalibrationOption = Annotated[
    Path | None,
    typer.Option("--calibration", help="Calibration inputs (.npy, or .npz with 'inputs')."),
]
ValidationOption = Annotated[
    Path | None,
    typer.Option(
        "--validation", help="Held-out inputs and optional 'labels' (.npz) for validation."
    ),
]
MinAgreementOption = Annotated[
    float,
    typer.Option(
        "--min-agreement", help="Refuse to publish below this quantized-vs-float agreement."
    ),
]
FormatOption = Annotated[str, typer.Option("--format", help="onnx or tflite.")]
TfliteFileOption = Annotated[
    Path | None, typer.Option("--tflite-file", help="The converted .tflite (--format tflite).")
]
LabelsOption = Annotated[
    Path | None, typer.Option("--labels", help="A text file with one class label per line.")
]
ExpiresOption = Annotated[
    float, typer.Option("--expires-in-days", help="Devices refuse the manifest after this.")
]
AllowSameOption = Annotated[
    bool,
    typer.Option(
        "--allow-same",
        help="Publish even when the model is byte for byte a version already published.",
    ),
]


@models_app.command("publish", cls=SignedCommand)
def models_publish(
    source: SourceArgument,
    name: NameOption,
    version: VersionOption = None,
    quantize: QuantizeOption = None,
    calibration: CalibrationOption = None,
    validation: ValidationOption = None,
    min_agreement: MinAgreementOption = 0.97,
    format: FormatOption = "onnx",
    tflite_file: TfliteFileOption = None,
    labels: LabelsOption = None,
    expires_in_days: ExpiresOption = 365.0,
    sign_key: SignKeyOption = None,  # required; checked so the message names the env variable
    allow_same: AllowSameOption = False,
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
    cdn: TargetCdnOption = None,
    token: TargetTokenOption = None,
    ca: CaOption = None,
    smoke_prompt: SmokePromptOption = None,
) -> None:
    """Quantize, validate, compress, sign and register a model version.

    A model folder (ONNX Runtime GenAI's) is published as one package: no
    quantization (the model builder did it); it must load and generate, and
    its greedy output from --smoke-prompt goes into the manifest.

    The quantized model must agree with the float one on at least
    --min-agreement of the validation samples, or nothing is published. The
    version goes to --registry and --store, or with --cdn through the CDN's
    admin API (blobs uploaded, then the signed manifest registered).

    Example: tandem models publish mnist.onnx --name mnist --calibration calib.npz
    --validation val.npz --sign-key ~/.tandem/publisher.key
    """
    command = "models publish"
    package = source.is_dir()
    if package and (quantize, calibration, validation, tflite_file, labels) != (None,) * 5:
        fail(command, f"{source} is a model folder, published as built: leave out --quantize, "
             "--calibration, --validation, --tflite-file and --labels", 2)  # fmt: skip
    if not package:
        _check_publish_options(command, source, quantize, format, min_agreement)
    client = None if cdn is None else admin_client(command, cdn, token, ca)
    with clean_errors(command), admin_errors(command):
        key = load_key(sign_key, command)
        try:
            from model_cdn import IdenticalModelError
            from model_cdn.publish import load_samples, publish_model, publish_package
        except ImportError as e:
            fail(command, f"the publish pipeline needs {e.name!r}: install tandem[cdn]")
        if package:
            folder: dict[str, Any] = {
                "name": name,
                "signing_key": key,
                "version": version,
                "expires_in_days": expires_in_days,
                "allow_same": allow_same,
            }
            if smoke_prompt is not None:
                folder["smoke_prompt"] = smoke_prompt
        options: dict[str, Any] = {
            "name": name,
            "signing_key": key,
            "version": version,
            "quantize": quantize,
            "calibration": load_samples(calibration)[0] if calibration else None,
            "validation": load_samples(validation) if validation else None,
            "min_agreement": min_agreement,
            "format": format,
            "tflite_file": tflite_file,
            "labels": read_labels(labels) if labels else None,
            "expires_in_days": expires_in_days,
            "allow_same": allow_same,
        }
        reg = None if client is not None else open_registry_for(registry, create=True)
        try:
            target = _publish_target(client, reg, store, key)
            result = with_progress(
                lambda progress: (
                    publish_package(source, target=target, progress=progress, **folder)
                    if package
                    else publish_model(source, target=target, progress=progress, **options)
                )
            )
        except IdenticalModelError as e:
            fail(
                command,
                f"{source} is byte for byte {name}@{e.version}, already published: nothing new "
                "(another --quantize, e.g. int8-dynamic, builds a different version from the "
                "same float model; --allow-same publishes these bytes as a new version anyway)",
            )
        finally:
            if reg is not None:
                reg.close()
    print_published(result)


def _check_publish_options(
    command: str, source: Path, quantize: str | None, format: str, min_agreement: float
) -> None:
    """What the command line alone can tell is wrong: one line, exit code 2."""
    if quantize is not None and quantize not in QUANTIZE:
        fail(command, f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}", 2)
    if format not in FORMATS:
        fail(command, f"--format must be onnx or tflite, got {format!r}", 2)
    if format == "tflite" and quantize not in (None, "none"):
        fail(
            command,
            f"--quantize {quantize} does not apply to --format tflite: the .tflite file is "
            "published as converted (quantize it when converting); leave --quantize out",
            2,
        )
    if not 0 <= min_agreement <= 1:
        fail(command, f"--min-agreement must be between 0 and 1, got {min_agreement}", 2)
    if not source.is_file():
        fail(command, f"no model file {source}", 2)


def _publish_target(
    client: AdminClient | None, registry: Registry | None, store: str, key: SigningKey
) -> PublishTarget:
    """The CDN's admin API, or the registry and store here."""
    from model_cdn import open_store
    from model_cdn.publish import AdminApiTarget, LocalTarget

    if client is not None:
        return AdminApiTarget(client)
    assert registry is not None
    return LocalTarget(registry, open_store(store), trusted_keys=[key.public_key])


# -- tandem models pull ---------------------------------------------------------

_MODEL_REF = re.compile(r"([^@]+)(?:@([1-9][0-9]{0,17}))?")


ModelRefArgument = Annotated[
    str,
    typer.Argument(
        metavar="NAME[@VERSION]",
        help="The model, and a version (default: the latest).",
        show_default=False,
    ),
]
OutOption = Annotated[
    Path | None, typer.Option("--out", help="The model file to write.", show_default=False)
]
SourceCdnOption = Annotated[
    str | None,
    typer.Option(
        "--cdn",
        help="Read from this CDN (http:// or https://) instead of --registry and --store.",
        show_default=False,
    ),
]
ReadTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=["TANDEM_CDN_READ_TOKEN", "TANDEM_CDN_ADMIN_TOKEN"],
        help="With --cdn, where the CDN guards reads: its read or admin token, or an API "
        "key with models:read (env: TANDEM_CDN_READ_TOKEN, else TANDEM_CDN_ADMIN_TOKEN).",
        show_default=False,
    ),
]


@models_app.command("pull", cls=required_in_help("out", "trusted_key"))
def models_pull(
    target: ModelRefArgument,
    out: OutOption = None,  # required; checked so that a missing one is one line
    trusted_key: TrustedKeysOption = None,  # required, likewise
    cdn: SourceCdnOption = None,
    token: ReadTokenOption = None,
    ca: CaOption = None,
    registry: RegistryOption = DEFAULT_REGISTRY,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Write a published model to a file, once its signed manifest and digests check out.

    The manifest must be signed by a --trusted-key and unexpired, name the
    model (and version) asked for, and the blob must match its digests; then
    it is decompressed and written whole (a file a device loads as it is,
    e.g. EdgeAgent("mnist-edge.onnx")), or for a package its folder, each file
    checked against the signed listing (EdgeAgent(None, language_model=DIR)).
    Nothing is written otherwise.

    Example: tandem models pull mnist-edge@3 --out mnist-edge.onnx
    --trusted-key keys/publisher.pub --cdn http://cdn.example:8700
    """
    command = "models pull"
    match = _MODEL_REF.fullmatch(target)
    if match is None:
        fail(command, f"write the model as NAME or NAME@VERSION (e.g. mnist@3), got {target!r}", 2)
    name, version = match.group(1), None if match.group(2) is None else int(match.group(2))
    if out is None:
        fail(command, "no --out FILE: where should the model go?", 2)
    if not trusted_key:
        fail(command, "no --trusted-key: the publisher's public key checks what is pulled", 2)
    with clean_errors(command), admin_errors(command):
        from model_cdn import pull_model, write_model_file
        from shared import ManifestError, validate_name

        try:
            validate_name(name, "model name")
            keys = [load_trusted_key(k) for k in trusted_key]
        except ValueError as e:
            fail(command, str(e), 2)
        source, close = _pull_source(command, cdn, token, ca, registry, store)
        try:
            pulled = pull_model(source, name, version, keys)
        except ManifestError as e:
            asked = target if version else f"the latest {name}"
            why = f"{e} (trusted: {', '.join(trusted_key)})"
            fail(command, f"the manifest of {asked} from {source.where} does not verify: {why}")
        finally:
            close()
        if pulled.files is not None:  # a package: its folder
            from model_cdn import write_package_dir

            if out.exists() and not out.is_dir():
                fail(command, f"{pulled.ref} is a model folder: --out {out} is a file", 2)
            write_package_dir(out, pulled.files)
        else:
            _check_suffix(command, out, pulled.manifest.format)
            write_model_file(out, pulled.model)
    method = pulled.manifest.quantization.get("method", "?")
    typer.echo(
        f"pulled {pulled.ref} ({pulled.manifest.format}, {method}, {len(pulled.model)} bytes) "
        f"from {source.where} to {out}: signature and digests checked"
    )


def _pull_source(
    command: str, cdn: str | None, token: str | None, ca: Path | None, registry: str, store: str
) -> tuple[Any, Any]:
    """Where ``pull`` reads from, and how to let go of it."""
    from model_cdn import CdnSource, RegistrySource, open_store

    if cdn is not None:
        return CdnSource(admin_client(command, cdn, token, ca)), lambda: None
    reg = open_registry_for(registry, create=False)
    return RegistrySource(reg, open_store(store), where=registry), reg.close


def _check_suffix(command: str, out: Path, format: str) -> None:
    """Runtimes choose a loader by the file's suffix: a wrong one would load it as the wrong
    kind of model."""
    from model_cdn import MODEL_SUFFIXES

    wanted = MODEL_SUFFIXES.get(format)
    if wanted and out.suffix in MODEL_SUFFIXES.values() and out.suffix != wanted:
        fail(command, f"the model is {format}: name the file {out.with_suffix(wanted)}", 2)
