"""Derive an ONNX graph of a sentence-transformers BERT model (all-MiniLM-L6-v2) from the shipped
model.safetensors + config.json, with no torch: the encoder (self-attention as ONNX Runtime's com.microsoft.Attention op), mean pooling over the attention mask
and L2 normalisation in one graph (inputs input_ids, attention_mask: int64 [batch, tokens];
output sentence_embedding: float [batch, hidden]). The same input files give the same bytes (the
graph is written node by node here, the producer fields pinned), so the result is checked by
sha256 (the stack tool, services/stack, which runs it for `make run`/`make test`, and tests/embed_bench/run.sh).

    python minilm_onnx.py <model_dir> <out.onnx>
"""
import json
import struct
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(data[start:end], dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


def build(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    w = load_safetensors(f"{model_dir}/model.safetensors")
    # Some exports prefix the weights with the architecture's name.
    w = {k.removeprefix("bert."): v for k, v in w.items()}
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head = hidden // heads
    eps = cfg["layer_norm_eps"]
    assert cfg.get("hidden_act", "gelu") == "gelu", "only the erf GELU is derived"

    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, prefix, name):
        wt = init(f"{prefix}.weight_t", w[f"{prefix}.weight"].T)
        b = init(f"{prefix}.bias", w[f"{prefix}.bias"])
        return node("Add", [node("MatMul", [x, wt], f"{name}_mm"), b], name)

    def layer_norm(x, prefix, name):
        return node(
            "LayerNormalization",
            [x, init(f"{prefix}.weight", w[f"{prefix}.weight"]), init(f"{prefix}.bias", w[f"{prefix}.bias"])],
            name, axis=-1, epsilon=eps,
        )

    init("c_one_f", np.array(1.0, np.float32))
    init("c_half", np.array(0.5, np.float32))
    init("c_sqrt2", np.array(np.sqrt(2.0), np.float32))
    init("c_idx1", np.array([1], np.int64))
    init("c_start0", np.array([0], np.int64))
    init("c_ax2", np.array([2], np.int64))
    init("c_ax1", np.array([1], np.int64))
    init("c_tiny", np.array(1e-9, np.float32))
    init("c_norm_eps", np.array(1e-12, np.float32))

    # Embeddings: word + position + token type 0 (single sentences), then LayerNorm.
    words = node("Gather", [init("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"], "words")
    # The first `tokens` rows of the position table (a Slice, not Gather(Range): one op, no copy).
    length = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), "c_idx1"], "len")
    pos_table = init("position_embeddings", w["embeddings.position_embeddings.weight"])
    pos = node("Slice", [pos_table, "c_start0", length, "c_start0"], "pos")
    type0 = init("token_type_0", w["embeddings.token_type_embeddings.weight"][0])
    emb = node("Add", [node("Add", [words, pos], "emb_wp"), type0], "emb")
    h = layer_norm(emb, "embeddings.LayerNorm", "emb_ln")

    # The padding mask: a float copy for pooling, an int32 one for the Attention op.
    mask_f = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    mask_i32 = node("Cast", ["attention_mask"], "mask_i32", to=TensorProto.INT32)

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        # Self-attention as ONNX Runtime's fused contrib op (one QKV matmul, softmax with the
        # padding mask, per head): the plain-op form ran no faster than PyTorch here.
        qkv_w = np.concatenate([w[f"{p}.attention.self.{n}.weight"].T for n in ("query", "key", "value")], axis=1)
        qkv_b = np.concatenate([w[f"{p}.attention.self.{n}.bias"] for n in ("query", "key", "value")])
        ctx = node("Attention", [h, init(f"{p}.attention.qkv.weight_t", qkv_w), init(f"{p}.attention.qkv.bias", qkv_b), mask_i32],
                   f"l{i}_attn", domain="com.microsoft", num_heads=heads)
        attn = linear(ctx, f"{p}.attention.output.dense", f"l{i}_ao")
        h1 = layer_norm(node("Add", [attn, h], f"l{i}_res1"), f"{p}.attention.output.LayerNorm", f"l{i}_ln1")
        inter = linear(h1, f"{p}.intermediate.dense", f"l{i}_inter")
        # GELU, the erf form BERT uses: x * 0.5 * (1 + erf(x / sqrt(2))).
        erf = node("Erf", [node("Div", [inter, "c_sqrt2"], f"l{i}_gdiv")], f"l{i}_erf")
        gelu = node("Mul", [node("Mul", [inter, node("Add", [erf, "c_one_f"], f"l{i}_g1")], f"l{i}_gm"), "c_half"], f"l{i}_gelu")
        out = linear(gelu, f"{p}.output.dense", f"l{i}_out")
        h = layer_norm(node("Add", [out, h1], f"l{i}_res2"), f"{p}.output.LayerNorm", f"l{i}_ln2")

    # Mean over the real tokens (sentence-transformers clamps the count at 1e-9), then length 1.
    m = node("Unsqueeze", [mask_f, "c_ax2"], "mask_3d")
    summed = node("ReduceSum", [node("Mul", [h, m], "masked"), "c_ax1"], "summed", keepdims=0)
    counted = node("Max", [node("ReduceSum", [m, "c_ax1"], "counted_raw", keepdims=0), "c_tiny"], "counted")
    mean = node("Div", [summed, counted], "mean")
    norm = node("Max", [node("ReduceL2", [mean], "norm_raw", axes=[1], keepdims=1), "c_norm_eps"], "norm")
    nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"], name="sentence_embedding"))

    graph = helper.make_graph(
        nodes, "sentence_embedding",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
                              producer_name="switchboard minilm_onnx.py", producer_version="1")
    model.ir_version = IR_VERSION
    return model


if __name__ == "__main__":
    model = build(sys.argv[1])
    with open(sys.argv[2], "wb") as f:
        f.write(model.SerializeToString())
