"""Messages/s of all-MiniLM-L6-v2 under PyTorch + sentence-transformers (the peer) and under ONNX
Runtime (the graph minilm_onnx.py derives), on the same texts, batch sizes and thread count, and the
cosine agreement of every vector with sentence-transformers'. Optional: vector files another
runtime wrote (little-endian f32, one row per text, `<prefix>_b<batch>.f32`) are compared too.

    python measure.py --model-dir DIR --onnx minilm.onnx --texts texts.txt --threads 2 \
        --batches 1 16 64 [--other candle=/tmp/candle] [--json out.json]

Both wall time and the process's CPU time are reported: on a shared machine the CPU time
(messages per CPU-second) is the steadier comparison. Run with OMP_WAIT_POLICY=PASSIVE so torch's
idle threads do not spin. Texts are embedded `batch` at a time in their order (as the embedding worker receives them), so
each runtime pads a batch to its longest text and nothing more.
"""
import argparse
import json
import time

import numpy as np


def chunks(texts, n):
    return [texts[i : i + n] for i in range(0, len(texts), n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--onnx", action="append", default=[], help="[label=]graph.onnx, repeatable")
    ap.add_argument("--texts", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=1, help="timed passes per runtime and batch, best kept")
    ap.add_argument("--other", action="append", default=[], help="name=prefix of vectors to compare")
    ap.add_argument("--json")
    ap.add_argument("--no-torch", action="store_true",
                    help="without the peer (torch not installable): the first --onnx is the reference")
    args = ap.parse_args()

    texts = [l.rstrip("\n").replace("\\n", "\n") for l in open(args.texts, encoding="utf-8")]
    runtimes = {}
    if not args.no_torch:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(args.threads)
        st = SentenceTransformer(args.model_dir, device="cpu")

        def st_embed(texts, batch):
            out = []
            for c in chunks(texts, batch):
                out.append(st.encode(c, batch_size=batch, convert_to_numpy=True, normalize_embeddings=True))
            return np.concatenate(out)

        runtimes["pytorch+sentence-transformers"] = st_embed

    for graph in args.onnx:
        label, _, path = graph.rpartition("=")
        import onnxruntime as ort
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle threads sleep instead of spinning, so CPU time counts work (torch: OMP_WAIT_POLICY).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        tok = Tokenizer.from_file(f"{args.model_dir}/tokenizer.json")
        tok.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest
        tok.enable_truncation(max_length=256)

        def ort_embed(texts, batch, sess=sess, tok=tok):
            out = []
            for c in chunks(texts, batch):
                enc = tok.encode_batch(c)
                ids = np.array([e.ids for e in enc], dtype=np.int64)
                mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
                out.append(sess.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": mask})[0])
            return np.concatenate(out)

        runtimes[f"onnxruntime {ort.__version__} fp32 {label or path}"] = ort_embed

    results = []
    for batch in args.batches:
        ref = None
        for name, embed in runtimes.items():
            embed(texts[:64], batch)  # warm-up: allocations, page faults
            best = cpu_best = None
            for _ in range(args.rounds):
                started, cpu_started = time.perf_counter(), time.process_time()
                vectors = embed(texts, batch)
                secs = time.perf_counter() - started
                cpu = time.process_time() - cpu_started
                best = secs if best is None else min(best, secs)
                cpu_best = cpu if cpu_best is None else min(cpu_best, cpu)
            if ref is None:
                ref = vectors
            cos = np.sum(ref * vectors, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(vectors, axis=1))
            results.append(dict(runtime=name, batch=batch, threads=args.threads, texts=len(texts),
                                seconds=round(best, 3), msgs_per_s=round(len(texts) / best, 1),
                                cpu_seconds=round(cpu_best, 3), msgs_per_cpu_s=round(len(texts) / cpu_best, 1),
                                cosine_min=float(cos.min()), cosine_mean=float(cos.mean())))
            print(json.dumps(results[-1]), flush=True)
        for other in args.other:
            name, prefix = other.split("=", 1)
            try:
                v = np.fromfile(f"{prefix}_b{batch}.f32", dtype="<f4").reshape(len(texts), -1)
            except FileNotFoundError:
                continue
            cos = np.sum(ref * v, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(v, axis=1))
            results.append(dict(runtime=name, batch=batch, cosine_min=float(cos.min()), cosine_mean=float(cos.mean())))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
