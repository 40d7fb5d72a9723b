"""Make a model file as small as its computation: drop what only tools and humans read.

Why: a device downloads the whole file over a metered link, and for a small
model the bookkeeping outweighs the weights. torch's exporter stamps every
node with provenance (``pkg.torch.onnx.stack_trace`` with the publisher's
local file paths, fx node text, class hierarchies); the quantizer adds long
names (``0.bias_quantized_zero_point``, ``relu_1_DequantizeLinear_Output``)
that appear once per producer and once per consumer. On the demo's edge
model that was over half of the INT8 file.

What goes, none of which changes what the model computes:

- doc strings and ``metadata_props`` on nodes, graphs, tensors, value infos
  and functions; model-level ``metadata_props`` that tools stamp (keys
  starting with ``onnx.`` or ``pkg.``), while the publisher's own keys stay;
- ``value_info`` (intermediate shape annotations ONNX Runtime re-infers);
- initializers no node uses;
- names: node names (optional in ONNX), and every tensor name longer than
  two characters that is not a graph input or output becomes ``t0, t1, …``
  in graph order. Graph order makes the names the same for two versions of
  one architecture, which keeps deltas between versions small.

Renaming is skipped for graphs with subgraphs (If/Loop/Scan bodies refer to
outer names), sparse initializers or quantization annotations: rare in edge
models, and not worth a riskier rewrite.
"""

from __future__ import annotations

from typing import Any

__all__ = ["shrink_model"]

_TOOL_METADATA_PREFIXES = ("onnx.", "pkg.")


def shrink_model(model: Any) -> Any:
    """A copy of ``model`` (an ``onnx.ModelProto``) without what inference does not read."""
    import onnx

    shrunk = onnx.ModelProto()
    shrunk.CopyFrom(model)
    kept = [
        (p.key, p.value)
        for p in shrunk.metadata_props
        if not p.key.startswith(_TOOL_METADATA_PREFIXES)
    ]
    del shrunk.metadata_props[:]
    for key, value in kept:
        shrunk.metadata_props.add(key=key, value=value)
    shrunk.ClearField("doc_string")  # ONNX fields are proto2: "" would still be written
    _strip_graph(shrunk.graph)
    for function in shrunk.functions:
        _strip_annotations(function)
        del function.value_info[:]
        for node in function.node:
            _strip_node(node)
    _drop_unused_initializers(shrunk.graph)
    if _renamable(shrunk.graph):
        _sort_topologically(shrunk.graph)
        _rename(shrunk.graph)
    return shrunk


def _strip_annotations(message: Any) -> None:
    fields = message.DESCRIPTOR.fields_by_name
    for name in ("doc_string", "metadata_props"):
        if name in fields:
            message.ClearField(name)


def _strip_node(node: Any) -> None:
    _strip_annotations(node)
    for attribute in node.attribute:
        attribute.ClearField("doc_string")
        if attribute.HasField("g"):
            _strip_graph(attribute.g)
        for graph in attribute.graphs:
            _strip_graph(graph)


def _strip_graph(graph: Any) -> None:
    _strip_annotations(graph)
    del graph.value_info[:]
    for group in (graph.input, graph.output, graph.initializer):
        for item in group:
            _strip_annotations(item)
    for node in graph.node:
        _strip_node(node)


def _drop_unused_initializers(graph: Any) -> None:
    used = {name for node in graph.node for name in node.input}
    used.update(t.name for t in graph.output)
    used.update(t.name for t in graph.input)
    if any(a.HasField("g") or a.graphs for n in graph.node for a in n.attribute):
        return  # a subgraph may read an outer initializer by name
    kept = [t for t in graph.initializer if t.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _renamable(graph: Any) -> bool:
    has_subgraph = any(a.HasField("g") or a.graphs for n in graph.node for a in n.attribute)
    return not (has_subgraph or graph.sparse_initializer or graph.quantization_annotation)


def _sort_topologically(graph: Any) -> None:
    """Producers before consumers, otherwise in the given order (converters append nodes).

    The fp16 converter appends its input Casts at the end of the node list;
    ONNX Runtime sorts on load, but the checker and the renaming want order.
    A graph with a cycle or a dangling input is left as it is.
    """
    available = {t.name for t in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[Any] = []
    while pending:
        ready = [n for n in pending if all(x in available for x in n.input)]
        if not ready:
            return
        for node in ready:
            available.update(node.output)
        ordered.extend(ready)
        pending = [n for n in pending if all(n is not r for r in ready)]
    if [id(n) for n in ordered] != [id(n) for n in graph.node]:
        copies = [type(n)() for n in ordered]
        for copy, node in zip(copies, ordered, strict=True):
            copy.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(copies)


def _rename(graph: Any) -> None:
    protected = {t.name for t in graph.input} | {t.name for t in graph.output} | {""}
    taken = {x for node in graph.node for x in (*node.input, *node.output)}
    taken.update(t.name for t in graph.initializer)
    names: dict[str, str] = {}
    counter = 0

    def short(name: str) -> str:
        nonlocal counter
        if name in protected or len(name) <= 2:  # already as short as a new name
            return name
        if name not in names:
            while f"t{counter}" in taken:
                counter += 1
            names[name] = f"t{counter}"
            counter += 1
        return names[name]

    for node in graph.node:
        node.ClearField("name")  # optional in ONNX; runtimes name nodes when they need to
        inputs = [short(x) for x in node.input]
        outputs = [short(x) for x in node.output]
        del node.input[:], node.output[:]
        node.input.extend(inputs)
        node.output.extend(outputs)
    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
