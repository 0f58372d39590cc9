"""The embedding figure of `make bench`: our default local embedder (the Rust ONNX Runtime
provider, `embed_speed onnx`) against the peer, PyTorch + sentence-transformers, measured in the
same run on the same texts (measure.py), and the verdict against the issue's bar: at least 1.5x
the peer's messages per CPU-second, best configuration against best configuration, with every
vector's cosine to sentence-transformers' >= 0.9999 (fp32).

    python verdict.py <results_dir> <texts>

Reads <results_dir>/embed-rust.jsonl (embed_speed's lines, onnx and candle), the vectors it
wrote (embed-onnx_b<batch>.f32, embed-candle_b<batch>.f32) and embed-peers.json (measure.py's,
absent when the peer could not be installed; embed-others.json then has Python's onnxruntime,
measured without it); writes embed-summary.json and prints one line
starting PASS, FAIL or NO VERDICT. Exit status 0, 1 and 2 likewise. Standard library only.
"""
import json
import math
import struct
import sys

MIN_RATIO = 1.5
MIN_COSINE = 0.9999
DIMENSIONS = 384


def vectors(path, n):
    data = open(path, "rb").read()
    flat = struct.unpack(f"<{len(data) // 4}f", data)
    width = len(flat) // n
    return [flat[i * width : (i + 1) * width] for i in range(n)]


def cosines(a, b):
    out = []
    for x, y in zip(a, b):
        dot = sum(p * q for p, q in zip(x, y))
        nx = math.sqrt(sum(p * p for p in x))
        ny = math.sqrt(sum(q * q for q in y))
        out.append(dot / (nx * ny) if nx and ny else 0.0)
    return out


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    rust = [json.loads(l) for l in open(f"{out}/embed-rust.jsonl") if l.strip()]
    try:
        peers = json.load(open(f"{out}/embed-peers.json"))
    except FileNotFoundError:
        peers = []
    # Without the peer: Python's onnxruntime on the same graph, the reference of its cosines.
    try:
        others = json.load(open(f"{out}/embed-others.json"))
    except FileNotFoundError:
        others = []
    ours = [r for r in rust if r["runtime"] == "onnx"]
    candle = [r for r in rust if r["runtime"] == "candle"]
    peer = [r for r in peers if r["runtime"] == "pytorch+sentence-transformers"]
    summary = {"texts": n, "min_ratio": MIN_RATIO, "min_cosine": MIN_COSINE, "default": ours,
               "candle": candle, "peer": peer,
               "others": [r for r in peers if r not in peer] + others}
    # Agreement with sentence-transformers (measure.py compares our vector files with its own).
    agreement = [r for r in peers if r["runtime"] == "rust-onnx" and "cosine_min" in r]
    # And with candle, an independent implementation, which needs no peer.
    with_candle = []
    for r in ours:
        b = r["batch"]
        try:
            c = cosines(vectors(f"{out}/embed-onnx_b{b}.f32", n), vectors(f"{out}/embed-candle_b{b}.f32", n))
        except FileNotFoundError:
            continue
        with_candle.append({"batch": b, "cosine_min": min(c), "cosine_mean": sum(c) / len(c)})
    summary["cosine_to_peer"] = agreement
    summary["cosine_to_candle"] = with_candle
    summary["static"] = static_beside_minilm(out, n, rust)
    if not ours:
        verdict, status = "FAIL: the default provider (embed_speed onnx) did not run", 1
    elif not peer:
        best = max(ours, key=lambda r: r["msgs_per_cpu_s"])
        python = [r for r in others if r["runtime"].startswith("onnxruntime") and "msgs_per_cpu_s" in r]
        beside = ""
        if python:
            p = max(python, key=lambda r: r["msgs_per_cpu_s"])
            beside = (f"; Python onnxruntime on the same graph {p['msgs_per_cpu_s']} msgs/CPU-s "
                      f"at batch {p['batch']} ({best['msgs_per_cpu_s'] / p['msgs_per_cpu_s']:.2f}x)")
        verdict, status = (
            f"NO VERDICT: the peer (PyTorch + sentence-transformers) was not measured (see "
            f"embed-peers.log); ours: {best['msgs_per_cpu_s']} msgs/CPU-s, {best['msgs_per_s']} "
            f"msgs/s at batch {best['batch']}{beside}",
            2,
        )
    else:
        best = max(ours, key=lambda r: r["msgs_per_cpu_s"])
        theirs = max(peer, key=lambda r: r["msgs_per_cpu_s"])
        ratio = best["msgs_per_cpu_s"] / theirs["msgs_per_cpu_s"]
        wall = best["msgs_per_s"] / max(r["msgs_per_s"] for r in peer)
        cmin = min((r["cosine_min"] for r in agreement), default=float("nan"))
        cmean = min((r["cosine_mean"] for r in agreement), default=float("nan"))
        summary.update(ratio_cpu=round(ratio, 2), ratio_wall=round(wall, 2), cosine_min=cmin,
                       cosine_mean=cmean)
        ok = ratio >= MIN_RATIO and cmin >= MIN_COSINE
        verdict = (
            f"{'PASS' if ok else 'FAIL'}: default embedder (ONNX Runtime, batch {best['batch']}) "
            f"{best['msgs_per_cpu_s']} msgs/CPU-s vs PyTorch + sentence-transformers (batch "
            f"{theirs['batch']}) {theirs['msgs_per_cpu_s']}: {ratio:.2f}x (wall {wall:.2f}x; "
            f"need >= {MIN_RATIO}x), cosine min {cmin:.8f} mean {cmean:.8f} (need >= {MIN_COSINE})"
        )
        status = 0 if ok else 1
    summary["verdict"] = verdict
    json.dump(summary, open(f"{out}/embed-summary.json", "w"), indent=1)
    print(f"embedding: {verdict}")
    if summary["static"]:
        s = summary["static"]
        print(f"embedding: beside it, the static model ({s['model']}) {s['msgs_per_cpu_s']} msgs/CPU-s "
              f"({s['vs_default']}x the default), top-10 agreement with MiniLM {s['top10_agreement']:.3f} "
              f"over {s['distinct_texts']} distinct texts")
    return status


def top10_agreement(ref, other):
    """For every text as the query: the share of `other`'s 10 nearest other texts that are among
    `ref`'s 10 nearest (a text tied with ref's 10th counts). Duplicate texts must be removed."""
    def sims(vs, i):
        x = vs[i]
        return [sum(p * q for p, q in zip(x, y)) if j != i else -9.0 for j, y in enumerate(vs)]
    shares = []
    for i in range(len(ref)):
        r, o = sims(ref, i), sims(other, i)
        tenth = sorted(r, reverse=True)[9]
        mine = sorted(range(len(o)), key=lambda j: -o[j])[:10]
        shares.append(sum(1 for j in mine if r[j] >= tenth - 1e-6) / 10)
    return sum(shares) / len(shares)


def static_beside_minilm(out, n, rust):
    """The static model's speed and its agreement with the default's vectors (batch 1 each)."""
    static = [r for r in rust if r["runtime"] == "static"]
    ours = [r for r in rust if r["runtime"] == "onnx"]
    if not static or not ours:
        return None
    texts = open(f"{out}/embed-texts.txt").read().splitlines()[:n]
    first = {}
    for i, t in enumerate(texts):
        first.setdefault(t, i)
    keep = sorted(first.values())
    try:
        b = static[0]["batch"]
        ref = vectors(f"{out}/embed-onnx_b{ours[0]['batch']}.f32", n)
        mine = vectors(f"{out}/embed-static_b{b}.f32", n)
    except FileNotFoundError:
        return None
    best, default = max(static, key=lambda r: r["msgs_per_cpu_s"]), max(ours, key=lambda r: r["msgs_per_cpu_s"])
    return {"model": best.get("model", best["serving"]), "msgs_per_cpu_s": best["msgs_per_cpu_s"], "batch": best["batch"],
            "vs_default": round(best["msgs_per_cpu_s"] / default["msgs_per_cpu_s"], 1),
            "distinct_texts": len(keep),
            "top10_agreement": top10_agreement([ref[i] for i in keep], [mine[i] for i in keep])}


if __name__ == "__main__":
    sys.exit(main())
