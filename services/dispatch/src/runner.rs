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
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("runner unreachable or timed out: {0}")]
    Unavailable(#[source] reqwest::Error),
    #[error("runner busy or failing (HTTP {status}): {body}")]
    Failing { status: u16, body: String },
    #[error("runner rejected the turn (HTTP {status}): {body}")]
    Rejected { status: u16, body: String },
    #[error("runner answered something that is not a run response: {0}")]
    BadResponse(String),
    /// The call was cancelled at the runner (`DELETE /run/<key>`: queue mode interrupt).
    #[error("the runner call was cancelled")]
    Cancelled,
}

impl RunnerError {
    /// Whether it says the runner itself is down (unreachable, or answering 503/429), as
    /// opposed to this turn failing on it (an engine error, a timeout): the circuit breaker
    /// counts only these. A runner behind a proxy that answers 502/504 for a dead upstream
    /// looks like failing turns, not a down runner.
    pub fn means_runner_down(&self) -> bool {
        match self {
            RunnerError::Unavailable(e) => e.is_connect(),
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

/// A runner's `{"error": {"code": "cancelled"}}`.
fn is_cancelled(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| v["error"]["code"] == "cancelled")
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
        let resp = req.send().await.map_err(RunnerError::Unavailable)?;
        let status = resp.status();
        tracing::Span::current().record("http.response.status_code", status.as_u16());
        if status.is_success() {
            let body = resp.bytes().await.map_err(RunnerError::Unavailable)?;
            let parsed: RunResponse = serde_json::from_slice(&body)
                .map_err(|e| RunnerError::BadResponse(e.to_string()))?;
            if parsed.session_id.is_empty() {
                return Err(RunnerError::BadResponse("empty session_id".into()));
            }
            return Ok(parsed);
        }
        let body: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(500)
            .collect();
        let status = status.as_u16();
        if status == 409 && is_cancelled(&body) {
            return Err(RunnerError::Cancelled);
        }
        if status >= 500 || status == 408 || status == 429 {
            Err(RunnerError::Failing { status, body })
        } else {
            Err(RunnerError::Rejected { status, body })
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
        let resp = req.send().await.map_err(RunnerError::Unavailable)?;
        Ok(resp.status().as_u16())
    }
}
