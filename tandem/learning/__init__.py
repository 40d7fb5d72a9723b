"""Refining an edge model on the examples its fleet offloaded: ``tandem models refine``'s library.

``refine_model(RefineSettings(...), target=..., signing_key=...)`` trains,
judges and publishes (see ``tandem.learning._refine``); ``distill`` is the default
trainer (``--trainer tandem.learning:distill``) and ``TrainingData`` what every
trainer is called with; ``torch_from_onnx`` rebuilds a float ONNX chain as a
torch module to fine-tune. Errors: ``RefineError``, and
``RefineRefusedError`` (with ``report``) when the candidate is worse than the
version in service.
"""

from ._distill import DISTILL_OPTIONS, Trainer, TrainingData, distill
from ._errors import RefineError, RefineRefusedError
from ._onnx_torch import OnnxChain, torch_from_onnx
from ._refine import DEFAULT_TRAINER, RefineSettings, refine_model
from ._report import ModelFigures, RefineReport

__all__ = [
    "DEFAULT_TRAINER",
    "DISTILL_OPTIONS",
    "ModelFigures",
    "OnnxChain",
    "RefineError",
    "RefineRefusedError",
    "RefineReport",
    "RefineSettings",
    "Trainer",
    "TrainingData",
    "distill",
    "refine_model",
    "torch_from_onnx",
]
