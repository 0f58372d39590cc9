//! The memory half of the pipeline, as a library: the clients of the models the memory workers
//! use ([`chat`]: an OpenAI-compatible chat model; [`embed`]: embedding providers) and what the
//! workers and their readers share. The workers themselves are stages of their own crates
//! (`summary`, `embed`, `categorise`); recall, search and analytics read what they write.
pub mod analytics;
pub mod categories;
pub mod chat;
pub mod curated;
pub mod embed;
pub mod extractive;
pub mod handoff;
pub mod index;
pub mod recall;
pub mod search;

pub use chat::{ChatError, ChatModel};

/// Outbound rows that are not part of the conversation (`messages.metadata.kind`): the agent's
/// silent answer to the flush before a reset and a heartbeat's "nothing needs attention". They
/// are logged, never sent; summaries and recall leave them out. The generated column
/// `messages.conversation` lists the same kinds (migration `embed_marks`; a test checks that
/// they agree), for the statements and partial indexes that need it.
pub const NOT_CONVERSATION: &[&str] = &["memory_flush", "heartbeat_ok"];
pub use embed::{EmbedError, Embedder};
