"""Export a saved Hugging Face Llama directory for ONNX Runtime GenAI with its model builder.

The builder (``onnxruntime_genai.models.builder``, the one ``python -m
onnxruntime_genai.models.builder -i DIR -o OUT -p int4 -e cpu`` runs) writes
``model.onnx``, its external data, ``genai_config.json`` and the tokenizer
files. It is called in-process (torch and transformers are already loaded,
which saves a fresh interpreter's imports) with its console output captured
and shown only on failure. It reads the local directory only; the build runs
with ``HF_HUB_OFFLINE=1`` so nothing can be fetched from a model hub.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from ._errors import LanguageBuildError

__all__ = ["PRECISIONS", "export_genai"]

# precision -> execution providers the builder accepts for it
PRECISIONS: dict[str, tuple[str, ...]] = {
    "int4": ("cpu", "cuda"),
    "int8": ("cpu", "cuda"),
    "fp32": ("cpu", "cuda"),
    "fp16": ("cuda",),
}


def export_genai(hf_dir: Path, out_dir: Path, *, precision: str, provider: str) -> None:
    if provider not in PRECISIONS.get(precision, ()):
        raise ValueError(f"no {precision} export for {provider}: choose from {PRECISIONS}")
    from onnxruntime_genai.models import builder

    cache = out_dir.parent / f".builder-cache-{out_dir.name}"
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), _quiet():
            options = builder.parse_extra_options(
                None, str(hf_dir), str(out_dir), precision, provider, str(cache), []
            )
            builder.create_model(
                None, str(hf_dir), str(out_dir), precision, provider, str(cache), **options
            )
    except Exception as e:
        tail = log.getvalue()[-2000:]
        raise LanguageBuildError(
            f"{precision}/{provider} export of {hf_dir} failed: {e}\n{tail}"
        ) from e
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    missing = [
        f
        for f in ("model.onnx", "genai_config.json", "tokenizer.json")
        if not (out_dir / f).exists()
    ]
    if missing:
        raise LanguageBuildError(f"the builder wrote no {', '.join(missing)} in {out_dir}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The quantizer logs every node at INFO (and an ERROR for embeddings it leaves unquantized,
    by design) through handlers made before stderr was redirected."""
    names = ("onnxruntime.quantization", "onnxruntime.quantization.matmul_nbits_quantizer")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
