#!/usr/bin/env python3
"""Record the previous version's SQL for the expand/contract check (`make migration-baseline`).

The previous version is the code just before the newest migration: the commit before the one
that added it (or HEAD, while that migration is not committed yet). Its compile-time-checked
queries (`.sqlx/`, what `make sqlx-prepare` wrote then) go to previous-queries.json with the
columns each returned. tests/tests/migration_compat.rs then describes every one of them
against a database with all of today's migrations applied: the previous version's workers,
still running while the new version migrates, must find every table, column and type they
use. Run it once after adding a migration (commit the migration first or not), and commit
the file it writes.
"""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "migrations" / "compat" / "previous-queries.json"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout


def main() -> int:
    migrations = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    if not migrations:
        print("no migrations", file=sys.stderr)
        return 1
    newest = migrations[-1]
    added = git("log", "--diff-filter=A", "--format=%H", "--", f"migrations/{newest}").split()
    previous = f"{added[-1]}^" if added else "HEAD"
    commit = git("rev-parse", previous).strip()
    queries = []
    for name in git("ls-tree", "--name-only", commit, ".sqlx/").split():
        if not name.endswith(".json"):
            continue
        data = json.loads(git("show", f"{commit}:{name}"))
        queries.append(
            {
                "query": data["query"],
                "columns": [
                    {"name": c["name"], "type": c["type_info"]}
                    for c in data["describe"]["columns"]
                ],
            }
        )
    queries.sort(key=lambda q: q["query"])
    OUT.write_text(
        json.dumps(
            {"newest_migration": newest, "previous_version": commit, "queries": queries},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"{len(queries)} queries of {commit[:12]} (before {newest}) -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
