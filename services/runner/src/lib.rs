//! The runner an agent host runs: `POST /run` executes the agent's engine CLI (OpenClaw, Factory
//! Droid, …) for one turn and answers with its reply and engine session id.
//!
//! What it promises (ARCHITECTURE §5, §16):
//! - a turn retried with the same `Idempotency-Key` never runs the engine twice: the outcome is
//!   written to `state_dir` before it is answered, and a call for a key in progress waits for
//!   that run instead of starting another, across a runner restart too;
//! - one run at a time per engine session (agent + session id);
//! - the timeout and `DELETE /run/<key>` kill the engine's whole process group;
//! - output is capped; the engine's session id is read from its JSON output.
pub mod config;
pub mod engine;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex as AsyncMutex, watch};

pub use config::RunnerConfig;
use engine::{EngineError, RunOutcome};
use store::{Outcome, ResultStore};

/// `POST /run`'s body.
#[derive(Debug, Deserialize)]
pub struct RunRequest {
    pub agent: String,
    pub prompt: String,
    pub session_id: Option<String>,
    #[serde(default)]
    pub correlation_id: String,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default)]
    pub queue_mode: Option<String>,
}

/// `POST /run`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResponse {
    pub text: String,
    pub session_id: String,
    pub processing_ms: i64,
    pub tool_calls_count: i64,
}

/// A run in progress: its process group (once started) and who waits for its outcome.
struct Running {
    pgid: Arc<Mutex<Option<i32>>>,
    cancelled: Arc<std::sync::atomic::AtomicBool>,
    done: watch::Receiver<Option<Outcome>>,
}

#[derive(Clone)]
pub struct Runner {
    config: Arc<RunnerConfig>,
    store: ResultStore,
    running: Arc<Mutex<HashMap<String, Running>>>,
    /// One run at a time per engine session.
    sessions: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"code": code, "message": message.into()}})),
    )
        .into_response()
}

impl Runner {
    pub fn new(config: RunnerConfig) -> anyhow::Result<Self> {
        let store = ResultStore::open(&config.state_dir)?;
        Ok(Self {
            config: Arc::new(config),
            store,
            running: Default::default(),
            sessions: Default::default(),
        })
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/run", post(run))
            .route("/run/{key}", delete(cancel))
            .route("/healthz", get(|| async { "ok" }))
            .with_state(self)
    }

    /// The 401 for a call without the configured bearer token.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        (!self.authorized(headers)).then(|| {
            error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required",
            )
        })
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(token) = self.config.token.as_deref().filter(|t| !t.is_empty()) else {
            return true;
        };
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        subtle::ConstantTimeEq::ct_eq(given.as_bytes(), token.as_bytes()).into()
    }

    fn session_lock(&self, agent: &str, session: &str) -> Arc<AsyncMutex<()>> {
        self.sessions
            .lock()
            .unwrap()
            .entry(format!("{agent}\u{0}{session}"))
            .or_default()
            .clone()
    }
}

fn answer(outcome: &Outcome) -> Response {
    match outcome {
        Outcome::Answered(r) => (StatusCode::OK, Json(r.clone())).into_response(),
        Outcome::Cancelled => error(StatusCode::CONFLICT, "cancelled", "the call was cancelled"),
        Outcome::Failed { code, message } => {
            let status = if code == "engine_timeout" {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::BAD_GATEWAY
            };
            error(status, code, message.clone())
        }
    }
}

async fn run(
    State(runner): State<Runner>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = runner.refusal(&headers) {
        return refused;
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .map(str::to_string)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "Idempotency-Key is required",
        );
    };
    if body.len() > runner.config.max_prompt_bytes {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "prompt_too_large",
            "the request is too large",
        );
    }
    let request: RunRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    let Some(agent) = runner.config.agents.get(&request.agent).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_agent",
            format!("no agent {:?} here", request.agent),
        );
    };
    let Some(engine) = runner.config.engines.get(&agent.engine).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_agent",
            format!("agent {:?} has no engine", request.agent),
        );
    };
    // Answered before (also before a restart): the same answer, the engine not run again.
    match runner.store.get(&key) {
        Ok(Some(outcome)) => {
            metrics::counter!("sb_runner_replays_total").increment(1);
            return answer(&outcome);
        }
        Ok(None) => {}
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "state_unavailable",
                e.to_string(),
            );
        }
    }
    // In progress: wait for that run. Otherwise this call runs it, if the host has room.
    let joined = {
        let mut running = runner.running.lock().unwrap();
        if let Some(r) = running.get(&key) {
            Err(r.done.clone())
        } else if running.len() >= runner.config.max_running {
            drop(running);
            metrics::counter!("sb_runner_busy_total").increment(1);
            let mut busy = error(
                StatusCode::TOO_MANY_REQUESTS,
                "busy",
                format!(
                    "{} runs in progress; try again shortly",
                    runner.config.max_running
                ),
            );
            busy.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
            return busy;
        } else {
            let (tx, rx) = watch::channel(None);
            let pgid = Arc::new(Mutex::new(None));
            let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
            running.insert(
                key.clone(),
                Running {
                    pgid: pgid.clone(),
                    cancelled: cancelled.clone(),
                    done: rx,
                },
            );
            Ok((tx, pgid, cancelled))
        }
    };
    let mut rx = match joined {
        // The run goes on in its own task: a caller that hangs up (its dispatcher died) does
        // not stop it, and its retry finds the outcome.
        Ok((tx, pgid, cancelled)) => {
            let rx = tx.subscribe();
            let runner = runner.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let outcome =
                    execute(&runner, &key, &request, &agent, &engine, pgid, cancelled).await;
                if let Err(e) = runner.store.put(&key, &outcome) {
                    tracing::error!(error = %e, "could not store a run's outcome");
                }
                let _ = tx.send(Some(outcome));
                runner.running.lock().unwrap().remove(&key);
            });
            rx
        }
        Err(rx) => rx,
    };
    loop {
        let done = rx.borrow().clone();
        if let Some(outcome) = done {
            return answer(&outcome);
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    match runner.store.get(&key) {
        Ok(Some(outcome)) => answer(&outcome),
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "retry",
            "the run ended without an outcome",
        ),
    }
}

async fn execute(
    runner: &Runner,
    key: &str,
    request: &RunRequest,
    agent: &config::AgentConfig,
    engine: &config::EngineConfig,
    pgid: Arc<Mutex<Option<i32>>>,
    cancelled: Arc<std::sync::atomic::AtomicBool>,
) -> Outcome {
    let started = Instant::now();
    let session = request
        .session_id
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let lock = runner.session_lock(&request.agent, &session);
    let _one_at_a_time = lock.lock().await;
    let prompt = engine::with_core_memory(
        &runner.config.core_memory_dir,
        &agent.identity,
        &request.prompt,
    );
    let run = engine::Run {
        engine,
        agent: &request.agent,
        session_id: &session,
        prompt: &prompt,
        workspace: request.workspace.as_deref(),
        timeout: std::time::Duration::from_secs(
            engine.timeout_s.unwrap_or(runner.config.timeout_s),
        ),
        max_output_bytes: runner.config.max_output_bytes,
        scratch: &runner.config.state_dir,
        key,
    };
    let outcome = match engine::run(&run, &pgid).await {
        _ if cancelled.load(std::sync::atomic::Ordering::SeqCst) => Outcome::Cancelled,
        Ok(RunOutcome {
            text,
            session_id,
            tool_calls_count,
        }) => Outcome::Answered(RunResponse {
            text,
            session_id,
            processing_ms: started.elapsed().as_millis() as i64,
            tool_calls_count,
        }),
        Err(EngineError::Timeout(s)) => Outcome::Failed {
            code: "engine_timeout".into(),
            message: format!("the engine ran past its {s} s timeout and was killed"),
        },
        Err(e) => Outcome::Failed {
            code: "engine_failed".into(),
            message: e.to_string(),
        },
    };
    let label = match &outcome {
        Outcome::Answered(_) => "answered",
        Outcome::Cancelled => "cancelled",
        Outcome::Failed { code, .. } if code == "engine_timeout" => "timeout",
        Outcome::Failed { .. } => "failed",
    };
    metrics::counter!("sb_runner_runs_total", "agent" => request.agent.clone(), "outcome" => label)
        .increment(1);
    metrics::histogram!("sb_runner_run_seconds").record(started.elapsed().as_secs_f64());
    outcome
}

async fn cancel(
    State(runner): State<Runner>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Response {
    if let Some(refused) = runner.refusal(&headers) {
        return refused;
    }
    let running = runner
        .running
        .lock()
        .unwrap()
        .get(&key)
        .map(|r| (r.pgid.clone(), r.cancelled.clone()));
    match running {
        Some((pgid, cancelled)) => {
            cancelled.store(true, std::sync::atomic::Ordering::SeqCst);
            if let Some(group) = *pgid.lock().unwrap() {
                engine::kill_group(group);
            }
            metrics::counter!("sb_runner_cancellations_total").increment(1);
            (
                StatusCode::ACCEPTED,
                Json(serde_json::json!({"cancelled": key})),
            )
                .into_response()
        }
        None => match runner.store.get(&key) {
            Ok(Some(_)) => error(
                StatusCode::CONFLICT,
                "already_finished",
                "that call has finished",
            ),
            _ => error(
                StatusCode::NOT_FOUND,
                "unknown_call",
                "no call with that key",
            ),
        },
    }
}

impl Runner {
    /// Remove old kept outcomes now and every hour, for as long as the future runs.
    pub async fn prune_forever(&self) {
        let age = std::time::Duration::from_secs(self.config.keep_results_days.max(1) * 86_400);
        loop {
            match self.store.prune(age) {
                Ok(n) if n > 0 => tracing::info!(removed = n, "old outcomes removed"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not prune old outcomes"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(3_600)).await;
        }
    }
}

/// Serve until ctrl-c / SIGTERM.
pub async fn serve(config: RunnerConfig) -> anyhow::Result<()> {
    let listen = config.listen.clone();
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let runner = Runner::new(config)?;
    let pruner = runner.clone();
    tokio::spawn(async move { pruner.prune_forever().await });
    let router = runner.router().route(
        "/metrics",
        get(move || std::future::ready(prometheus.render())),
    );
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tracing::info!(%listen, "runner listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    Ok(())
}
