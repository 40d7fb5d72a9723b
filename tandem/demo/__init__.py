"""The demos: ``tandem demo`` (digits through a fleet) and ``drift/`` (the learning loop).

``tandem.demo.models`` and ``tandem.demo.data`` are the demo's model pair and data, public
for bench and tests to reuse; ``tandem.demo.language`` is the language-model pair (a device
and a hub model for ONNX Runtime GenAI, trained on text that ships with Python). The
offline sweep (``sweep``, ``accuracy_curve``), its plot and the output folder's writers
are public here for the CLI, bench and tests."""

from ._output import DemoFiles, write_demo_outputs, write_publish_inputs
from ._plot import plot_accuracy_vs_offload
from ._run import (
    BrokerStartError,
    DeliveryError,
    DemoConfig,
    DemoError,
    DemoReport,
    DeviceInstall,
    EdgeDelivery,
    ModeResult,
    run_demo,
)
from ._sweep import accuracy_curve, sweep

__all__ = [
    "BrokerStartError",
    "DeliveryError",
    "DemoConfig",
    "DemoError",
    "DemoFiles",
    "DemoReport",
    "DeviceInstall",
    "EdgeDelivery",
    "ModeResult",
    "accuracy_curve",
    "plot_accuracy_vs_offload",
    "run_demo",
    "sweep",
    "write_demo_outputs",
    "write_publish_inputs",
]
