//! An OpenAI-compatible chat model (`POST {base_url}/chat/completions`), as the summary and
//! categorisation workers use it: one system and one user message, the prompt capped, the
//! answer refused when it is empty, cut off by the token budget or over it. A refusal is an
//! error the caller keeps its old state on (a summary is never replaced by a bad answer).
use std::time::Duration;

use serde::Deserialize;
use switchboard_kit::memory_config::LlmConfig;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the model could not be reached: {0}")]
    Unreachable(String),
    #[error("the model answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the model's answer is not a chat completion: {0}")]
    Malformed(String),
    #[error("the model's answer is empty")]
    Empty,
    #[error("the model's answer went over its budget of {max_tokens} tokens ({why})")]
    OverBudget { max_tokens: u32, why: String },
}

impl ChatError {
    /// Whether asking again later may succeed. Every failure of a model may pass (a bad answer
    /// today can be a good one tomorrow) except an answer the endpoint refuses to give at all
    /// for the request itself (HTTP 400, 404, 422: a wrong model name or configuration).
    pub fn is_transient(&self) -> bool {
        !matches!(self, ChatError::Status { status, .. } if matches!(status, 400 | 401 | 403 | 404 | 422))
    }
}

/// A configured chat model.
#[derive(Clone)]
pub struct ChatModel {
    http: reqwest::Client,
    config: LlmConfig,
}

impl std::fmt::Debug for ChatModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatModel")
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .finish()
    }
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: AssistantMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct AssistantMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Option<u64>,
}

impl ChatModel {
    /// The model `[llm]` configures, or `None` when none is (`base_url` empty).
    pub fn from_config(config: &LlmConfig) -> Option<Self> {
        if !config.is_configured() {
            return None;
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_s.max(1)))
            .build()
            .expect("a reqwest client with a timeout builds");
        Some(Self {
            http,
            config: config.clone(),
        })
    }

    /// The model's name, as recorded beside what it wrote.
    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// The configured prompt cap, for callers that cut their own input sensibly first.
    pub fn max_prompt_chars(&self) -> usize {
        self.config.max_prompt_chars
    }

    /// Ask the model; its answer's text, trimmed.
    pub async fn complete(&self, system: &str, user: &str) -> Result<String, ChatError> {
        let user = keep_tail(
            user,
            self.config.max_prompt_chars.saturating_sub(system.len()),
        );
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let body = serde_json::json!({
            "model": self.config.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "max_tokens": self.config.max_tokens,
            "temperature": 0,
        });
        let mut request = self.http.post(&url).json(&body);
        if !self.config.api_key.is_empty() {
            request = request.bearer_auth(self.config.api_key.expose());
        }
        let timeout = Duration::from_secs(self.config.timeout_s.max(1));
        let response = request.send().await.map_err(|e| transport(e, timeout))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| transport(e, timeout))?;
        if !status.is_success() {
            return Err(ChatError::Status {
                status: status.as_u16(),
                body: text.chars().take(300).collect(),
            });
        }
        let completion: Completion = serde_json::from_str(&text)
            .map_err(|e| ChatError::Malformed(format!("{e}: {}", preview(&text))))?;
        let choice = completion
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| ChatError::Malformed("no choices".into()))?;
        let max_tokens = self.config.max_tokens;
        if choice.finish_reason.as_deref() == Some("length") {
            return Err(ChatError::OverBudget {
                max_tokens,
                why: "cut off at the limit".into(),
            });
        }
        if let Some(used) = completion.usage.and_then(|u| u.completion_tokens)
            && used > u64::from(max_tokens)
        {
            return Err(ChatError::OverBudget {
                max_tokens,
                why: format!("{used} tokens used"),
            });
        }
        let content = choice.message.content.unwrap_or_default();
        let content = content.trim();
        if content.is_empty() {
            return Err(ChatError::Empty);
        }
        Ok(content.to_string())
    }
}

/// A failure to send the request or read its answer.
fn transport(e: reqwest::Error, timeout: Duration) -> ChatError {
    if e.is_timeout() {
        ChatError::Timeout(timeout)
    } else {
        ChatError::Unreachable(e.without_url().to_string())
    }
}

/// The last `max` characters of `text` (the most recent part of a conversation), with a line
/// saying how much was left out when anything was.
pub fn keep_tail(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let total = text.chars().count();
    if total <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let skip = total - max;
    let start = text
        .char_indices()
        .nth(skip)
        .map(|(i, _)| i)
        .unwrap_or(text.len());
    std::borrow::Cow::Owned(format!(
        "[… {skip} earlier characters left out]\n{}",
        &text[start..]
    ))
}

fn preview(text: &str) -> String {
    text.chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_keeps_its_most_recent_part_and_says_what_was_left_out() {
        assert_eq!(keep_tail("abcdef", 10), "abcdef");
        let cut = keep_tail("abcdefghij", 4);
        assert_eq!(cut, "[… 6 earlier characters left out]\nghij");
    }

    #[test]
    fn only_a_request_the_endpoint_refuses_for_itself_is_not_worth_retrying() {
        let refused = ChatError::Status {
            status: 404,
            body: "no such model".into(),
        };
        assert!(!refused.is_transient());
        let busy = ChatError::Status {
            status: 429,
            body: String::new(),
        };
        assert!(busy.is_transient());
        assert!(ChatError::Empty.is_transient());
        assert!(ChatError::Timeout(Duration::from_secs(1)).is_transient());
    }
}
