"""int8 all-MiniLM-L6-v2, judged against fp32 (issue 42, docs/embedding-runtime.md "int8, done
properly"): derives dynamically quantised graphs from the stack's fp32 graph (ONNX Runtime's
`quantize_dynamic`, int8 per-channel weights, activations quantised per call), each with a
different set of the encoder's GEMMs left in fp32, and measures per graph, one message per
call (as the product embeds), on the bench's texts (duplicates removed):

- messages per CPU-second, one intra-op thread, idle threads not spinning;
- cosine of each vector with fp32's for the same text (min and mean);
- top-10 agreement: for every text as the query, the share of the quantised model's 10
  nearest other texts that are among fp32's 10 nearest (a text tied with fp32's 10th counts).

Needs onnxruntime (1.31.1, the stack's pin), onnx, numpy and tokenizers importable, e.g.
    pip install --target /tmp/ortpy onnxruntime==1.31.1 tokenizers
    PYTHONPATH=/tmp/ortpy:.stack/bin-cache/onnx-tools python3 tests/embed_bench/int8.py \
        --graph .stack/bin-cache/minilm-def92a44c6bd.onnx \
        --tokenizer "$SB_EMBEDDING__MODEL_DIR/tokenizer.json" --texts 6000
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer

LAYERS = range(6)
# Which GEMMs stay fp32 in each variant. `attn` is the fused QKV projection (QAttention when
# quantised), `ao_mm` the attention output, `inter_mm`/`out_mm` the feed-forward's two.
VARIANTS = {
    "all GEMMs int8": [],
    "attention int8, feed-forward fp32": [f"l{i}_{k}" for i in LAYERS for k in ("ao_mm", "inter_mm", "out_mm")],
    "all but the feed-forward's down-projection": [f"l{i}_out_mm" for i in LAYERS],
    "all but the first and last layer": [f"l{i}_{k}" for i in (0, 5) for k in ("attn", "ao_mm", "inter_mm", "out_mm")],
}


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def embed(path, encodings):
    s = session(path)
    feed = lambda e: {
        "input_ids": np.array([e.ids], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask], dtype=np.int64),
    }
    for e in encodings[:20]:
        s.run(None, feed(e))
    start = time.process_time()
    out = np.array([s.run(None, feed(e))[0][0] for e in encodings])
    return out, len(encodings) / (time.process_time() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", required=True, help="the stack's fp32 graph")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--texts", type=int, default=6000, help="texts.py count (before dedup)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    texts = subprocess.run(
        [sys.executable, os.path.join(here, "texts.py"), str(args.texts)],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()
    texts = list(dict.fromkeys(texts))
    tok = Tokenizer.from_file(args.tokenizer)
    tok.enable_truncation(256)
    tok.no_padding()
    encodings = [tok.encode(t) for t in texts]

    ref, ref_rate = embed(args.graph, encodings)
    sim = ref @ ref.T
    np.fill_diagonal(sim, -9)
    top = np.argsort(-sim, axis=1)[:, :10]
    tenth = np.take_along_axis(sim, top[:, 9:10], 1)
    rows = [{"variant": "fp32 (the default)", "msgs_per_cpu_s": ref_rate, "cosine_min": 1.0,
             "cosine_mean": 1.0, "top10_agreement": 1.0}]
    work = tempfile.mkdtemp()
    for name, keep in VARIANTS.items():
        path = os.path.join(work, "q.onnx")
        quantize_dynamic(
            args.graph, path, weight_type=QuantType.QInt8, per_channel=True, reduce_range=False,
            op_types_to_quantize=["MatMul", "Attention"], nodes_to_exclude=keep,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        v, rate = embed(path, encodings)
        cos = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
        s2 = v @ v.T
        np.fill_diagonal(s2, -9)
        mine = np.argsort(-s2, axis=1)[:, :10]
        agree = float(np.mean((np.take_along_axis(sim, mine, 1) >= tenth - 1e-6).mean(1)))
        rows.append({"variant": name, "msgs_per_cpu_s": rate, "cosine_min": float(cos.min()),
                     "cosine_mean": float(cos.mean()), "top10_agreement": agree})
    print(f"{len(texts)} distinct texts, one per call, 1 thread")
    print("| variant | msgs/CPU-s | vs fp32 | cosine min / mean | top-10 agreement | passes (>= 0.99, >= 0.95) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ok = r["cosine_min"] >= 0.99 and r["top10_agreement"] >= 0.95
        print(f"| {r['variant']} | {r['msgs_per_cpu_s']:.1f} | {r['msgs_per_cpu_s'] / ref_rate:.2f}x "
              f"| {r['cosine_min']:.4f} / {r['cosine_mean']:.4f} | {r['top10_agreement']:.3f} | {'yes' if ok else 'no'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"texts": len(texts), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
