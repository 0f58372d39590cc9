//! A channel's way out: send one part of a reply, and read the provider's answer.
use std::time::Duration;

use futures::future::BoxFuture;

/// One part of a reply, ready to send.
#[derive(Debug, Clone, Copy)]
pub struct OutboundPart<'a> {
    /// The person's address (the inbound message's sender).
    pub to: &'a str,
    /// The address the person wrote to (our number), for providers with several.
    pub from: &'a str,
    pub text: &'a str,
    /// The reply's id: providers that keep a reference of ours store it.
    pub reply_id: &'a str,
    /// Which part of the reply this is (0-based).
    pub index: usize,
}

/// How a send went wrong, as the provider's answer says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The provider is down, overloaded or unreachable, or refused our credentials (which an
    /// operator can fix): retry with backoff, then dead-letter (replayable once fixed).
    #[error("provider unavailable: {0}")]
    Unavailable(String),
    /// The provider asked us to slow down (HTTP 429): retry no sooner than `retry_after`.
    #[error("provider is throttling us (retry after {retry_after:?}): {detail}")]
    Throttled {
        retry_after: Option<Duration>,
        detail: String,
    },
    /// The message itself is wrong for this recipient (invalid number, opted out, too long):
    /// sending it again cannot help.
    #[error("provider rejected the message: {0}")]
    Rejected(String),
}

/// A channel's egress.
pub trait Egress: Send + Sync + 'static {
    /// Split a reply into the parts this provider takes, in order.
    fn split(&self, text: &str) -> Vec<String>;
    /// Send one part; the provider's id for it on success.
    fn send<'a>(&'a self, part: OutboundPart<'a>) -> BoxFuture<'a, Result<String, SendError>>;
}

/// Split a reply into bodies of at most `max` characters, preferring to break at whitespace.
pub fn split_message(text: &str, max: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    while start < chars.len() {
        let mut end = (start + max).min(chars.len());
        if end < chars.len()
            && let Some(ws) = chars[start..end].iter().rposition(|c| c.is_whitespace())
            && ws > max / 2
        {
            end = start + ws + 1;
        }
        let part: String = chars[start..end].iter().collect();
        let trimmed = part.trim_end();
        if !trimmed.is_empty() {
            parts.push(trimmed.to_string());
        }
        start = end;
    }
    parts
}

/// `Retry-After` in seconds, if the provider sent one.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// At most 300 characters of a provider's answer, for errors and dead letters.
pub(crate) fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_replies_are_split_at_whitespace_within_the_limit() {
        let text = "word ".repeat(700); // 3,500 chars
        let parts = split_message(&text, 1600);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.chars().count() <= 1600));
        assert_eq!(parts.join(" "), text.trim_end());
    }

    #[test]
    fn a_short_reply_is_one_part_and_multibyte_text_counts_characters() {
        assert_eq!(split_message("hi", 1600), vec!["hi"]);
        let emoji = "é".repeat(1600);
        assert_eq!(split_message(&emoji, 1600).len(), 1);
        assert!(split_message("", 1600).is_empty());
    }
}
