"""The publish pipeline: float model → quantized, validated, compressed, signed, registered.

``publish_model`` does every step (``publish_package`` the same for an ONNX
Runtime GenAI model folder, see ``_package``) (see ``_pipeline``) and hands the release
to a target (``_targets``): ``AdminApiTarget`` (the CDN's admin API) or
``LocalTarget`` (a registry and a store at hand); ``load_samples`` reads
calibration and validation inputs from ``.npy``/``.npz`` files without ever
unpickling. The steps are usable alone: ``export_torch`` (torch module to
ONNX), ``quantize_model`` (ONNX Runtime's INT8 static/dynamic, FP16),
``shrink_model`` (drop what inference does not read) and
``agreement_report`` (quantized vs float on held-out samples).
"""

from ._export import export_torch
from ._package import DEFAULT_SMOKE_PROMPT, PACKAGE_FORMAT, is_package_dir, publish_package
from ._pipeline import PublishResult, publish_model
from ._quantize import METHODS, quantize_model
from ._samples import load_samples
from ._shrink import shrink_model
from ._targets import AdminApiTarget, LatestVersion, LocalTarget, PublishTarget, Release
from ._validate import agreement_report

__all__ = [
    "DEFAULT_SMOKE_PROMPT",
    "METHODS",
    "PACKAGE_FORMAT",
    "AdminApiTarget",
    "LatestVersion",
    "LocalTarget",
    "PublishResult",
    "PublishTarget",
    "Release",
    "agreement_report",
    "export_torch",
    "is_package_dir",
    "load_samples",
    "publish_model",
    "publish_package",
    "quantize_model",
    "shrink_model",
]
