//! What the embedding tests check of every model alike: its vectors against reference vectors
//! computed by the model's own code (`tests/fixtures/embedding/`), and that it ranks a
//! paraphrase above unrelated messages.
use switchboard_memory::embed::{Embedder, cosine};

/// A fixture of `tests/fixtures/embedding/`: texts and the vectors the model's own code gives.
#[derive(serde::Deserialize)]
pub struct Reference {
    pub model: String,
    pub texts: Vec<String>,
    pub vectors: Vec<Vec<f32>>,
}

/// `tests/fixtures/embedding/<file>`.
pub fn reference(file: &str) -> Reference {
    let path = format!("{}/fixtures/embedding/{file}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).expect(&path)
}

/// The message nearest to "when is my next shift" among six, one of them its paraphrase
/// ("what time do I work tomorrow"), with every message's similarity, nearest first.
pub async fn nearest_to_a_question_about_shifts(embedder: &dyn Embedder) -> Vec<(f32, String)> {
    let query = "when is my next shift".to_string();
    let history: Vec<String> = [
        "The fire alarm in building C went off during lunch.",
        "Can you reset my password for the rostering app?",
        "what time do I work tomorrow",
        "thanks, have a lovely weekend!",
        "I need to apply for annual leave in March.",
        "Mary enjoyed her walk by the river today.",
    ]
    .map(String::from)
    .to_vec();
    let q = &embedder.embed(std::slice::from_ref(&query)).await.unwrap()[0];
    let vs = embedder.embed(&history).await.unwrap();
    let mut ranked: Vec<(f32, String)> = vs
        .iter()
        .zip(history)
        .map(|(v, t)| (cosine(q, v), t))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
}

/// The paraphrase [`nearest_to_a_question_about_shifts`] must rank first.
pub const SHIFT_PARAPHRASE: &str = "what time do I work tomorrow";
