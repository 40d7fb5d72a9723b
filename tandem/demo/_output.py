"""What ``tandem demo`` leaves in its output folder, written from a ``DemoReport``.

- ``accuracy_vs_offload.png``: the offline sweep's curves and the measured modes;
- ``report.json``: ``DemoReport.to_dict()`` (figures, the CDN delivery, the models);
- ``edge_float.onnx``, ``cloud_float.onnx``, ``calibration.npz``, ``validation.npz``:
  what ``tandem models publish`` needs to publish the demo's models by hand
  (see the README);
- ``train.npz``: the training digits with their labels, what ``tandem models
  refine --replay`` mixes into fine-tuning against forgetting (the README's
  refine example names all of these).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._plot import plot_accuracy_vs_offload
from ._run import DemoReport
from ._sweep import sweep
from .data import load_digit_splits

__all__ = ["DemoFiles", "write_demo_outputs", "write_publish_inputs"]


@dataclass(frozen=True)
class DemoFiles:
    plot: Path
    report: Path


def write_demo_outputs(report: DemoReport, output: Path) -> DemoFiles:
    output.mkdir(parents=True, exist_ok=True)
    curves = sweep(report.edge_logits, report.cloud_logits, report.labels)
    points = [(m.name, m.offload_rate, m.accuracy) for m in report.modes]
    png = plot_accuracy_vs_offload(
        curves, points, output / "accuracy_vs_offload.png", budget=report.budget
    )
    path = output / "report.json"
    path.write_text(json.dumps(report.to_dict(), indent=2, default=str))
    write_publish_inputs(output, report.edge_float_onnx, report.cloud_onnx)
    return DemoFiles(plot=png, report=path)


def write_publish_inputs(output: Path, edge_float: Path, cloud: Path) -> None:
    """The files ``tandem models publish`` and ``refine`` take, from the models and digits."""
    splits = load_digit_splits()
    np.savez(output / "calibration.npz", inputs=splits.calibration_images)
    np.savez(output / "validation.npz", inputs=splits.test_images, labels=splits.test_labels)
    np.savez(output / "train.npz", inputs=splits.train_images, labels=splits.train_labels)
    shutil.copyfile(edge_float, output / "edge_float.onnx")
    shutil.copyfile(cloud, output / "cloud_float.onnx")
