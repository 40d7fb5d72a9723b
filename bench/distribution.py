"""(e) Model distribution: what a device downloads per update, how fast blobs go out, rollouts.

* Bytes per update (here): the demo's edge model goes through the real
  publish pipeline (``publish_model`` into a temporary ``LocalBlobStore`` and
  SQLite registry, signed with a generated key) as version 1. Version 2 is
  the same model fine-tuned with torch on the CPU (a few hundred AdamW steps
  on the same training split; all layers, or the classifier head only), its
  weights written back into version 1's ONNX graph, as a re-export would
  give; it is published on top of version 1, which gets it a delta (the
  smaller of a zstd patch and a zstd byte-wise difference) when that is
  smaller than the blob. Every size is a manifest's: what a device
  downloads. Three seeds each.
* Blob throughput (``_blob_serving``): ``tandem cdn serve`` against nginx on
  the same file.
* Fleet rollout (``_fleet_rollout``): 1,000 simulated devices on a real
  Mosquitto take version 2 from ``tandem cdn serve`` in three waves; the
  registry and store are the ones published here (version 1 and the first
  all-layers version 2).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._blob_serving import blob_serving, plot_throughput, pyplot, spread, target, throughput_section
from ._fleet_rollout import fleet_rollout, rollout_section
from ._report import RESULTS_DIR

if TYPE_CHECKING:
    import torch

    from shared import SigningKey
    from tandem.demo.data import DigitSplits

__all__ = ["run"]

TARGET_BLOB_SHARE = 0.30  # INT8 + zstd against the float ONNX file
TARGET_DELTA_SHARE = 0.50  # a delta against the full compressed blob
_MODEL = "mnist-edge"
_FINE_TUNE = {"steps": 300, "batch": 64, "lr": 5e-4, "weight_decay": 1e-4}
_SEEDS = (1, 2, 3)
_PLOT_BYTES = "distribution_bytes_per_update.png"
_PLOT_THROUGHPUT = "distribution_blob_throughput.png"


def run() -> dict[str, Any]:
    from shared import SigningKey

    key = SigningKey.generate()
    with tempfile.TemporaryDirectory(prefix="tandem-bench-dist-") as tmp:
        published = Path(tmp) / "publish"
        sizes = _update_sizes(published, key)
        throughput = blob_serving(Path(tmp) / "serve")
        rollout = fleet_rollout(
            Path(tmp) / "rollout",
            registry=published / f"v2-all-{_SEEDS[0]}.db",
            store=published / "blobs",
            key=key,
            model=_MODEL,
        )
    _plot_sizes(sizes, RESULTS_DIR / _PLOT_BYTES)
    if "skipped" not in throughput:
        plot_throughput(throughput, RESULTS_DIR / _PLOT_THROUGHPUT)
    return _result(sizes, throughput, rollout)


# --------------------------------------------------------------------------- bytes per update


def _update_sizes(work: Path, key: SigningKey) -> dict[str, Any]:
    from model_cdn.publish import publish_model
    from model_cdn.registry import SqliteRegistry, dump_document
    from shared import compress_blob, decompress_blob, encode_sample, make_delta
    from shared.server.store import LocalBlobStore
    from tandem.demo.data import load_digit_splits
    from tandem.demo.models import build_demo_models

    models = build_demo_models()
    recipe = models.report.get("recipe", {})
    splits = load_digit_splits(
        train=recipe.get("train_size", 3000),
        calibration=recipe.get("calibration_size", 500),
        test=recipe.get("test_size", 1500),
        seed=recipe.get("split_seed", 0),
    )
    float_raw = models.edge_float_onnx.read_bytes()
    store = LocalBlobStore(work / "blobs")  # content-addressed: every version shares it
    options: dict[str, Any] = {
        "name": _MODEL,
        "store": store,
        "signing_key": key,
        "calibration": np.array(splits.calibration_images),
        "validation": (np.array(splits.test_images), np.array(splits.test_labels)),
    }
    base_db = work / "v1.db"
    registry = SqliteRegistry(base_db)
    try:
        started = time.perf_counter()
        v1 = publish_model(float_raw, registry=registry, **options)
        publish_s = time.perf_counter() - started
    finally:
        registry.close()
    blob1 = v1.manifest.blob
    v1_raw = decompress_blob(store.get(blob1.digest), blob1.raw_size)

    runs = []
    for head_only in (False, True):
        for seed in _SEEDS:
            started = time.perf_counter()
            net, names = _torch_from_onnx(float_raw)
            accuracy_before = _torch_accuracy(net, splits)
            _fine_tune(net, splits, head_only=head_only, seed=seed)
            tune_s = time.perf_counter() - started
            v2_float = _with_weights(float_raw, net, names)
            db = work / f"v2-{'head' if head_only else 'all'}-{seed}.db"
            shutil.copyfile(base_db, db)  # v1 published, closed: the WAL is checkpointed
            registry = SqliteRegistry(db, create=False)
            try:
                v2 = publish_model(v2_float, registry=registry, **options)
            finally:
                registry.close()
            blob2 = v2.manifest.blob
            v2_raw = decompress_blob(store.get(blob2.digest), blob2.raw_size)
            delta = v2.manifest.deltas[0] if v2.manifest.deltas else None
            runs.append(
                {
                    "scope": "classifier head" if head_only else "all layers",
                    "seed": seed,
                    "fine_tune_s": round(tune_s, 2),
                    "float_accuracy_before": accuracy_before,
                    "float_accuracy_after": _torch_accuracy(net, splits),
                    "int8_accuracy": v2.report.get("accuracy"),
                    "int8_agreement_with_float": v2.report.get("agreement"),
                    "float_bytes": len(v2_float),
                    "int8_bytes": blob2.raw_size,
                    "blob_bytes": blob2.size,
                    "delta_bytes": delta.size if delta else None,
                    "delta_method": delta.compression if delta else None,
                    # both methods, whichever the publisher kept
                    "patch_bytes": len(make_delta(v1_raw, v2_raw, method="zstd-patch")),
                    "bytediff_bytes": len(make_delta(v1_raw, v2_raw, method="zstd-bytediff")),
                    "manifest_bytes": len(dump_document(v2.signed).encode()),
                    "int8_bytes_changed": _bytes_changed(v1_raw, v2_raw),
                }
            )
    smoke = v1.signed["signed"].get("smoke_test") or {}
    inputs, outputs, atol = v1.manifest.smoke_samples()  # and as plain base64, as before:
    plain = {"inputs": {k: encode_sample(v) for k, v in inputs.items()}, "atol": atol}
    plain["outputs"] = {k: encode_sample(v) for k, v in outputs.items()}
    return {
        "float_bytes": len(float_raw),
        "float_zstd_bytes": len(compress_blob(float_raw)),
        "int8_bytes": blob1.raw_size,
        "blob_bytes": blob1.size,
        "manifest_bytes": len(dump_document(v1.signed).encode()),
        "smoke_test_bytes": _json_bytes(smoke),  # of the manifest, the smoke test's JSON
        "smoke_test_plain_bytes": _json_bytes(plain),
        "smoke_samples": len(next(iter(inputs.values()))),
        "v1_int8_accuracy": v1.report.get("accuracy"),
        "v1_publish_s": round(publish_s, 2),
        "fine_tune": dict(_FINE_TUNE),
        "runs": runs,
    }


def _json_bytes(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def _torch_from_onnx(raw: bytes) -> tuple[torch.nn.Sequential, dict[str, str]]:
    """The demo edge graph (Conv/Relu/Reshape/Gemm) as a torch module with its weights.

    Returns the module and, for each of its state-dict keys, the ONNX
    initializer it came from, so fine-tuned weights go back where they were.
    """
    import onnx
    import torch
    from onnx import numpy_helper

    graph = onnx.load_model_from_string(raw).graph
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    layers: OrderedDict[str, torch.nn.Module] = OrderedDict()
    names: dict[str, str] = {}
    for i, node in enumerate(graph.node):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        key = f"layer{i}"
        if node.op_type == "Conv" and attrs.get("group", 1) == 1 and len(node.input) == 3:
            w = weights[node.input[1]]
            pads = list(attrs.get("pads", [0] * 4))
            if pads[: len(pads) // 2] != pads[len(pads) // 2 :]:
                raise RuntimeError("asymmetric Conv padding is not supported here")
            layer: torch.nn.Conv2d | torch.nn.Linear = torch.nn.Conv2d(
                w.shape[1],
                w.shape[0],
                tuple(attrs["kernel_shape"]),
                stride=tuple(attrs.get("strides", [1, 1])),
                padding=tuple(pads[:2]),
                dilation=tuple(attrs.get("dilations", [1, 1])),
            )
        elif node.op_type == "Gemm" and attrs.get("transA", 0) == 0 and len(node.input) == 3:
            w = weights[node.input[1]]
            w = w if attrs.get("transB", 0) else w.T
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
                raise RuntimeError("Gemm with alpha/beta other than 1 is not supported here")
            layer = torch.nn.Linear(w.shape[1], w.shape[0])
        elif node.op_type == "Relu":
            layers[key] = torch.nn.ReLU()
            continue
        elif node.op_type in ("Reshape", "Flatten"):
            layers[key] = torch.nn.Flatten()
            continue
        else:
            raise RuntimeError(
                f"the edge graph has a {node.op_type} node; this bench maps only "
                "Conv, Relu, Reshape/Flatten and Gemm to torch"
            )
        assert layer.bias is not None
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(np.array(w)))
            layer.bias.copy_(torch.from_numpy(np.array(weights[node.input[2]])))
        layers[key] = layer
        names[f"{key}.weight"], names[f"{key}.bias"] = node.input[1], node.input[2]
    return torch.nn.Sequential(layers), names


def _fine_tune(
    net: torch.nn.Sequential, splits: DigitSplits, *, head_only: bool, seed: int
) -> None:
    """A short AdamW fine-tune on random training batches, on one CPU thread."""
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny net: more threads only fight over a shared box
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = [m for m in net if isinstance(m, torch.nn.Linear)][-1]
            params = list(head.parameters()) if head_only else list(net.parameters())
            optimizer = torch.optim.AdamW(
                params, lr=_FINE_TUNE["lr"], weight_decay=_FINE_TUNE["weight_decay"]
            )
            images = torch.from_numpy(np.array(splits.train_images))
            labels = torch.from_numpy(np.array(splits.train_labels))
            net.train()
            for _ in range(int(_FINE_TUNE["steps"])):
                index = torch.randint(0, len(labels), (int(_FINE_TUNE["batch"]),))
                loss = F.cross_entropy(net(images[index]), labels[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            net.eval()
    finally:
        torch.set_num_threads(threads)


def _torch_accuracy(net: torch.nn.Sequential, splits: DigitSplits) -> float:
    import torch

    with torch.no_grad():
        logits = net(torch.from_numpy(np.array(splits.test_images)))
    return round(float((logits.argmax(1).numpy() == splits.test_labels).mean()), 4)


def _with_weights(raw: bytes, net: torch.nn.Sequential, names: dict[str, str]) -> bytes:
    """Version 1's ONNX graph with ``net``'s weights in place of its own."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(raw)
    state = {names[k]: v.detach().numpy() for k, v in net.state_dict().items() if k in names}
    for tensor in model.graph.initializer:
        if tensor.name in state:
            array = state[tensor.name]
            if numpy_helper.to_array(tensor).shape != array.shape:  # a Gemm with transB=0
                array = array.T
            tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), tensor.name))
    return bytes(model.SerializeToString())


def _bytes_changed(old: bytes, new: bytes) -> int | None:
    if len(old) != len(new):
        return None
    return int((np.frombuffer(old, np.uint8) != np.frombuffer(new, np.uint8)).sum())


# --------------------------------------------------------------------------- plot and result


def _plot_sizes(sizes: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    bars: list[tuple[str, float, tuple[float, float] | None, str]] = [
        (label, value, None, color)
        for label, value, color in (
            ("float ONNX", sizes["float_bytes"], "tab:grey"),
            ("float ONNX + zstd", sizes["float_zstd_bytes"], "silver"),
            ("INT8 ONNX", sizes["int8_bytes"], "tab:blue"),
            ("INT8 + zstd (published blob)", sizes["blob_bytes"], "tab:blue"),
        )
    ]
    for scope in _scopes(sizes):
        for label, field, color in (
            ("zstd-patch delta*", "patch_bytes", "yellowgreen"),
            ("published delta", "delta_bytes", "tab:green"),
        ):
            if values := _values(sizes, scope, field):
                mid = statistics.median(values)
                bars.append(
                    (f"{label}, {scope}", mid, (mid - min(values), max(values) - mid), color)
                )
    plain = sizes["manifest_bytes"] - sizes["smoke_test_bytes"] + sizes["smoke_test_plain_bytes"]
    bars += [
        ("signed manifest, plain samples*", plain, None, "navajowhite"),
        ("signed manifest", sizes["manifest_bytes"], None, "tab:orange"),
    ]
    fig, ax = plt.subplots(figsize=(8.0, 4.8), dpi=120)
    y = np.arange(len(bars))[::-1]
    ax.barh(y, [b[1] / 1e3 for b in bars], color=[b[3] for b in bars])
    for yi, (_, value, whisker, _) in zip(y, bars, strict=True):
        if whisker is not None:
            xerr = [[whisker[0] / 1e3], [whisker[1] / 1e3]]
            ax.errorbar(value / 1e3, yi, xerr=xerr, fmt="none", ecolor="black", capsize=3)
        share = value / sizes["float_bytes"]
        ax.text(value / 1e3, yi, f"  {value / 1e3:.1f} KB ({share:.0%})", va="center", fontsize=8)
    for x, color, label in (
        (sizes["float_bytes"] * TARGET_BLOB_SHARE, "tab:red", "blob target (30% of float)"),
        (sizes["blob_bytes"] * TARGET_DELTA_SHARE, "tab:green", "delta target (50% of blob)"),
    ):
        ax.axvline(x / 1e3, color=color, linestyle=":", linewidth=1, label=label)
    ax.set_yticks(y, [b[0] for b in bars], fontsize=8)
    ax.set_xlabel("KB a device downloads (deltas: median of seeds, whiskers min to max)")
    ax.set_xlim(0, sizes["float_bytes"] / 1e3 * 1.3)
    ax.set_title("Demo edge model, bytes per update (* what the pipeline did before)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _scopes(sizes: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["scope"] for r in sizes["runs"]))


def _values(sizes: dict[str, Any], scope: str, field: str) -> list[float]:
    return [r[field] for r in sizes["runs"] if r["scope"] == scope and r[field] is not None]


def _median(rows: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def _row(what: str, value: float, sizes: dict[str, Any], of_blob: bool = True) -> list[str]:
    return [
        what,
        f"{value:,.0f}",
        f"{value / sizes['float_bytes']:.1%}",
        f"{value / sizes['blob_bytes']:.0%}" if of_blob else "—",
    ]


def _size_section(sizes: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    float_b, blob_b = sizes["float_bytes"], sizes["blob_bytes"]
    share = blob_b / float_b
    targets = [
        target(
            "published blob (INT8 + zstd) against the float ONNX file",
            f"<= {TARGET_BLOB_SHARE:.0%}",
            f"{share:.1%} ({blob_b:,} of {float_b:,} B)",
            share <= TARGET_BLOB_SHARE,
            "the INT8 file itself: its weights are one byte each already",
        )
    ]
    rows = [
        _row("float ONNX (as exported)", float_b, sizes, False),
        _row("float ONNX + zstd", sizes["float_zstd_bytes"], sizes, False),
        _row("INT8 ONNX (static QDQ, shrunk)", sizes["int8_bytes"], sizes, False),
        _row("INT8 + zstd (the published blob, v1)", blob_b, sizes),
    ]
    for scope in _scopes(sizes):
        runs = [r for r in sizes["runs"] if r["scope"] == scope]
        # No delta published means the device downloads the full blob: a ratio of 1.
        ratios = [(r["delta_bytes"] or r["blob_bytes"]) / r["blob_bytes"] for r in runs]
        patch = [r["patch_bytes"] / r["blob_bytes"] for r in runs]
        methods = sorted({r["delta_method"] or "none (full blob)" for r in runs})
        targets.append(
            target(
                f"delta v1 -> v2 against v2's full blob, {scope} fine-tuned (median of {len(runs)} "
                "seeds)",
                f"<= {TARGET_DELTA_SHARE:.0%}",
                f"{statistics.median(ratios):.0%} (range {spread(ratios)}; "
                f"{statistics.median(r['delta_bytes'] or r['blob_bytes'] for r in runs):,.0f} of "
                f"{_median(runs, 'blob_bytes'):,.0f} B; {', '.join(methods)}; the zstd-patch "
                f"delta alone: {statistics.median(patch):.0%})",
                statistics.median(ratios) <= TARGET_DELTA_SHARE,
                "how much the fine-tune moved: it changed "
                f"{_median(runs, 'int8_bytes_changed'):,.0f} of the {runs[0]['int8_bytes']:,} "
                "INT8 bytes, scattered, and a byte-wise difference of small steps compresses "
                "only so far",
            )
        )
        for label, field in (
            ("delta v1 -> v2, zstd-patch (before)", "patch_bytes"),
            ("delta v1 -> v2, zstd-bytediff", "bytediff_bytes"),
            ("delta v1 -> v2 as published (the smaller)", "delta_bytes"),
        ):
            if values := _values(sizes, scope, field):
                row = _row(f"{label}, {scope} fine-tuned", statistics.median(values), sizes)
                row[1] += f" ({spread(values, '{:,.0f}')})"
                rows.append(row)
    manifest, smoke, plain = (
        sizes["manifest_bytes"],
        sizes["smoke_test_bytes"],
        sizes["smoke_test_plain_bytes"],
    )
    rows += [
        _row(
            f"signed manifest with plain base64 samples (before; {plain:,} B of it the smoke test)",
            manifest - smoke + plain,
            sizes,
        ),
        _row(
            f"signed manifest, fetched with every update ({smoke:,} B of it the smoke test, "
            f"{sizes['smoke_samples']} samples, zstd)",
            manifest,
            sizes,
        ),
    ]
    if runs := [r for r in sizes["runs"] if r["scope"] == "all layers"]:
        total = _median(runs, "manifest_bytes") + statistics.median(
            r["delta_bytes"] or r["blob_bytes"] for r in runs
        )
        rows.append(
            _row("an update in all, all layers fine-tuned (manifest + delta)", total, sizes)
        )
    per_run = [
        [
            r["scope"],
            r["seed"],
            f"{r['float_accuracy_before']:.1%} -> {r['float_accuracy_after']:.1%}",
            "n/a" if r["int8_accuracy"] is None else f"{r['int8_accuracy']:.1%}",
            "n/a"
            if r["int8_bytes_changed"] is None
            else f"{r['int8_bytes_changed']:,} / {r['int8_bytes']:,}",
            f"{r['blob_bytes']:,}",
            f"{r['patch_bytes']:,}",
            f"{r['bytediff_bytes']:,}",
            f"{r['delta_bytes']:,} ({r['delta_method']})" if r["delta_bytes"] else "none",
            f"{(r['delta_bytes'] or r['blob_bytes']) / r['blob_bytes']:.0%}",
            f"{r['fine_tune_s']:.1f}",
        ]
        for r in sizes["runs"]
    ]
    tune = sizes["fine_tune"]
    tables = [
        {
            "title": "Bytes a device downloads for the demo edge model (deltas: median of seeds, "
            "range in brackets)",
            "columns": ["what", "bytes", "of float ONNX", "of the full blob"],
            "rows": rows,
        },
        {
            "title": f"Version 2 per fine-tune ({tune['steps']} AdamW steps, batch "
            f"{tune['batch']}, lr {tune['lr']}, random batches of the demo's training split, "
            "one CPU thread)",
            "columns": [
                "fine-tuned",
                "seed",
                "float accuracy",
                "INT8 accuracy",
                "INT8 bytes changed",
                "blob B",
                "zstd-patch B",
                "zstd-bytediff B",
                "published delta B",
                "delta / blob",
                "fine-tune s",
            ],
            "rows": per_run,
        },
    ]
    return targets, tables


def _result(
    sizes: dict[str, Any], throughput: dict[str, Any], rollout: dict[str, Any]
) -> dict[str, Any]:
    targets, tables = _size_section(sizes)
    plots = [_PLOT_BYTES] if "skipped" in throughput else [_PLOT_BYTES, _PLOT_THROUGHPUT]
    smoke, plain = sizes["smoke_test_bytes"], sizes["smoke_test_plain_bytes"]
    notes = [
        "Sizes are the manifests' (blob and delta sizes) from real `publish_model` runs into a "
        "temporary LocalBlobStore and SQLite registry, signed with a generated key; version 1's "
        f"INT8 model scores {sizes['v1_int8_accuracy']:.1%} on the test split.",
        "Version 2's float weights are written back into version 1's ONNX graph, as a re-export "
        "of the original torch module would give (the pipeline strips names and metadata). A "
        "re-export of the module this bench rebuilds from the ONNX file (its layers are named "
        "differently) gave deltas 5-6% larger.",
        "The publisher makes both delta methods and keeps the smaller: `zstd-patch` (zstd with "
        "v1 as its dictionary: reuses runs of equal bytes) and `zstd-bytediff` (zstd of v2 - v1 "
        "byte by byte, mod 256: a fine-tune moves most touched INT8 weights by a step or two, "
        "so the difference is mostly 0x00, 0x01 and 0xff). Devices apply either, bounded by the "
        "signed raw size and checked against the signed raw digest.",
        f"The smoke test's samples are stored zstd-compressed (then base64): {smoke:,} B of "
        f"JSON for {sizes['smoke_samples']} input images and their outputs instead of "
        f"{plain:,} B, and the signed manifest a device fetches with every update is "
        f"{sizes['manifest_bytes']:,} B.",
    ]
    for more_targets, more_tables, more_notes in (
        throughput_section(throughput),
        rollout_section(rollout, target),
    ):
        targets += more_targets
        tables += more_tables
        notes += more_notes
    delta = statistics.median(_values(sizes, "all layers", "delta_bytes") or [0])
    summary = (
        f"The demo edge model's published blob is {sizes['blob_bytes']:,} B against "
        f"{sizes['float_bytes']:,} B of float ONNX "
        f"({sizes['blob_bytes'] / sizes['float_bytes']:.1%}); "
        f"a fine-tuned version 2 ships as a {delta:,.0f} B delta (all layers fine-tuned, median "
        f"of seeds) plus its {sizes['manifest_bytes']:,} B signed manifest."
    )
    if "skipped" not in throughput:
        one = throughput["rounds"]
        summary += (
            f" `tandem cdn serve` sends a {throughput['blob_bytes'] / 2**20:.0f} MiB blob to one "
            f"client at {statistics.median(r['cdn']['1']['mb_s'] for r in one):,.0f} MB/s, "
            f"nginx at {statistics.median(r['nginx']['1']['mb_s'] for r in one):,.0f} MB/s."
        )
    if "skipped" not in rollout:
        summary += (
            f" A {rollout['devices']:,}-device simulated fleet takes a three-wave rollout in "
            f"{rollout['seconds']:.1f} s."
        )
    return {
        "title": "(e) Model distribution",
        "summary": summary,
        "targets": targets,
        "tables": tables,
        "plots": plots,
        "notes": notes,
        "data": {"sizes": sizes, "throughput": throughput, "rollout": rollout},
    }
