//! Merging the summary so far and the new messages into the next summary: by the configured
//! model, or (none configured) extractively. A model's answer that cannot be the summary (an
//! error, a timeout, garbage, nothing, cut off or over the size cap) is refused: the caller
//! keeps the old summary and the messages stay unsummarised.
use switchboard_memory::{ChatError, ChatModel, extractive};

use crate::store::Message;

/// How a summary was made (`summaries.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Model,
    Extractive,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Model => "model",
            Method::Extractive => "extractive",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Model(#[from] ChatError),
    #[error("the model's summary has {chars} characters, over the cap of {max}")]
    TooLong { chars: usize, max: usize },
}

/// The instructions the model gets.
pub fn system_prompt(max_chars: usize) -> String {
    format!(
        "You keep the running summary of one person's conversation with an assistant, across \
         every channel they used. Merge the previous summary and the new messages into one \
         updated summary: the facts, requests, decisions and open questions worth remembering, \
         in the order they happened. Do not invent anything. Write plain text of at most \
         {max_chars} characters, and answer with the summary only."
    )
}

/// The model's input: the previous summary, then the new messages oldest first, each with
/// when, where and who.
pub fn user_prompt(previous: &str, messages: &[Message]) -> String {
    let mut out = String::from("Previous summary:\n");
    if previous.trim().is_empty() {
        out.push_str("(none yet)\n");
    } else {
        out.push_str(previous.trim());
        out.push('\n');
    }
    out.push_str("\nNew messages, oldest first:\n");
    for m in messages {
        let who = if m.direction == "inbound" {
            "person"
        } else {
            "assistant"
        };
        out.push_str(&format!(
            "[{} {} via {}] {who}: {}\n",
            m.created_at.format("%Y-%m-%d %H:%M UTC"),
            m.channel,
            m.agent_name,
            m.message.trim()
        ));
    }
    out
}

/// The messages of `messages` (oldest first) whose prompt fits `budget` characters beside the
/// previous summary: at least one, so a run always makes progress. The rest wait for the next
/// run, never cut out of a prompt unseen while being marked summarised.
pub fn fitting(previous: &str, messages: &[Message], budget: usize) -> usize {
    let mut used = user_prompt(previous, &[]).chars().count();
    let mut n = 0;
    for m in messages {
        let line = user_prompt("", std::slice::from_ref(m)).chars().count()
            - user_prompt("", &[]).chars().count();
        if n > 0 && used + line > budget {
            break;
        }
        used += line;
        n += 1;
    }
    n
}

/// The next summary and how it was made.
pub async fn merge(
    model: Option<&ChatModel>,
    previous: &str,
    messages: &[Message],
    covered_after: u64,
    max_chars: usize,
) -> Result<(String, Method), MergeError> {
    let Some(model) = model else {
        let texts: Vec<&str> = messages.iter().map(|m| m.message.as_str()).collect();
        let out = extractive::summarise(previous, &texts, covered_after, max_chars);
        return Ok((out.text, Method::Extractive));
    };
    let answer = model
        .complete(&system_prompt(max_chars), &user_prompt(previous, messages))
        .await?;
    let chars = answer.chars().count();
    if chars > max_chars {
        return Err(MergeError::TooLong {
            chars,
            max: max_chars,
        });
    }
    Ok((answer, Method::Model))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(direction: &str, channel: &str, text: &str) -> Message {
        Message {
            id: uuid::Uuid::now_v7(),
            direction: direction.into(),
            channel: channel.into(),
            agent_name: "reggie_oc".into(),
            message: text.into(),
            created_at: chrono::DateTime::from_timestamp(1_764_000_000, 0).unwrap(),
        }
    }

    #[test]
    fn the_prompt_has_the_previous_summary_then_each_message_with_where_and_who() {
        let p = user_prompt(
            "Ana works nights.",
            &[
                message("inbound", "sms", "swap Friday?"),
                message("outbound", "sms", "done"),
            ],
        );
        assert_eq!(
            p,
            "Previous summary:\nAna works nights.\n\nNew messages, oldest first:\n\
             [2025-11-24 16:00 UTC sms via reggie_oc] person: swap Friday?\n\
             [2025-11-24 16:00 UTC sms via reggie_oc] assistant: done\n"
        );
    }

    #[test]
    fn a_batch_is_cut_to_what_the_prompt_holds_but_never_to_nothing() {
        let ms: Vec<Message> = (0..10)
            .map(|i| {
                message(
                    "inbound",
                    "sms",
                    &format!("message number {i} {}", "x".repeat(50)),
                )
            })
            .collect();
        assert_eq!(fitting("", &ms, 100_000), 10);
        let some = fitting("", &ms, 400);
        assert!((1..10).contains(&some), "{some}");
        assert!(user_prompt("", &ms[..some]).chars().count() <= 400);
        assert_eq!(fitting("", &ms, 0), 1);
    }
}
