//! The HTTP client for an agent host's runner (`POST {runner_url}/run`).
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchboard_kit::config::AgentConfig;
use switchboard_kit::turn_token::{TurnClaims, TurnTokenKeys};
use tracing::Instrument as _;

#[derive(Debug, Serialize)]
pub struct RunRequest<'a> {
    pub agent: &'a str,
    pub prompt: &'a str,
    pub session_id: Option<&'a str>,
    pub correlation_id: &'a str,
    /// The session's folder, on storage the agent host mounts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<&'a str>,
    /// The agent's queue mode (`followup`, `collect`, `interrupt`).
    pub queue_mode: &'a str,
    /// The turn's token (`sbt_…`): the engine calls the API with it, as this turn's person's
    /// agent and nobody else's (docs/agent-tools.md). The runner hands it to the engine in
    /// `SWITCHBOARD_TURN_TOKEN`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_token: Option<String>,
    /// Where the engine calls the API (the gateway's public URL): `SWITCHBOARD_API_URL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_url: Option<&'a str>,
}

/// What dispatch gives each runner call to reach the API with: a turn token and the URL.
#[derive(Clone)]
pub struct TurnCredentials {
    keys: TurnTokenKeys,
    api_url: String,
}

impl TurnCredentials {
    pub fn new(db: sqlx::PgPool, config: &switchboard_kit::Config) -> Self {
        Self {
            keys: TurnTokenKeys::new(db, config.gateway.turn_token_secret.clone()),
            api_url: config.gateway.public_url.trim_end_matches('/').to_string(),
        }
    }

    /// A token for the turn of `person` with `agent` in `session`, valid for the agent's call
    /// timeout plus a margin; and the API's URL.
    pub async fn for_turn(
        &self,
        agent: &AgentConfig,
        person: &str,
        session: &str,
        correlation_id: &str,
    ) -> Result<(String, &str), sqlx::Error> {
        let claims = TurnClaims::for_turn(
            person,
            &agent.identity,
            &agent.name,
            session,
            correlation_id,
            agent.timeout_s,
        );
        let token = self.keys.get().await?.mint(&claims);
        Ok((token, &self.api_url))
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RunResponse {
    pub text: String,
    pub session_id: String,
    #[serde(default)]
    pub processing_ms: i64,
    #[serde(default)]
    pub tool_calls_count: i64,
    /// The tools the engine called, by name (bounded by [`tool_names`] before it is kept).
    #[serde(default)]
    pub tool_names: Vec<String>,
}

/// The most tool names a reply keeps, and the longest name: a runner's answer is bounded like
/// any input (the runner bounds them too; something posing as a runner may not).
const MAX_TOOL_NAMES: usize = 32;
const MAX_TOOL_NAME_CHARS: usize = 64;

/// `reported` without control characters, trimmed, each cut at 64 characters, once each, at
/// most 32.
pub fn tool_names(reported: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in reported {
        let name: String = name
            .chars()
            .filter(|c| !c.is_control())
            .collect::<String>()
            .trim()
            .chars()
            .take(MAX_TOOL_NAME_CHARS)
            .collect();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
        if names.len() == MAX_TOOL_NAMES {
            break;
        }
    }
    names
}

/// The most of a runner's answer that is read: a reply is at most the engine's capped output
/// (the runner's `max_output_bytes`, 4 MiB by default) in JSON. A runner (or something posing
/// as one) that sends more fails the turn instead of filling this process's memory.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// The most of a runner's error answer that is read (it is only logged).
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// A failure's text is kept generic on purpose: it becomes the turn's error, which the API
/// shows its caller (`GET /api/v1/messages/<id>`). What the runner said (the engine's stderr
/// may hold keys, paths, the person's data) and where it is (its URL) are logged here, under
/// the turn's correlation id, and never put in the error.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("the agent's runner is unreachable or timed out ({0})")]
    Unavailable(Unreachable),
    #[error(
        "the agent's runner is busy or failing (HTTP {status}{})",
        code_suffix(code)
    )]
    Failing { status: u16, code: String },
    #[error(
        "the agent's runner rejected the turn (HTTP {status}{})",
        code_suffix(code)
    )]
    Rejected { status: u16, code: String },
    #[error("the agent's runner answered something that is not a run response")]
    BadResponse,
    #[error("the agent's runner answered more than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
    /// The call was cancelled at the runner (`DELETE /run/<key>`: queue mode interrupt).
    #[error("the runner call was cancelled")]
    Cancelled,
}

/// How a runner could not be reached (the transport's own error is logged, not kept: it names
/// the runner's address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreachable {
    /// No connection could be made: the runner is down.
    Connect,
    Timeout,
    /// The connection broke, or the answer could not be read.
    Broken,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unreachable::Connect => "no connection",
            Unreachable::Timeout => "timed out",
            Unreachable::Broken => "connection broken",
        })
    }
}

impl Unreachable {
    fn of(e: &reqwest::Error) -> Self {
        if e.is_connect() {
            Unreachable::Connect
        } else if e.is_timeout() {
            Unreachable::Timeout
        } else {
            Unreachable::Broken
        }
    }
}

fn code_suffix(code: &str) -> String {
    if code.is_empty() {
        String::new()
    } else {
        format!(" {code}")
    }
}

/// The runner's error code (`{"error": {"code": "engine_failed"}}`), when it is a plain word:
/// it says what failed without anything the engine printed.
fn error_code(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .filter(|c| {
            c.len() <= 40
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .unwrap_or_default()
}

/// A body read up to `cap` bytes; `None` when it is longer.
async fn read_capped(
    resp: &mut reqwest::Response,
    cap: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > cap {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

impl RunnerError {
    /// Whether it says the runner itself is down (unreachable, or answering 503/429), as
    /// opposed to this turn failing on it (an engine error, a timeout): the circuit breaker
    /// counts only these. A runner behind a proxy that answers 502/504 for a dead upstream
    /// looks like failing turns, not a down runner.
    pub fn means_runner_down(&self) -> bool {
        match self {
            RunnerError::Unavailable(e) => *e == Unreachable::Connect,
            RunnerError::Failing { status, .. } => matches!(status, 503 | 429),
            _ => false,
        }
    }

    /// Whether trying again later can help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RunnerError::Unavailable(_) | RunnerError::Failing { .. }
        )
    }
}

#[derive(Clone)]
pub struct RunnerClient {
    http: reqwest::Client,
}

impl Default for RunnerClient {
    fn default() -> Self {
        Self::new()
    }
}

impl RunnerClient {
    pub fn new() -> Self {
        Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()
                .expect("HTTP client"),
        }
    }

    /// Run one turn. `idempotency_key` is the same for every attempt at the same turn, so a
    /// runner can answer a retried call from its cache instead of running the engine twice.
    pub async fn run(
        &self,
        agent: &AgentConfig,
        request: &RunRequest<'_>,
        idempotency_key: &str,
    ) -> Result<RunResponse, RunnerError> {
        // The runner continues this span's trace (its `traceparent`), so the engine's run on
        // the agent host sits inside the turn's trace.
        let span = tracing::info_span!(
            "runner_call",
            otel.name = "POST /run",
            otel.kind = "client",
            agent = %agent.name,
            http.response.status_code = tracing::field::Empty,
        );
        self.call(agent, request, idempotency_key)
            .instrument(span)
            .await
    }

    async fn call(
        &self,
        agent: &AgentConfig,
        request: &RunRequest<'_>,
        idempotency_key: &str,
    ) -> Result<RunResponse, RunnerError> {
        let url = format!("{}/run", agent.runner_url.trim_end_matches('/'));
        let mut headers = reqwest::header::HeaderMap::new();
        switchboard_kit::trace::inject_http(&mut headers);
        let mut req = self
            .http
            .post(url)
            .timeout(Duration::from_secs(agent.timeout_s.max(1)))
            .headers(headers)
            .header("Idempotency-Key", idempotency_key)
            .json(request);
        if !agent.token.is_empty() {
            req = req.bearer_auth(agent.token.expose());
        }
        let correlation_id = request.correlation_id;
        let unreachable = |e: reqwest::Error| {
            tracing::warn!(correlation_id, error = %e, "runner call failed");
            RunnerError::Unavailable(Unreachable::of(&e))
        };
        let mut resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        let cap = if status.is_success() {
            MAX_ANSWER_BYTES
        } else {
            MAX_ERROR_BYTES
        };
        let body = read_capped(&mut resp, cap).await.map_err(unreachable)?;
        if status.is_success() {
            let Some(body) = body else {
                tracing::warn!(correlation_id, cap, "the runner's answer is too large");
                return Err(RunnerError::TooLarge);
            };
            let parsed = serde_json::from_slice::<RunResponse>(&body)
                .map_err(|e| e.to_string())
                .and_then(|r| match r.session_id.is_empty() {
                    true => Err("empty session_id".to_string()),
                    false => Ok(r),
                });
            return parsed.map_err(|e| {
                tracing::warn!(correlation_id, error = %e, "the runner's answer is not a run response");
                RunnerError::BadResponse
            });
        }
        let body = body.unwrap_or_default();
        let code = error_code(&body);
        let status = status.as_u16();
        if status == 409 && code == "cancelled" {
            return Err(RunnerError::Cancelled);
        }
        // The whole of what the runner said, for the operator; the error keeps its code.
        let said: String = String::from_utf8_lossy(&body).chars().take(2_000).collect();
        tracing::warn!(correlation_id, status, code, body = %said, "the runner failed the turn");
        if status >= 500 || status == 408 || status == 429 {
            Err(RunnerError::Failing { status, code })
        } else {
            Err(RunnerError::Rejected { status, code })
        }
    }

    /// Cancel the call running under `idempotency_key` (`DELETE {runner_url}/run/<key>`): its
    /// process group is killed and the call answers `cancelled`. Whether there was one to
    /// cancel is the runner's business; an unreachable runner is an error.
    pub async fn cancel(
        &self,
        agent: &AgentConfig,
        idempotency_key: &str,
    ) -> Result<u16, RunnerError> {
        let url = format!(
            "{}/run/{}",
            agent.runner_url.trim_end_matches('/'),
            percent_encoding::utf8_percent_encode(
                idempotency_key,
                percent_encoding::NON_ALPHANUMERIC
            )
        );
        let mut req = self.http.delete(url).timeout(Duration::from_secs(10));
        if !agent.token.is_empty() {
            req = req.bearer_auth(agent.token.expose());
        }
        let resp = req.send().await.map_err(|e| {
            tracing::warn!(error = %e, "cancelling a runner call failed");
            RunnerError::Unavailable(Unreachable::of(&e))
        })?;
        Ok(resp.status().as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A fake runner that answers every call with this status line and JSON body.
    async fn answering(status: &'static str, body: &'static str) -> String {
        fake_runner(move |mut socket| async move {
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
        })
        .await
    }

    /// A fake runner on a raw socket: reads the request's head, then lets `answer` write.
    async fn fake_runner<F, Fut>(answer: F) -> String
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                // The request is small; its body follows the head in the same reads.
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                answer(socket).await;
            }
        });
        url
    }

    fn agent(url: &str) -> AgentConfig {
        AgentConfig {
            name: "reggie_oc".into(),
            runner_url: url.into(),
            timeout_s: 30,
            ..Default::default()
        }
    }

    async fn call(url: &str) -> Result<RunResponse, RunnerError> {
        let request = RunRequest {
            agent: "reggie_oc",
            prompt: "hello",
            session_id: None,
            correlation_id: "corr-1",
            workspace: None,
            queue_mode: "followup",
            turn_token: None,
            api_url: None,
        };
        RunnerClient::new()
            .run(&agent(url), &request, "turn:s:1")
            .await
    }

    #[tokio::test]
    async fn an_endless_answer_fails_the_call_at_the_cap_instead_of_filling_memory() {
        let url = fake_runner(|mut socket| async move {
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"text\":\"")
                .await;
            let chunk = vec![b'x'; 64 * 1024];
            // Endless: it stops only when the client hangs up.
            while socket.write_all(&chunk).await.is_ok() {}
        })
        .await;
        let started = std::time::Instant::now();
        let e = call(&url).await.unwrap_err();
        assert!(matches!(e, RunnerError::TooLarge), "{e:?}");
        assert!(!e.is_transient(), "retrying gets the same answer");
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn an_answer_under_the_cap_is_read() {
        let url = answering("200 OK", r#"{"text":"hi","session_id":"s-1"}"#).await;
        let r = call(&url).await.unwrap();
        assert_eq!((r.text.as_str(), r.session_id.as_str()), ("hi", "s-1"));
    }

    #[tokio::test]
    async fn what_the_runner_said_stays_out_of_the_turns_error() {
        // The engine's stderr in the runner's error (as an older or another runner sends it).
        let url = answering("502 Bad Gateway", r#"{"error":{"code":"engine_failed","message":"exit 3: OPENAI_API_KEY=sk-live-abc123 /home/agent/notes.md"}}"#).await;
        let e = call(&url).await.unwrap_err();
        let told = format!("{:#}", anyhow::Error::from(e));
        assert!(told.contains("HTTP 502 engine_failed"), "{told}");
        for leaked in ["sk-live", "/home/agent", "exit 3"] {
            assert!(!told.contains(leaked), "{leaked} in {told}");
        }

        // Nor a not-JSON answer's content, nor where the runner is.
        let url = answering("200 OK", r#"{"text": 5, "secret": "sk-live-abc123"}"#).await;
        let told = format!("{:#}", anyhow::Error::from(call(&url).await.unwrap_err()));
        assert!(!told.contains("invalid type"), "{told}");
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let e = call(&closed).await.unwrap_err();
        assert!(e.means_runner_down(), "{e:?}");
        let told = format!("{:#}", anyhow::Error::from(e));
        assert!(!told.contains("127.0.0.1"), "{told}");
    }
}
