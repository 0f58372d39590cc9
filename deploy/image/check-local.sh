#!/usr/bin/env bash
# `make image-check`: the image as Compose runs it, against a stack of its own (ports
# 22222/23432): the runner container with the demo engine, `switchboard up` in a second
# container (both on the host's network, on loopback ports of their own), then an SMS sent
# from the host as Twilio would, answered through the containers. Run `make image` first.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export CONTAINERS_CONF="$ROOT/deploy/image/containers.conf"
IMAGE=${IMAGE:-localhost/switchboard:latest}
STACK=${STACK:-target/debug/stack}
NAME=image-check
GATEWAY=127.0.0.1:22080 ADMIN=127.0.0.1:22081 RUNNER=127.0.0.1:22090
TOKEN=image-check-token

podman image exists "$IMAGE" || { echo "image-check: no $IMAGE: run make image" >&2; exit 1; }
cleanup() {
  podman rm -f sb-image-check-up sb-image-check-runner >/dev/null 2>&1 || true
  "$STACK" destroy "$NAME" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
eval "$(SB_STACK_FAST=1 "$STACK" up "$NAME" 22222 23432)"

# The same settings Compose gives, but one NATS node and loopback addresses. The secrets are
# passed by name from this environment, never on a command line (`ps` shows those).
export SB_AGENTS__0__TOKEN=$TOKEN SB_RUNNER_TOKEN=$TOKEN
settings=(
  -e SB_NATS_URL -e SB_DATABASE_URL -e SB_AGENTS__0__TOKEN
  -e SB_RUNTIME__STREAM_REPLICAS=1
  -e "SB_GATEWAY__HTTP_ADDR=$GATEWAY" -e "SB_GATEWAY__PUBLIC_URL=http://$GATEWAY"
  -e "SB_ADMIN__HTTP_ADDR=$ADMIN"
  -e "SB_TWILIO__API_BASE=http://$GATEWAY/demo/twilio"
  -e "SB_AGENTS__0__RUNNER_URL=http://$RUNNER"
  -v "$ROOT/deploy/compose/switchboard.toml:/etc/switchboard/switchboard.toml:ro"
  -e SB_CONFIG=/etc/switchboard/switchboard.toml
)
podman run -d --name sb-image-check-runner --network host \
  -e SB_RUNNER_TOKEN -e "SB_RUNNER_LISTEN=$RUNNER" \
  -e SB_RUNNER_STATE_DIR=/var/lib/switchboard/runner \
  -e SB_RUNNER_CORE_MEMORY_DIR=/var/lib/switchboard \
  -v "$ROOT/deploy/compose/runner.toml:/etc/switchboard/runner.toml:ro" \
  --entrypoint /usr/local/bin/switchboard-runner "$IMAGE" --config /etc/switchboard/runner.toml >/dev/null
podman run -d --name sb-image-check-up --network host "${settings[@]}" "$IMAGE" up >/dev/null

for _ in $(seq 1 120); do
  curl -fsS "http://$ADMIN/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://$ADMIN/readyz" >/dev/null || {
  echo "image-check: switchboard up in the image never got ready:" >&2
  podman logs --tail 40 sb-image-check-up >&2
  exit 1
}
# The CLI in a third container, as `docker compose run --rm cli sms send` does.
reply=$(podman run --rm --network host "${settings[@]}" "$IMAGE" sms send --text "hello from the image" --wait 60)
echo "$reply"
case "$reply" in
  *"hello from the image"*) echo "image-check: passed (an SMS answered through the image's gateway, workers and runner)" ;;
  *) echo "image-check: FAILED: no reply quoting the message" >&2
     podman logs --tail 40 sb-image-check-up >&2; exit 1 ;;
esac
