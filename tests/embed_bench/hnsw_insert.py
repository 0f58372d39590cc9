"""What one stored vector costs the HNSW graph (issue 42, "HNSW insert cost"), by graph
parameters: a table of `--base` vectors gets its graph built in bulk, then `--inserts` more are
inserted 64 to a statement (as the embedding worker writes them), timed; then recall@10 of the
graph (ef_search 400, iterative scan, as the product searches across people) against the exact
top 10 for `--queries` of the vectors. One backend, nothing else running: the wall time of the
inserts is the backend's CPU.

The vectors are the product's own for the bench's texts: `embed_speed` (release example) writes
them, e.g. for the static model:
    python3 tests/embed_bench/texts.py 120000 > /tmp/texts.txt
    target/release/examples/embed_speed static "$SB_EMBEDDING__STATIC_DIR" /tmp/texts.txt /tmp/vec 64
    python3 tests/embed_bench/hnsw_insert.py --vectors /tmp/vec_b64.f32 --dimensions 256 \
        --psql "$SB_PG_BIN/psql" --database-url "$SB_DATABASE_URL" --graphs 32/128 16/64 16/32
It works in a schema of its own (`hnsw_insert_bench`), dropped at the end.
"""
import argparse
import os
import subprocess
import tempfile
import time
from array import array


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vectors", required=True, help="little-endian f32, row-major")
    ap.add_argument("--dimensions", type=int, required=True)
    ap.add_argument("--psql", required=True)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--base", type=int, default=100_000)
    ap.add_argument("--inserts", type=int, default=5_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--graphs", nargs="+", default=["32/128", "16/64"], help="m/ef_construction")
    args = ap.parse_args()
    d = args.dimensions
    flat = array("f")
    with open(args.vectors, "rb") as f:
        flat.frombytes(f.read())
    n = len(flat) // d
    need = args.base + args.inserts
    assert n >= need, f"{n} vectors, {need} needed"
    work = tempfile.mkdtemp()

    def write(path, start, count):
        with open(path, "w") as f:
            for i in range(start, start + count):
                row = flat[i * d:(i + 1) * d]
                f.write(f"{i}\t[{','.join(f'{x:.6g}' for x in row)}]\n")

    base, extra = os.path.join(work, "base.tsv"), os.path.join(work, "extra.tsv")
    write(base, 0, args.base)
    write(extra, args.base, args.inserts)

    def psql(sql, quiet=True):
        out = subprocess.run(
            [args.psql, args.database_url, "-v", "ON_ERROR_STOP=1", "-X", "-q", "-t", "-A", "-c", sql],
            check=True, capture_output=True, text=True)
        return out.stdout.strip()

    s = "hnsw_insert_bench"
    psql(f"DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s};"
         f"CREATE TABLE {s}.staging (id int, e vector({d}));"
         f"CREATE TABLE {s}.base (id int, e vector({d}));")
    psql(f"\\copy {s}.staging FROM '{extra}'")
    psql(f"\\copy {s}.base FROM '{base}'")
    print(f"{args.base} vectors in the graph, {args.inserts} inserted 64 a statement, "
          f"{args.queries} queries; dimensions {d}")
    print("| m / ef_construction | bulk build | insert, a vector | recall@10 (ef_search 400) |")
    print("|---|---|---|---|")
    for graph in args.graphs:
        m, efc = graph.split("/")
        psql(f"DROP TABLE IF EXISTS {s}.t; CREATE TABLE {s}.t AS SELECT * FROM {s}.base;")
        t0 = time.time()
        psql(f"SET maintenance_work_mem = '1GB'; SET max_parallel_maintenance_workers = 0;"
             f"CREATE INDEX t_hnsw ON {s}.t USING hnsw ((e::halfvec({d})) halfvec_cosine_ops)"
             f" WITH (m = {m}, ef_construction = {efc})")
        build = time.time() - t0
        statements = ";".join(
            f"INSERT INTO {s}.t SELECT * FROM {s}.staging WHERE id >= {args.base + i}"
            f" AND id < {args.base + i + 64}" for i in range(0, args.inserts, 64))
        t0 = time.time()
        psql(statements)
        per = (time.time() - t0) / args.inserts * 1000
        # Queries: every (n/queries)-th inserted-or-base vector.
        step = max(1, args.base // args.queries)
        ids = list(range(0, args.base, step))[: args.queries]
        hits = 0
        for q in ids:
            exact = psql(
                f"SET enable_indexscan = off; SELECT string_agg(id::text, ',') FROM (SELECT id FROM {s}.t"
                f" ORDER BY e::halfvec({d}) <=> (SELECT e::halfvec({d}) FROM {s}.t WHERE id = {q} LIMIT 1)"
                f" LIMIT 10) x")
            approx = psql(
                f"SET hnsw.ef_search = 400; SET hnsw.iterative_scan = relaxed_order;"
                f"SELECT string_agg(id::text, ',') FROM (SELECT id FROM {s}.t"
                f" ORDER BY e::halfvec({d}) <=> (SELECT e::halfvec({d}) FROM {s}.base WHERE id = {q} LIMIT 1)"
                f" LIMIT 10) x")
            hits += len(set(exact.split(",")) & set(approx.split(",")))
        print(f"| {m} / {efc} | {build:.1f} s | {per:.2f} ms | {hits / (10 * len(ids)):.3f} |", flush=True)
    psql(f"DROP SCHEMA {s} CASCADE")


if __name__ == "__main__":
    main()
