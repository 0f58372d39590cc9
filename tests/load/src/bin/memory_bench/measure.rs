//! Timing the product's own recall and search calls, one at a time, from the client.
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context as _;
use futures::future::BoxFuture;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sqlx::PgPool;
use switchboard_kit::memory_config::RecallConfig;
use switchboard_memory::embed::{EmbedError, Embedder};
use switchboard_memory::recall::{self, RecallRequest};
use switchboard_memory::search::{self, SearchQuery};
use uuid::Uuid;

use super::TARGET_RECALL_P99_MS;
use super::TARGET_SEARCH_P99_MS;
use super::corpus::{AGENTS, Corpus, Query};

pub const WARMUP: usize = 50;
/// A query text no message contains: the product's ranking is then by meaning alone.
pub const NO_WORD: &str = "zqxjvbenchnoword";

/// The embedder the product's functions get: it answers the vector the bench set for the query.
pub struct BenchEmbedder {
    pub model: String,
    /// The model's width (the corpus's): the product casts the query vector to it.
    pub dims: usize,
    pub next: Mutex<Vec<f32>>,
}

impl BenchEmbedder {
    pub fn set(&self, v: &[f32]) {
        *self.next.lock().expect("not poisoned") = v.to_vec();
    }
}

impl Embedder for BenchEmbedder {
    fn model(&self) -> &str {
        &self.model
    }
    fn dimensions(&self) -> usize {
        self.dims
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        let v = self.next.lock().expect("not poisoned").clone();
        Box::pin(async move { Ok(texts.iter().map(|_| v.clone()).collect()) })
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Recall,
    Search,
    SearchAgent,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Recall => "recall (person + identity)",
            Kind::Search => "search (everyone)",
            Kind::SearchAgent => "search (agent reggie_oc)",
        }
    }
    pub fn target_ms(self) -> f64 {
        match self {
            Kind::Recall => TARGET_RECALL_P99_MS,
            _ => TARGET_SEARCH_P99_MS,
        }
    }
}

pub struct Bench<'a> {
    pub db: PgPool,
    /// `ivfflat.probes` of the searches across people, as `[embedding] ivfflat_probes` sets it.
    pub probes: u32,
    pub corpus: &'a Corpus,
    pub embedder: BenchEmbedder,
}

impl Bench<'_> {
    /// The product's call for `q`: `limit` hits, with `text` (the query's own, or [`NO_WORD`]);
    /// `whole`: a search with its index lag, as the API answers (recall is always whole).
    pub async fn run(
        &self,
        kind: Kind,
        q: &Query,
        text: &str,
        limit: usize,
        whole: bool,
    ) -> anyhow::Result<Vec<Uuid>> {
        self.embedder.set(&q.vector);
        let model = self.embedder.model.as_str();
        let embedder: &dyn Embedder = &self.embedder;
        Ok(match kind {
            Kind::Recall => {
                let (p, identity) = q.person.context("a recall query names its person")?;
                let config = RecallConfig {
                    top_k: limit,
                    ..RecallConfig::default()
                };
                let req = RecallRequest {
                    person_id: &self.corpus.people[p].id,
                    agent_identity: identity,
                    text,
                    held_by: None,
                    // The message being answered: newer than every stored one.
                    answering: vec![Uuid::now_v7()],
                    // Not a logged message: the query is embedded, as for a new one.
                    message: None,
                };
                recall::recall(&self.db, Ok(embedder), model, &config, &req)
                    .await?
                    .context("recall is on")?
                    .hits
                    .into_iter()
                    .map(|h| h.message_id)
                    .collect()
            }
            Kind::Search | Kind::SearchAgent if whole => search::search(
                &self.db,
                Ok(embedder),
                model,
                &search_query(q, text, limit, self.probes),
            )
            .await?
            .hits
            .into_iter()
            .map(|h| h.message_id)
            .collect(),
            Kind::Search | Kind::SearchAgent => search::rank(
                &self.db,
                Ok(embedder),
                model,
                &search_query(q, text, limit, self.probes),
            )
            .await?
            .0
            .into_iter()
            .map(|h| h.message_id)
            .collect(),
        })
    }

    pub async fn explain(&self, kind: Kind, q: &Query) -> anyhow::Result<String> {
        self.embedder.set(&q.vector);
        let model = self.embedder.model.as_str();
        let embedder: &dyn Embedder = &self.embedder;
        Ok(match kind {
            Kind::Recall => {
                let (p, identity) = q.person.context("a recall query names its person")?;
                let req = RecallRequest {
                    person_id: &self.corpus.people[p].id,
                    agent_identity: identity,
                    text: &q.text,
                    held_by: None,
                    answering: vec![Uuid::now_v7()],
                    message: None,
                };
                recall::explain(
                    &self.db,
                    Ok(embedder),
                    model,
                    &RecallConfig::default(),
                    &req,
                )
                .await?
                .unwrap_or_default()
            }
            _ => {
                search::explain(
                    &self.db,
                    Ok(embedder),
                    model,
                    &search_query(q, &q.text, search::DEFAULT_LIMIT as usize, self.probes),
                )
                .await?
            }
        })
    }
}

pub fn search_query(q: &Query, text: &str, limit: usize, probes: u32) -> SearchQuery {
    SearchQuery {
        text: text.to_string(),
        agent: q.agent.map(|a| AGENTS[a].0.to_string()),
        limit: limit as i64,
        probes,
        ..Default::default()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

pub fn latency(us: &[u64]) -> Latency {
    // 1 µs to 10 min; slower calls count as 10 min.
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    for &u in us {
        h.saturating_record(u.clamp(1, 600_000_000));
    }
    let ms = |v: u64| v as f64 / 1000.0;
    Latency {
        p50_ms: ms(h.value_at_quantile(0.50)),
        p95_ms: ms(h.value_at_quantile(0.95)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        max_ms: ms(h.max()),
        mean_ms: h.mean() / 1000.0,
    }
}

#[derive(Debug, Serialize)]
pub struct Series {
    pub kind: String,
    pub queries: usize,
    /// The product's call as a turn or an operator makes it (the query's own words): for a
    /// search, the ranking and the index lag, over `full_calls` of the queries.
    pub latency: Latency,
    pub full_calls: usize,
    /// Search only: the ranking statement alone (without the index lag), every query.
    pub latency_ranking: Option<Latency>,
    /// Recall only: the calls for the skewed people (thousands of messages each).
    pub latency_skewed: Option<Latency>,
    /// The product's ranking by meaning alone, top 10, against the exact top 10.
    pub recall_at_10: f64,
    /// The calls that measured recall@10 (a text without hits: the vector branch only).
    pub latency_vector_only: Latency,
    /// EXPLAIN ANALYZE of the product's ranking statement for the first query.
    pub plan: String,
    /// Recall only: the same for a skewed person.
    pub plan_skewed: Option<String>,
    pub load_average: [f64; 3],
}

pub fn load_average() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|x| x.parse().unwrap_or(f64::NAN));
    [0; 3].map(|_| it.next().unwrap_or(f64::NAN))
}

/// `plan` with each vector literal (hundreds of numbers) cut to its first values.
pub fn shorten_vectors(plan: &str) -> String {
    let mut out = String::with_capacity(plan.len());
    let mut rest = plan;
    while let Some(start) = rest.find("'[") {
        let Some(len) = rest[start..].find("]'") else {
            break;
        };
        let literal = &rest[start..start + len + 2];
        out.push_str(&rest[..start]);
        if literal.len() > 80 {
            out.push_str(&literal[..40]);
            out.push_str("…]'");
        } else {
            out.push_str(literal);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

pub async fn measure(
    bench: &Bench<'_>,
    kind: Kind,
    queries: &[Query],
    exact: &[Vec<Uuid>],
    full_calls: usize,
) -> anyhow::Result<Series> {
    let limit_realistic = match kind {
        Kind::Recall => RecallConfig::default().top_k,
        _ => search::DEFAULT_LIMIT as usize,
    };
    let is_search = kind != Kind::Recall;
    let full_calls = if is_search {
        full_calls.min(queries.len())
    } else {
        queries.len()
    };
    for q in queries.iter().cycle().take(WARMUP) {
        bench.run(kind, q, &q.text, limit_realistic, false).await?;
    }
    let bar = ProgressBar::new(
        (full_calls + queries.len() + if is_search { queries.len() } else { 0 }) as u64,
    );
    bar.set_style(
        ProgressStyle::with_template(&format!("{:<28} {{bar:40}} {{pos}}/{{len}}", kind.name()))
            .expect("template"),
    );
    let mut us = Vec::with_capacity(queries.len());
    let mut us_skewed = Vec::new();
    for q in &queries[..full_calls] {
        let t = Instant::now();
        bench.run(kind, q, &q.text, limit_realistic, true).await?;
        let e = t.elapsed().as_micros() as u64;
        us.push(e);
        if q.person.is_some_and(|(p, _)| bench.corpus.people[p].skewed) {
            us_skewed.push(e);
        }
        bar.inc(1);
    }
    let mut us_ranking = Vec::new();
    if is_search {
        for q in queries {
            let t = Instant::now();
            bench.run(kind, q, &q.text, limit_realistic, false).await?;
            us_ranking.push(t.elapsed().as_micros() as u64);
            bar.inc(1);
        }
    }
    let mut us_vector = Vec::with_capacity(queries.len());
    let mut found = 0usize;
    let mut possible = 0usize;
    for (q, exact) in queries.iter().zip(exact) {
        let t = Instant::now();
        let hits = bench.run(kind, q, NO_WORD, 10, false).await?;
        us_vector.push(t.elapsed().as_micros() as u64);
        let exact: HashSet<&Uuid> = exact.iter().collect();
        found += hits.iter().take(10).filter(|h| exact.contains(h)).count();
        possible += exact.len();
        bar.inc(1);
    }
    bar.finish_and_clear();
    let plan = shorten_vectors(&bench.explain(kind, &queries[0]).await?);
    let plan_skewed = match queries
        .iter()
        .find(|q| q.person.is_some_and(|(p, _)| bench.corpus.people[p].skewed))
    {
        Some(q) => Some(shorten_vectors(&bench.explain(kind, q).await?)),
        None => None,
    };
    Ok(Series {
        kind: kind.name().into(),
        queries: queries.len(),
        latency: latency(&us),
        full_calls,
        latency_ranking: is_search.then(|| latency(&us_ranking)),
        latency_skewed: (!us_skewed.is_empty()).then(|| latency(&us_skewed)),
        recall_at_10: if possible == 0 {
            0.0
        } else {
            found as f64 / possible as f64
        },
        latency_vector_only: latency(&us_vector),
        plan,
        plan_skewed,
        load_average: load_average(),
    })
}
