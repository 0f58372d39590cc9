//! The exact answers recall@10 is measured against.
use sqlx::PgPool;
use uuid::Uuid;

use super::corpus::{Corpus, Query, Rows};

/// Candidates the brute force keeps per query before Postgres orders them by halfvec distance.
pub const EXACT_CANDIDATES: usize = 30;

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut s = [0f32; 8];
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    s.iter().sum()
}

/// The rows closest to each query by f32 cosine, under the query's filters: the
/// [`EXACT_CANDIDATES`] best, best first. Two threads, each query block scanning the rows once.
pub fn brute_force(corpus: &Corpus, rows: &Rows, queries: &[Query]) -> Vec<Vec<usize>> {
    let dims = corpus.dims;
    let scan = |q: &[Query]| -> Vec<Vec<usize>> {
        let mut best: Vec<Vec<(f32, usize)>> = vec![Vec::new(); q.len()];
        let all = 0..rows.agent.len();
        // Recall queries look at their person's rows only; search queries at every row.
        let ranges: Vec<std::ops::Range<usize>> = q
            .iter()
            .map(|q| match q.person {
                Some((p, _)) => {
                    let person = &corpus.people[p];
                    person.start..person.start + person.count
                }
                None => all.clone(),
            })
            .collect();
        let lo = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let hi = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        for i in lo..hi {
            let v = &rows.vectors[i * dims..(i + 1) * dims];
            // Twins are next to each other: the similarity is computed once for both.
            let mut last: Option<(usize, f32)> = None;
            for (j, query) in q.iter().enumerate() {
                if !ranges[j].contains(&i) || !query.admits(rows, i) {
                    continue;
                }
                let sim = match last {
                    Some((id, sim)) if id == query.vector_id => sim,
                    _ => dot(v, &query.vector),
                };
                last = Some((query.vector_id, sim));
                let b = &mut best[j];
                if b.len() < EXACT_CANDIDATES || sim > b[b.len() - 1].0 {
                    let at = b.partition_point(|(s, _)| *s >= sim);
                    b.insert(at, (sim, i));
                    b.truncate(EXACT_CANDIDATES);
                }
            }
        }
        best.into_iter()
            .map(|b| b.into_iter().map(|(_, i)| i).collect())
            .collect()
    };
    let (filtered, mut everyone): (Vec<_>, Vec<_>) = queries
        .iter()
        .enumerate()
        .partition(|(_, q)| q.person.is_some());
    everyone.sort_by_key(|(_, q)| q.vector_id);
    let mut out = vec![Vec::new(); queries.len()];
    for (i, q) in filtered {
        out[i] = scan(std::slice::from_ref(q)).remove(0);
    }
    let blocks: Vec<Vec<(usize, &Query)>> = everyone.chunks(32).map(|c| c.to_vec()).collect();
    let results: Vec<Vec<(usize, Vec<usize>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let blocks = &blocks;
                s.spawn(move || {
                    blocks
                        .iter()
                        .skip(t)
                        .step_by(2)
                        .flat_map(|b| {
                            let qs: Vec<Query> = b.iter().map(|(_, q)| (*q).clone()).collect();
                            b.iter().map(|(i, _)| *i).zip(scan(&qs)).collect::<Vec<_>>()
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for (i, best) in results.into_iter().flatten() {
        out[i] = best;
    }
    out
}

/// The exact top 10 of each query: its candidates ordered by a distance computed in Postgres: a
/// person's (recall) by the f32 cosine distance of the stored vectors (stored at half
/// precision: the product ranks them by the halfvec distance, so this counts what the query's
/// rounding costs; what the storage's rounding costs was measured against a full-precision
/// copy, docs/bench-memory.md "Half precision"), a search across people by the halfvec cosine
/// distance its index orders by (an expression the index cannot serve, so the order is
/// exact). `dims`: the model's width, as the product casts to it.
pub async fn exact_top10(
    db: &PgPool,
    model: &str,
    dims: usize,
    rows: &Rows,
    queries: &[Query],
    candidates: &[Vec<usize>],
) -> anyhow::Result<Vec<Vec<Uuid>>> {
    let mut out = Vec::with_capacity(queries.len());
    for (q, c) in queries.iter().zip(candidates) {
        let ids: Vec<Uuid> = c.iter().map(|&i| rows.ids[i]).collect();
        let distance = if q.person.is_some() {
            format!("embedding::vector({dims}) <=> $3::vector({dims})")
        } else {
            format!("(embedding::halfvec({dims}) <=> $3::halfvec({dims})) + 0")
        };
        let top: Vec<Uuid> = sqlx::query_scalar(&format!(
            "SELECT message_id FROM switchboard.message_vectors
              WHERE model = $1 AND message_id = ANY($2)
              ORDER BY {distance}, message_id
              LIMIT 10"
        ))
        .bind(model)
        .bind(&ids)
        .bind(switchboard_memory::embed::pg_vector(&q.vector))
        .fetch_all(db)
        .await?;
        out.push(top);
    }
    Ok(out)
}
