//! The generated corpus: topics, people, messages, vectors and queries, deterministic from the
//! seed (a run that measures a database loaded earlier generates the same rows again).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt::Write as _;
use uuid::Uuid;

/// Directions of a topic its messages vary along.
pub const SUBSPACE: usize = 16;
pub const SUBSPACE_SIGMA: f32 = 0.25;
pub const ISO_SIGMA: f32 = 0.02;
pub const WORDS_PER_TOPIC: usize = 12;
pub const PER_PERSON: usize = 100;
pub const SKEWED_PEOPLE: usize = 20;
pub const CHUNK: usize = 10_000;
/// (agent, identity, channel) of the generated messages.
pub const AGENTS: [(&str, &str, &str); 3] = [
    ("reggie_oc", "reggie", "sms"),
    ("reggie_fd", "reggie", "chat"),
    ("nova_oc", "nova", "sms"),
];
pub const COMMON_WORDS: &[&str] = &[
    "the", "my", "is", "when", "what", "can", "i", "you", "please", "thanks", "today", "tomorrow",
    "next", "week", "shift", "work", "time", "need", "help", "with", "about", "for", "and", "to",
    "a", "on", "at", "do", "have", "still", "again", "how", "it", "me", "we", "this",
];
pub const SYLLABLES: [&str; 20] = [
    "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "ba", "de", "fi", "gu", "ha", "jo", "ku",
    "le", "mo", "nu", "pi",
];

pub struct Person {
    pub id: String,
    /// Its rows are `start..start + count`.
    pub start: usize,
    pub count: usize,
    pub topics: [usize; 4],
    pub skewed: bool,
}

/// Everything generated, deterministic from the seed: the exact answers of a run that did not
/// load are those of the run that did.
pub struct Corpus {
    /// The vectors' width: the measured model's (`--embedder`).
    pub dims: usize,
    pub topics: usize,
    pub centroids: Vec<f32>,
    pub basis: Vec<f32>,
    pub words: Vec<Vec<String>>,
    pub people: Vec<Person>,
}

pub fn gauss(rng: &mut StdRng) -> f32 {
    // Box-Muller; one of the pair is enough here.
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

pub fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

pub fn unit(rng: &mut StdRng, dims: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dims).map(|_| gauss(rng)).collect();
    normalise(&mut v);
    v
}

impl Corpus {
    pub fn new(vectors: usize, topics: usize, seed: u64, dims: usize) -> Corpus {
        let mut rng = StdRng::seed_from_u64(seed);
        let centroids = (0..topics).flat_map(|_| unit(&mut rng, dims)).collect();
        let basis = (0..topics * SUBSPACE)
            .flat_map(|_| unit(&mut rng, dims))
            .collect();
        let words = (0..topics)
            .map(|t| {
                (0..WORDS_PER_TOPIC)
                    .map(|w| {
                        let mut n = t * WORDS_PER_TOPIC + w;
                        (0..4)
                            .map(|_| {
                                let s = SYLLABLES[n % SYLLABLES.len()];
                                n /= SYLLABLES.len();
                                s
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let skewed_rows = vectors / 10;
        let regular = (vectors - skewed_rows) / PER_PERSON;
        let mut plan: Vec<(String, usize, bool)> = (0..regular)
            .map(|p| (format!("phone:+1555{p:07}"), PER_PERSON, false))
            .collect();
        let skewed_each = (vectors - regular * PER_PERSON) / SKEWED_PEOPLE;
        for p in 0..SKEWED_PEOPLE {
            let count = if p + 1 == SKEWED_PEOPLE {
                vectors - regular * PER_PERSON - skewed_each * (SKEWED_PEOPLE - 1)
            } else {
                skewed_each
            };
            plan.push((format!("phone:+1666{p:07}"), count, true));
        }
        let mut start = 0;
        let people = plan
            .into_iter()
            .map(|(id, count, skewed)| {
                let person = Person {
                    id,
                    start,
                    count,
                    topics: [0; 4].map(|_| rng.random_range(0..topics)),
                    skewed,
                };
                start += count;
                person
            })
            .collect();
        Corpus {
            dims,
            topics,
            centroids,
            basis,
            words,
            people,
        }
    }

    /// A noisy copy of topic `t`'s centroid.
    pub fn sample(&self, t: usize, rng: &mut StdRng, out: &mut [f32]) {
        let d = self.dims;
        out.copy_from_slice(&self.centroids[t * d..(t + 1) * d]);
        for j in 0..SUBSPACE {
            let g = gauss(rng) * SUBSPACE_SIGMA;
            let b = &self.basis[(t * SUBSPACE + j) * d..(t * SUBSPACE + j + 1) * d];
            out.iter_mut().zip(b).for_each(|(o, b)| *o += g * b);
        }
        out.iter_mut().for_each(|o| *o += gauss(rng) * ISO_SIGMA);
        normalise(out);
    }

    pub fn text(&self, t: usize, rng: &mut StdRng) -> String {
        let n = rng.random_range(6..=12);
        let words: Vec<&str> = (0..n)
            .map(|_| {
                if rng.random_bool(0.5) {
                    self.words[t][rng.random_range(0..WORDS_PER_TOPIC)].as_str()
                } else {
                    COMMON_WORDS[rng.random_range(0..COMMON_WORDS.len())]
                }
            })
            .collect();
        words.join(" ")
    }

    /// Two words of topic `t`: what a person searching for it would type.
    pub fn query_text(&self, t: usize, rng: &mut StdRng) -> String {
        let a = rng.random_range(0..WORDS_PER_TOPIC);
        let b = (a + rng.random_range(1..WORDS_PER_TOPIC)) % WORDS_PER_TOPIC;
        format!("{} {}", self.words[t][a], self.words[t][b])
    }
}

/// What the exact answers need of each stored row.
pub struct Rows {
    pub vectors: Vec<f32>,
    pub agent: Vec<u8>,
    pub ids: Vec<Uuid>,
}

pub fn session_id(person: usize, agent: usize) -> Uuid {
    Uuid::from_u128(
        0x5b5b_0000_0000_4000_8000_0000_0000_0000 | ((person as u128) << 8) | agent as u128,
    )
}

/// 2026-08-01T00:00:00Z: the messages span the 90 days after it (before any real clock's now).
pub const BASE_MS: u64 = 1_785_542_400_000;

/// One chunk of rows: the COPY text of its messages and of its vectors.
pub struct Chunk {
    pub rows: usize,
    pub messages: Vec<u8>,
    pub vectors: Vec<u8>,
}

/// Generates every row in order; `sink` gets each chunk's COPY text (`None`: only the rows).
pub fn generate(
    corpus: &Corpus,
    total: usize,
    seed: u64,
    model: &str,
    mut sink: Option<tokio::sync::mpsc::Sender<Chunk>>,
) -> Rows {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9);
    let dims = corpus.dims;
    let mut rows = Rows {
        vectors: vec![0.0; total * dims],
        agent: vec![0; total],
        ids: Vec::with_capacity(total),
    };
    let spacing_ms = (90 * 86_400_000 / total.max(1)) as u64;
    let mut chunk = Chunk {
        rows: 0,
        messages: Vec::new(),
        vectors: Vec::new(),
    };
    for (p, person) in corpus.people.iter().enumerate() {
        for k in 0..person.count {
            let i = person.start + k;
            let topic = if rng.random_bool(0.8) {
                person.topics[rng.random_range(0..4)]
            } else {
                rng.random_range(0..corpus.topics)
            };
            let a = rng.random_range(0..AGENTS.len());
            let (agent, identity, channel) = AGENTS[a];
            let v = &mut rows.vectors[i * dims..(i + 1) * dims];
            corpus.sample(topic, &mut rng, v);
            let ms = BASE_MS + i as u64 * spacing_ms;
            let id = uuid::Builder::from_unix_timestamp_millis(ms, &rng.random()).into_uuid();
            rows.agent[i] = a as u8;
            rows.ids.push(id);
            let text = corpus.text(topic, &mut rng);
            if sink.is_none() {
                continue;
            }
            let at = chrono::DateTime::from_timestamp_millis(ms as i64)
                .expect("in range")
                .to_rfc3339();
            let direction = if k % 2 == 0 { "inbound" } else { "outbound" };
            let m = format!(
                "{id}\t{}\t{}\t{agent}\t{identity}\t{direction}\t{channel}\t{text}\tbench-{i}\t{at}\t{model}\n",
                session_id(p, a),
                person.id
            );
            chunk.messages.extend_from_slice(m.as_bytes());
            let mut line = format!("{id}\t{model}\t{}\t{identity}\t{dims}\t[", person.id);
            for (j, x) in v.iter().enumerate() {
                if j > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{x}");
            }
            let _ = writeln!(line, "]\t{at}");
            chunk.vectors.extend_from_slice(line.as_bytes());
            chunk.rows += 1;
            if chunk.rows == CHUNK || i + 1 == total {
                let full = std::mem::replace(
                    &mut chunk,
                    Chunk {
                        rows: 0,
                        messages: Vec::new(),
                        vectors: Vec::new(),
                    },
                );
                if let Some(tx) = &sink
                    && tx.blocking_send(full).is_err()
                {
                    // The loader stopped (it reports why); the rows are still generated.
                    sink = None;
                }
            }
        }
    }
    rows
}

/// A query: its vector, its text, and whose messages it searches.
#[derive(Clone)]
pub struct Query {
    /// Queries with the same vector share its number (a search and its agent-filtered twin).
    pub vector_id: usize,
    pub vector: Vec<f32>,
    pub text: String,
    /// Recall: the person (index) and agent identity.
    pub person: Option<(usize, &'static str)>,
    /// Search: the agent filter.
    pub agent: Option<usize>,
}

impl Query {
    pub fn admits(&self, rows: &Rows, i: usize) -> bool {
        let a = rows.agent[i] as usize;
        self.person
            .is_none_or(|(_, identity)| AGENTS[a].1 == identity)
            && self.agent.is_none_or(|want| want == a)
    }
}

pub fn make_queries(corpus: &Corpus, n: usize, seed: u64) -> (Vec<Query>, Vec<Query>, Vec<Query>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0f0e);
    let mut vector = vec![0f32; corpus.dims];
    let regular = corpus.people.iter().filter(|p| !p.skewed).count();
    let recall = (0..n)
        .map(|i| {
            // One in ten asks for a skewed person (thousands of messages).
            let p = if i % 10 == 9 {
                regular + rng.random_range(0..corpus.people.len() - regular)
            } else {
                rng.random_range(0..regular)
            };
            let t = corpus.people[p].topics[rng.random_range(0..4)];
            corpus.sample(t, &mut rng, &mut vector);
            Query {
                vector_id: i,
                vector: vector.clone(),
                text: corpus.query_text(t, &mut rng),
                person: Some((
                    p,
                    if rng.random_bool(0.5) {
                        "reggie"
                    } else {
                        "nova"
                    },
                )),
                agent: None,
            }
        })
        .collect();
    let search: Vec<Query> = (0..n)
        .map(|i| {
            let t = rng.random_range(0..corpus.topics);
            corpus.sample(t, &mut rng, &mut vector);
            Query {
                vector_id: n + i,
                vector: vector.clone(),
                text: corpus.query_text(t, &mut rng),
                person: None,
                agent: None,
            }
        })
        .collect();
    let agent = search
        .iter()
        .map(|q| Query {
            agent: Some(0),
            ..q.clone()
        })
        .collect();
    (recall, search, agent)
}
