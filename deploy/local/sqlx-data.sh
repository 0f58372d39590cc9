#!/usr/bin/env bash
# deploy/local/sqlx-data.sh: the data the compile-checked SQL (sqlx::query!, query_as!,
# query_scalar!) is built from: .sqlx/ at the repository's root, one query-<sha256>.json per
# statement (its parameter and column types, and which columns may be NULL). The build reads
# it and never a database (.cargo/config.toml sets SQLX_OFFLINE=true), so it is committed and
# must match the statements and the migrations. Made and checked without sqlx-cli.
#
# Usage:
#   sqlx-data.sh prepare   write .sqlx/ afresh (after changing a statement or a migration)
#   sqlx-data.sh check     fail, naming what differs, unless .sqlx/ is what prepare would write
#
# The database the statements are described by: $SQLX_DATA_DATABASE_URL when it is set (every
# migration applied to it, and nothing else); otherwise a stack instance of this script's own,
# `sqlx-data` (the stack tool; ports SQLX_DATA_PORTS, default "12222 13432"), made
# afresh, given the migrations with the stack's psql, and destroyed afterwards.
#
# How: the crates whose sources use the macros are checked again (`cargo check`, their files
# touched so that they are compiled again) with SQLX_OFFLINE=false and DATABASE_URL, so each
# macro asks the database, and SQLX_OFFLINE_DIR, a scratch folder each macro writes what it
# learnt into (what `cargo sqlx prepare` does). prepare puts that folder's files in .sqlx/;
# check compares them.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
cd "$REPO"
# The stack tool (services/stack); `make sqlx-prepare|sqlx-check` build it and pass its path.
STACK="${STACK:-$REPO/target/debug/stack}"
INSTANCE=sqlx-data
CARGO="${CARGO:-cargo}"
DATA="$REPO/.sqlx"

log() { printf 'sqlx-data: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

[ -x "$STACK" ] || die "no stack tool at $STACK: build it (cargo build -p switchboard-stack --bin stack)"

mode="${1:-}"
case "$mode" in
prepare | check) ;;
*) die "usage: $0 prepare|check" ;;
esac

scratch="$(mktemp -d "${TMPDIR:-/tmp}/sqlx-data.XXXXXX")"
own_stack=0
cleanup() {
    rm -rf "$scratch"
    if [ "$own_stack" = 1 ]; then
        "$STACK" destroy "$INSTANCE" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

database_url="${SQLX_DATA_DATABASE_URL:-}"
if [ -z "$database_url" ]; then
    # shellcheck disable=SC2086 # two ports, split on purpose
    set -- ${SQLX_DATA_PORTS:-12222 13432}
    [ $# -eq 2 ] || die "SQLX_DATA_PORTS must be two ports (NATS, Postgres), not '${SQLX_DATA_PORTS:-}'"
    log "a fresh stack instance '$INSTANCE' on ports $1 $2 (migrations/ applied)"
    "$STACK" destroy "$INSTANCE" >/dev/null 2>&1 || true
    own_stack=1
    stack_env="$(SB_STACK_FAST=1 "$STACK" up "$INSTANCE" "$1" "$2")"
    eval "$stack_env"
    # The stack's psql (its Postgres's own client), from the instance's record of its install.
    ports_file="${SB_STACK_DIR:-$REPO/.stack}/$INSTANCE/ports"
    pg_install="$(sed -n 's/^PG_INSTALL=//p' "$ports_file" 2>/dev/null || true)"
    psql="$pg_install/pgserver/pginstall/bin/psql"
    [ -x "$psql" ] || die "no psql at $psql (read from $ports_file)"
    # In file-name order, each in one transaction, as the product's migrator applies them.
    for migration in migrations/*.sql; do
        "$psql" -X -q -w -v ON_ERROR_STOP=1 --single-transaction -f "$migration" \
            "$SB_DATABASE_URL" >/dev/null 2>"$scratch/psql.err" ||
            die "applying $migration: $(cat "$scratch/psql.err")"
    done
    database_url="$SB_DATABASE_URL"
fi

# Every workspace source file that uses the macros (the fuzz workspace has no SQL of its own).
mapfile -t sources < <(grep -rlE --include='*.rs' '(^|[^[:alnum:]_])query(_as|_scalar)?!' \
    services tests | grep -v '^tests/fuzz/' | sort)
[ "${#sources[@]}" -gt 0 ] || die "no source uses sqlx::query!, query_as! or query_scalar!"
touch "${sources[@]}"
mkdir -p "$scratch/data"
log "describing the statements of ${#sources[@]} files (cargo check --workspace --all-targets)"
DATABASE_URL="$database_url" SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$scratch/data" \
    "$CARGO" check --workspace --all-targets --quiet
# Compiled again from .sqlx/ by the next build: what was compiled here came from the database,
# and would hide a .sqlx/ that does not match it.
touch "${sources[@]}"

made=$(find "$scratch/data" -name 'query-*.json' | wc -l)
[ "$made" -gt 0 ] || die "the build wrote no query data (were the macros run?)"

if [ "$mode" = prepare ]; then
    mkdir -p "$DATA"
    find "$DATA" -maxdepth 1 -name 'query-*.json' -delete
    cp "$scratch/data"/query-*.json "$DATA"/
    log "wrote $made statements to .sqlx/"
    exit 0
fi

# check: the same files, the same bytes.
status=0
for f in "$scratch"/data/query-*.json; do
    name="$(basename "$f")"
    if [ ! -f "$DATA/$name" ]; then
        log "missing from .sqlx/: $name ($(sed -n 's/^  "query": "\(.\{0,70\}\).*/\1/p' "$f"))"
        status=1
    elif ! cmp -s "$f" "$DATA/$name"; then
        log "stale in .sqlx/: $name"
        diff -u "$DATA/$name" "$f" >&2 || true
        status=1
    fi
done
for f in "$DATA"/query-*.json; do
    [ -e "$f" ] || continue
    name="$(basename "$f")"
    if [ ! -f "$scratch/data/$name" ]; then
        log "in .sqlx/ but no statement uses it: $name"
        status=1
    fi
done
if [ "$status" != 0 ]; then
    die ".sqlx/ is not current: run 'make sqlx-prepare' and commit .sqlx/"
fi
log ".sqlx/ is current ($made statements)"
