"""Turn the ViT of a Hugging Face ``Dinov2Model`` exported to ONNX back into a state dict.

The legacy ``torch.onnx`` exporter keeps the names of biases, norms, layer scales and the
embeddings (``backbone.encoder.layer.3.norm1.weight``) but gives every Linear weight an
anonymous name (``onnx::MatMul_1966``) and stores it transposed, as the MatMul uses it.
Those weights are found through the node that multiplies by them, whose name is the
module path (``/backbone/encoder/layer.3/attention/attention/query/MatMul``); their order
in the file (key, value, query) is not the module order, so matching them by position
would swap the projections. The position embedding is split in two anonymous tensors (the
CLS row and the patch grid), found through the nodes that resample and re-join them.

Reading the graph needs the ``onnx`` package (``pip install "napari-attnreg[validation]"``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: where the exporter put the module whose weights we read (``model.backbone``)
PREFIX = "backbone"
_MATMUL = re.compile(rf"^/{PREFIX}/(encoder/layer\.\d+/[\w/.]+)/MatMul$")


class ConversionError(ValueError):
    """The ONNX graph is not the DINOv2 export this converter reads; the message says how."""


@dataclass(frozen=True)
class Converted:
    """A converted backbone: ``Dinov2Config`` keyword values and the float32 state dict."""

    config: dict[str, Any]
    state: dict[str, np.ndarray]


def require_onnx():
    """The ``onnx`` package, or an ImportError saying how to get it."""
    try:
        import onnx
    except ImportError as err:
        raise ImportError("Converting the test article needs the onnx package: pip install "
                          "\"napari-attnreg[validation]\" (or pip install onnx).") from err
    return onnx


def _nodes(graph) -> dict[str, Any]:
    return {node.name: node for node in graph.node}


def _constant(nodes: dict[str, Any], name: str) -> np.ndarray:
    """The value of the Constant node ``name``."""
    from onnx import numpy_helper

    node = nodes.get(name)
    if node is None or node.op_type != "Constant":
        raise ConversionError(f"the graph has no Constant node {name!r}: not a DINOv2 export")
    return numpy_helper.to_array(node.attribute[0].t).reshape(-1)


def _producer(graph, output: str):
    for node in graph.node:
        if output in node.output:
            return node
    raise ConversionError(f"no node of the graph computes {output!r}")


def _linear_weights(graph, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every anonymous MatMul weight under the module path of the node that uses it."""
    state = {}
    for node in graph.node:
        match = _MATMUL.match(node.name)
        if node.op_type != "MatMul" or match is None or node.input[1] not in arrays:
            continue
        key = match.group(1).replace("/", ".") + ".weight"
        # ONNX multiplies x @ W; torch's Linear stores W as (out, in) and computes x @ W.T
        state[key] = np.ascontiguousarray(arrays[node.input[1]].T)
    return state


def _position_embedding(graph, nodes: dict[str, Any],
                        arrays: dict[str, np.ndarray]) -> np.ndarray:
    """(1, 1 + g², width): the CLS row and the g×g patch grid the model resamples."""
    joined = nodes.get(f"/{PREFIX}/embeddings/Concat_6")
    grid = nodes.get(f"/{PREFIX}/embeddings/Reshape_1")
    if joined is None or grid is None or joined.input[0] not in arrays \
            or grid.input[0] not in arrays:
        raise ConversionError("the position embedding's nodes (/backbone/embeddings/Concat_6, "
                              "Reshape_1) are missing: not a DINOv2 export")
    cls_row, patches = arrays[joined.input[0]], arrays[grid.input[0]]
    return np.concatenate([cls_row.reshape(1, 1, -1), patches.reshape(1, -1, cls_row.size)], 1)


def _config(graph, nodes: dict[str, Any], state: dict[str, np.ndarray]) -> dict[str, Any]:
    """``Dinov2Config`` values read from the tensors and constants of the graph."""
    width = state["embeddings.cls_token"].shape[-1]
    patch = state["embeddings.patch_embeddings.projection.weight"].shape[-1]
    depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    # the key is reshaped to (batch, tokens, heads, head width) by a Concat of constants
    split = nodes[f"/{PREFIX}/encoder/layer.0/attention/attention/Concat"]
    heads = int(_constant(nodes, _producer(graph, split.input[2]).name)[0])
    grid = math.isqrt(state["embeddings.position_embeddings"].shape[1] - 1)
    hidden = state["encoder.layer.0.mlp.fc1.weight"].shape[0]
    # the graph holds float32 1e-6; the config says the decimal value it was written from
    eps = float(f"{float(_constant(nodes, f'/{PREFIX}/layernorm/Constant_1')[0]):.6g}")
    tokens = _producer(graph, nodes[f"/{PREFIX}/embeddings/Add"].input[0])
    if len(tokens.input) != 2:  # CLS + patches; registers would be a third part
        raise ConversionError("the token sequence has more parts than CLS and patches "
                              "(registers?): this converter reads plain Dinov2Model exports")
    if width % heads or hidden % width or grid * grid + 1 != \
            state["embeddings.position_embeddings"].shape[1]:
        raise ConversionError(f"inconsistent shapes: width {width}, {heads} heads, MLP {hidden}, "
                              f"{state['embeddings.position_embeddings'].shape[1]} positions")
    return {"hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": heads,
            "mlp_ratio": hidden // width, "patch_size": patch, "image_size": grid * patch,
            "num_channels": state["embeddings.patch_embeddings.projection.weight"].shape[1],
            "layer_norm_eps": eps, "hidden_act": "gelu", "qkv_bias": True,
            "use_swiglu_ffn": False, "layerscale_value": 1.0}


def convert_onnx(data: bytes) -> Converted:
    """The backbone of a serialized ``model.backbone = Dinov2Model`` ONNX export.

    Parameters
    ----------
    data : bytes
        The ``.onnx`` file's contents.

    Returns
    -------
    Converted
        Config values and a state dict under the export's checkpoint names (see
        :func:`save_pretrained`). The mask token (used only in masked-image training, not in an
        inference export) is zero.
    """
    onnx = require_onnx()
    from onnx import numpy_helper

    graph = onnx.load_model_from_string(data).graph
    arrays = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
    nodes = _nodes(graph)
    head = PREFIX + "."
    state = {k.removeprefix(head): v for k, v in arrays.items() if k.startswith(head)}
    state.update(_linear_weights(graph, arrays))
    state["embeddings.position_embeddings"] = _position_embedding(graph, nodes, arrays)
    state["embeddings.mask_token"] = np.zeros_like(state["embeddings.cls_token"]).reshape(1, -1)
    return Converted(_config(graph, nodes, state), state)


def save_pretrained(converted: Converted, folder: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` as ``save_pretrained`` would, and check
    that ``Dinov2Model.from_pretrained`` finds every tensor it needs and no other.

    The tensors keep the checkpoint names of the export (``attention.attention.query``), the
    names DINOv2 checkpoints on the hub use; each transformers version maps them onto its
    own module layout when loading (version 5 calls them ``attention.q_proj``).
    """
    from safetensors.numpy import save_file
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(**converted.config)
    config.architectures = ["Dinov2Model"]
    config.save_pretrained(str(folder))
    save_file(converted.state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    _, info = Dinov2Model.from_pretrained(str(folder), output_loading_info=True)
    problems = {k: v for k, v in info.items() if k != "error_msgs" and v} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    if problems:
        raise ConversionError(f"the converted tensors do not fit Dinov2Model: {problems}")
