//! Settings of the memory half of the pipeline: `[llm]`, `[embedding]`, `[summary]`,
//! `[categorise]`, `[recall]` and `[memory]`.
use serde::{Deserialize, Serialize};

use super::Secret;

/// `[llm]`: an OpenAI-compatible chat model (`POST {base_url}/chat/completions`) for summaries
/// and categories. Empty `base_url`: none configured, the offline defaults are used (an
/// extractive summary, the nearest label by embedding).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct LlmConfig {
    /// e.g. `https://api.openai.com/v1` (the path up to and without `/chat/completions`).
    pub base_url: String,
    pub model: String,
    pub api_key: Secret,
    pub timeout_s: u64,
    /// The most tokens the model may answer with; a longer answer is refused as over budget.
    pub max_tokens: u32,
    /// The prompt sent to the model is cut to this many characters (oldest text first).
    pub max_prompt_chars: usize,
}

impl LlmConfig {
    pub fn is_configured(&self) -> bool {
        !self.base_url.trim().is_empty()
    }
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            model: String::new(),
            api_key: Secret::default(),
            timeout_s: 30,
            max_tokens: 512,
            max_prompt_chars: 24_000,
        }
    }
}

/// `[embedding] provider`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingProvider {
    /// In the process, offline: all-MiniLM-L6-v2 from the files `model_dir` holds.
    #[default]
    Local,
    /// An OpenAI-compatible `POST {base_url}/embeddings`.
    OpenAi,
    /// In the process, offline: a static token table (mean of the tokens' rows) from
    /// `static_dir`; ~100x cheaper than MiniLM and less exact (docs/embedding-runtime.md).
    Static,
}

/// The model id `[embedding] model` has when not set: the local provider's MiniLM.
pub const DEFAULT_EMBEDDING_MODEL: &str = "all-MiniLM-L6-v2";
/// The id and width of the static model the stack tool fetches (WordLlama l2_supercat_256).
pub const STATIC_EMBEDDING_MODEL: &str = "wordllama-l2-supercat-256";
pub const STATIC_EMBEDDING_DIMENSIONS: usize = 256;

/// `[embedding] runtime`: what runs the local provider's model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalRuntime {
    /// ONNX Runtime when `onnx_runtime` and `onnx_model` are set and load (about twice candle's
    /// speed, docs/embedding-runtime.md), candle otherwise; the log says which serves.
    #[default]
    Auto,
    /// ONNX Runtime only: an error when it cannot be loaded.
    Onnx,
    /// candle only (pure Rust, needs no shared library).
    Candle,
}

/// `[embedding]`: how messages become vectors.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct EmbeddingConfig {
    pub provider: EmbeddingProvider,
    /// Stored with every vector; a change of model is a `switchboard reembed`.
    pub model: String,
    /// The model's vector size.
    pub dimensions: usize,
    /// Local provider: the folder with `model.safetensors`, `config.json` and `tokenizer.json`
    /// (empty: the embedded stack's copy, fetched by `make run`/`make test`).
    pub model_dir: String,
    /// Local provider: which runtime runs the model.
    pub runtime: LocalRuntime,
    /// Local provider on ONNX Runtime: the path of `libonnxruntime.so` (version 1.31.x, from
    /// the `onnxruntime` wheel; `target/debug/stack env <name>` prints the copy it fetches).
    pub onnx_runtime: String,
    /// Local provider on ONNX Runtime: the model's graph (`minilm_onnx.py` derives it from
    /// `model_dir`'s safetensors); the tokenizer still comes from `model_dir`.
    pub onnx_model: String,
    /// Local provider on ONNX Runtime: threads one embedding uses (0: one per core).
    pub threads: usize,
    /// Static provider: the folder with `model.safetensors` (the token table) and
    /// `tokenizer.json` (`target/debug/stack env <name>` prints the copy it fetches).
    pub static_dir: String,
    /// OpenAI-compatible provider.
    pub base_url: String,
    pub api_key: Secret,
    pub timeout_s: u64,
    /// Texts embedded in one call.
    pub batch: usize,
    /// Lists of the vector index a search across people reads (pgvector's `ivfflat.probes`):
    /// more finds more of the true nearest messages, and takes longer (docs/bench-memory.md
    /// measures both at 1,000,000 vectors, 1,000 lists). A person's recall and search are exact
    /// whatever this says, and so is every search while the index has no more lists than this.
    pub ivfflat_probes: u32,
}

/// `[embedding] ivfflat_probes` when not set: at 1M vectors (1,000 lists) the memory bench's
/// searches found the true top 10 (recall@10 1.000) at p99 20 ms; 10 probes did as well at 15 ms
/// on its clustered data, so this keeps a margin for vectors less clustered than the bench's
/// (docs/bench-memory.md).
pub const DEFAULT_IVFFLAT_PROBES: u32 = 20;
/// The most `ivfflat.probes` taken (an index has at most 32,768 lists).
pub const MAX_IVFFLAT_PROBES: u32 = 32_768;

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            provider: EmbeddingProvider::Local,
            model: DEFAULT_EMBEDDING_MODEL.into(),
            dimensions: 384,
            model_dir: String::new(),
            runtime: LocalRuntime::Auto,
            onnx_runtime: String::new(),
            onnx_model: String::new(),
            threads: 0,
            static_dir: String::new(),
            base_url: String::new(),
            api_key: Secret::default(),
            timeout_s: 30,
            batch: 64,
            ivfflat_probes: DEFAULT_IVFFLAT_PROBES,
        }
    }
}

/// `[summary]`: when and how the summary worker merges a conversation into its summary.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct SummaryConfig {
    /// A person + identity quiet this long gets its unsummarised messages merged.
    pub idle_gap_s: u64,
    /// How often the sweeper looks for quiet conversations.
    pub sweep_every_s: u64,
    /// The summary is kept under this many characters.
    pub max_summary_chars: usize,
    /// The most messages merged in one run (older first; the rest in the next run).
    pub max_messages: usize,
}

impl Default for SummaryConfig {
    fn default() -> Self {
        Self {
            idle_gap_s: 3_600,
            sweep_every_s: 60,
            max_summary_chars: 4_000,
            max_messages: 400,
        }
    }
}

/// One label of `[categorise] labels`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct CategoryLabel {
    pub name: String,
    /// What the label means: shown to the model, and embedded for the offline default.
    pub description: String,
}

/// `[categorise]`: the labels an exchange may get. `other` is always one of them.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct CategoriseConfig {
    pub labels: Vec<CategoryLabel>,
}

impl Default for CategoriseConfig {
    fn default() -> Self {
        let labels = [
            (
                "roster_query",
                "Questions about shifts, rosters, schedules, working hours, when someone works next.",
            ),
            (
                "policy_question",
                "Questions about rules, policies, procedures, entitlements or what is allowed.",
            ),
            (
                "hr_request",
                "Leave, pay, payslips, timesheets, contracts, personal details and other HR requests.",
            ),
            (
                "participant_care",
                "The care, support, wellbeing, needs or plan of a participant or client.",
            ),
            (
                "incident_report",
                "Reporting an incident, accident, injury, hazard, complaint or something that went wrong.",
            ),
            (
                "casual_chat",
                "Greetings, thanks, small talk and chat with no request in it.",
            ),
            (
                "escalation",
                "Urgent matters, asking for a manager or a human, dissatisfaction to be escalated.",
            ),
            (
                "technical_support",
                "Problems with apps, logins, passwords, phones, devices or systems.",
            ),
            ("other", "Anything else."),
        ];
        Self {
            labels: labels
                .into_iter()
                .map(|(name, description)| CategoryLabel {
                    name: name.into(),
                    description: description.into(),
                })
                .collect(),
        }
    }
}

/// `[recall]`: earlier messages of the same person + identity put into the prompt.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct RecallConfig {
    pub enabled: bool,
    /// At most this many earlier messages.
    pub top_k: usize,
    /// The recall block is cut to this many characters.
    pub max_chars: usize,
    /// Category counts of the person over this many days ("asked about rosters 3 times").
    pub category_days: u32,
}

impl Default for RecallConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            top_k: 5,
            max_chars: 2_000,
            category_days: 7,
        }
    }
}

/// `[memory]`: the curated memory (`memory.md`) of a person + identity.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct MemoryConfig {
    /// The curated memory is cut to this many characters, with a visible marker.
    pub max_chars: usize,
    /// The agent's daily notes (`memory/YYYY-MM-DD.md` in the workspace, today's and
    /// yesterday's) are cut to this many characters together, with a visible marker.
    pub daily_notes_max_chars: usize,
    /// The time zone whose calendar names the daily notes' days (an IANA name).
    pub daily_notes_timezone: String,
}

impl MemoryConfig {
    /// [`Self::daily_notes_timezone`], or why it names none.
    pub fn daily_notes_tz(&self) -> Result<chrono_tz::Tz, String> {
        self.daily_notes_timezone.parse().map_err(|_| {
            format!(
                "{:?} is not an IANA time zone name (e.g. \"UTC\", \"Europe/London\")",
                self.daily_notes_timezone
            )
        })
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_chars: 8_000,
            daily_notes_max_chars: 4_000,
            daily_notes_timezone: "UTC".into(),
        }
    }
}
