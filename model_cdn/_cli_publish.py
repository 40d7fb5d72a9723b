"""``tandem models publish``: the publish pipeline behind a progress bar and a summary table.

The pipeline (``model_cdn.publish``, which needs onnx and onnxruntime) loads
only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ._cli_common import (
    DEFAULT_REGISTRY,
    DEFAULT_STORE,
    RegistryOption,
    SignKeyOption,
    StoreOption,
    clean_errors,
    fail,
    load_key,
    open_registry_for,
    ratio_text,
    size_text,
)

__all__ = ["models_publish"]

QUANTIZE = ("int8-static", "int8-dynamic", "fp16", "none")
FORMATS = ("onnx", "tflite")


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
            from .publish import load_samples, publish_model
        except ImportError as e:
            fail(command, f"the publish pipeline needs {e.name!r}: install tandem[cdn]")
        from .store import open_store

        calibration_inputs = load_samples(calibration)[0] if calibration else None
        validation_samples = load_samples(validation) if validation else None
        label_list = _read_labels(labels) if labels else None
        reg = open_registry_for(registry, create=True)
        try:
            result = _with_progress(
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
    _print_published(result)


def _read_labels(path: Path) -> list[str]:
    labels = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not labels:
        raise ValueError(f"{path} holds no labels")
    return labels


def _with_progress(run: Any) -> Any:
    """Run ``run(progress)`` under a rich progress bar on stderr, one step per stage."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    stages = ["load float model", "quantize", "validate", "compress and store", "delta"]
    stages.append("sign and register")
    with Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("publishing", total=len(stages))
        done: set[str] = set()

        def progress(stage: str, fraction: float) -> None:
            if stage not in stages:
                stages.append(stage)
                bar.update(task, total=len(stages))
            if fraction >= 1:
                done.add(stage)
            partial = 0.0 if stage in done else max(0.0, min(fraction, 0.99))
            bar.update(task, description=stage, completed=len(done) + partial)

        return run(progress)


def _print_published(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    manifest, report = result.manifest, result.report
    table = Table(title=f"published {manifest.name}@{manifest.version}", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")  # the full digest, wrapped rather than cut
    delta = manifest.deltas[0] if manifest.deltas else None
    rows = [
        ("version", str(manifest.version)),
        ("digest", result.blob_digest),
        ("float size", size_text(report.get("float_bytes"))),
        (f"quantized size ({report.get('method', '?')})", size_text(report.get("quantized_bytes"))),
        ("compressed size", size_text(manifest.blob.size)),
        ("compressed / float", _share(manifest.blob.size, report.get("float_bytes"))),
        ("delta size", f"{size_text(delta.size)} from v{delta.from_version}" if delta else "—"),
        ("agreement", ratio_text(report.get("agreement"))),
        ("accuracy", ratio_text(report.get("accuracy"))),
    ]
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _share(part: int, whole: object) -> str:
    return f"{part / whole:.1%}" if isinstance(whole, int) and whole > 0 else "—"
