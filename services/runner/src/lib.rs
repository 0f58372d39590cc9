//! The runner an agent host runs: `POST /run` executes the agent's engine CLI (OpenClaw, Factory
//! Droid, …) for one turn and answers with its reply and engine session id.
//!
//! What it promises (ARCHITECTURE §5, §16):
//! - a turn retried with the same `Idempotency-Key` never runs the engine twice: the outcome is
//!   written to `state_dir` before it is answered, and a call for a key in progress waits for
//!   that run instead of starting another, across a runner restart too: the engine runs under a
//!   supervisor process (`supervisor.rs`) that outlives the runner, in a folder of its own
//!   (`rundir.rs`), and a restarted runner adopts it (`runs.rs`). Only a run that provably
//!   died unfinished (a host crash) runs again, and its answer says so (`rerun`);
//! - one run at a time per engine session (agent + session id);
//! - the timeout and `DELETE /run/<key>` kill the engine's whole process group;
//! - output is capped; the engine's session id is read from its JSON output;
//! - the turn's token and the API's URL reach the engine as `SWITCHBOARD_TURN_TOKEN` and
//!   `SWITCHBOARD_API_URL` in its environment, never on its command line nor in a file.
mod adopt;
pub mod config;
pub mod engine;
pub mod rundir;
pub mod runs;
pub mod store;
pub mod supervisor;

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::Instrument as _;

use adopt::Plan;
pub use config::RunnerConfig;
use rundir::{Mark, RunDir, Settled};
use runs::Found;
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
    /// The turn's token for the API (`SWITCHBOARD_TURN_TOKEN` in the engine's environment).
    #[serde(default)]
    pub turn_token: Option<Credential>,
    /// Where the engine calls the API (`SWITCHBOARD_API_URL`).
    #[serde(default)]
    pub api_url: Option<String>,
}

/// A credential the engine is given: never printed (`Debug` shows `***`).
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Credential(pub String);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// `POST /run`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResponse {
    pub text: String,
    pub session_id: String,
    pub processing_ms: i64,
    pub tool_calls_count: i64,
    /// The tools the engine called, by name (`tool_names_path`); empty when it does not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_names: Vec<String>,
    /// The engine ran again for this turn: an earlier run of it died unfinished together with
    /// its runner (a host crash), so its tools may have run twice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rerun: bool,
}

/// A run in progress: its folder, whether it was cancelled, and who waits for its outcome.
struct Running {
    run: RunDir,
    cancelled: Arc<AtomicBool>,
    done: watch::Receiver<Option<Outcome>>,
}

#[derive(Clone)]
pub struct Runner {
    config: Arc<RunnerConfig>,
    store: ResultStore,
    running: Arc<Mutex<HashMap<String, Running>>>,
    /// One run at a time per engine session.
    sessions: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
    /// The `switchboard-runner` binary that supervises engines (`supervise`).
    supervisor: Arc<PathBuf>,
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
        rundir::private_dir(&config.state_dir.join("runs"))?;
        Ok(Self {
            config: Arc::new(config),
            store,
            running: Default::default(),
            sessions: Default::default(),
            supervisor: Arc::new(std::env::current_exe()?),
        })
    }

    /// Supervise engines with this `switchboard-runner` binary instead of the running one (a
    /// runner embedded in another program, like a test).
    pub fn supervised_by(mut self, exe: impl Into<PathBuf>) -> Self {
        self.supervisor = Arc::new(exe.into());
        self
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/run", post(run))
            .route("/run/{key}", delete(cancel))
            // Each call continues its caller's trace (dispatch sends `traceparent`); probes
            // (added after the layer) are not traced.
            .route_layer(axum::middleware::from_fn(switchboard_trace::server_span))
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
        // Never `detail`: it holds what the engine printed.
        Outcome::Failed { code, message, .. } => {
            let status = if code == "engine_timeout" {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::BAD_GATEWAY
            };
            error(status, code, message.clone())
        }
    }
}

/// The answer to a call that could not read or write its state folder (the why, with its
/// paths, goes to the log).
fn state_error(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "the state folder is unavailable");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "state_unavailable",
        "the runner cannot read or write its state folder",
    )
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
        Err(e) => {
            tracing::info!(error = %e, "a call whose body is not a run request");
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "the body is not a run request (agent, prompt, session_id)",
            );
        }
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
        Err(e) => return state_error(e),
    }
    // In progress (here, or left going by an earlier runner): wait for that run. Ended
    // without a kept outcome: keep it. Otherwise this call runs it, if the host has room.
    let plan = {
        let mut running = runner.running.lock().unwrap();
        match running.get(&key) {
            Some(r) => Ok(Plan::Join(r.done.clone())),
            None => runner.plan(&mut running, &key),
        }
    };
    let mut rx = match plan {
        Err(e) => return state_error(e),
        Ok(Plan::Busy) => {
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
        }
        Ok(Plan::Settle(run, settled)) => return answer(&runner.settle(&key, &run, &settled)),
        Ok(Plan::Join(rx)) => rx,
        // The run goes on in its own task: a caller that hangs up (its dispatcher died) does
        // not stop it, and its retry finds the outcome.
        Ok(Plan::Start {
            run,
            lock,
            rerun,
            done,
            cancelled,
        }) => {
            if rerun {
                tracing::warn!(
                    key,
                    "the engine runs again for this turn: its earlier run died unfinished with its runner"
                );
                metrics::counter!("sb_runner_reruns_total").increment(1);
            }
            let rx = done.subscribe();
            let runner = runner.clone();
            let key = key.clone();
            // In the call's trace: the run outlives the call only when its caller hangs up.
            let span = tracing::info_span!(
                "engine_run",
                otel.name = %format_args!("run {}", agent.engine),
                engine = %agent.engine,
                agent = %request.agent,
                rerun,
            );
            tokio::spawn(
                async move {
                    let outcome = execute(
                        &runner, &key, &request, &agent, &engine, &run, lock, rerun, cancelled,
                    )
                    .await;
                    runner.keep(&key, &run, &request.agent, &outcome);
                    let _ = done.send(Some(outcome));
                    runner.running.lock().unwrap().remove(&key);
                }
                .instrument(span),
            );
            rx
        }
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

#[allow(clippy::too_many_arguments)]
async fn execute(
    runner: &Runner,
    key: &str,
    request: &RunRequest,
    agent: &config::AgentConfig,
    engine: &config::EngineConfig,
    run: &RunDir,
    lock: File,
    rerun: bool,
    cancelled: Arc<AtomicBool>,
) -> Outcome {
    let created_at_ms = rundir::now_ms();
    let started = std::time::Instant::now();
    let session = request
        .session_id
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let lock_of_session = runner.session_lock(&request.agent, &session);
    let _one_at_a_time = lock_of_session.lock().await;
    // Cancelled while it waited for its session: it never starts.
    if cancelled.load(Ordering::SeqCst) {
        return Outcome::Cancelled;
    }
    let prompt = engine::with_core_memory(
        &runner.config.core_memory_dir,
        &agent.identity,
        &request.prompt,
    );
    let prompt_file = run.file("prompt");
    let spec = engine::spec(
        &engine::Run {
            engine,
            agent: &request.agent,
            session_id: &session,
            prompt: &prompt,
            workspace: request.workspace.as_deref(),
            timeout: std::time::Duration::from_secs(
                engine.timeout_s.unwrap_or(runner.config.timeout_s),
            ),
            max_output_bytes: runner.config.max_output_bytes,
            prompt_file: &prompt_file,
            key,
            turn_token: request.turn_token.as_ref().map(|t| t.0.as_str()),
            api_url: request.api_url.as_deref(),
        },
        created_at_ms,
    )
    .and_then(|mut spec| {
        spec.rerun = rerun;
        let exited = runs::start(run, lock, &spec, &prompt, &runner.supervisor)?;
        Ok((spec, exited))
    });
    let mut outcome = match spec {
        Ok((spec, exited)) => {
            let settled = runs::watch(run, spec.timeout_s, Some(exited)).await;
            runs::outcome(run, &settled, &spec)
        }
        Err(e) => Outcome::failed("engine_failed", e.public(), e.to_string()),
    };
    if cancelled.load(Ordering::SeqCst) {
        outcome = Outcome::Cancelled;
    }
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
    let already_finished = || {
        error(
            StatusCode::CONFLICT,
            "already_finished",
            "that call has finished",
        )
    };
    match runner.store.get(&key) {
        Ok(Some(_)) => return already_finished(),
        Ok(None) => {}
        Err(e) => return state_error(e),
    }
    // A run in progress here, or one an earlier runner left going (adopted now, to be
    // cancelled like any other).
    let target = {
        let mut running = runner.running.lock().unwrap();
        if !running.contains_key(&key) {
            let run = runner.run_dir(&key);
            match runs::find(&run) {
                Err(e) => return state_error(e),
                Ok(Found::Absent) => {
                    return error(
                        StatusCode::NOT_FOUND,
                        "unknown_call",
                        "no call with that key",
                    );
                }
                Ok(Found::Alive) => {
                    runner.adopt(&mut running, &key, run);
                }
                // Nothing runs it, and nothing will: it stays cancelled.
                Ok(Found::Dead(_, Settled::NeverStarted | Settled::DiedUnfinished)) => {
                    drop(running);
                    let spec = run.spec();
                    runner.keep(
                        &key,
                        &run,
                        &spec.map(|s| s.agent).unwrap_or_default(),
                        &Outcome::Cancelled,
                    );
                    return cancelled_answer(&key);
                }
                Ok(Found::Dead(_, settled)) => {
                    drop(running);
                    runner.settle(&key, &run, &settled);
                    return already_finished();
                }
            }
        }
        running
            .get(&key)
            .map(|r| (r.run.clone(), r.cancelled.clone()))
    };
    let Some((run, cancelled)) = target else {
        return already_finished();
    };
    cancelled.store(true, Ordering::SeqCst);
    // Recorded before the kill, so a runner that dies right after still knows why it ended.
    if run.exists()
        && let Err(e) = run.mark(Mark::Cancelled)
    {
        tracing::warn!(error = %e, key, "could not record a cancel");
    }
    run.kill();
    cancelled_answer(&key)
}

fn cancelled_answer(key: &str) -> Response {
    metrics::counter!("sb_runner_cancellations_total").increment(1);
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({"cancelled": key})),
    )
        .into_response()
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
            let n = runs::prune(&self.config.state_dir, age);
            if n > 0 {
                tracing::info!(removed = n, "old run folders removed");
            }
            tokio::time::sleep(std::time::Duration::from_secs(3_600)).await;
        }
    }
}

/// Serve until ctrl-c / SIGTERM.
pub async fn serve(config: RunnerConfig) -> anyhow::Result<()> {
    // Before anything is opened or bound: a runner reachable by anyone is not started.
    for warning in config.check()? {
        tracing::warn!("{warning}");
    }
    let listen = config.listen.clone();
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let runner = Runner::new(config)?;
    // Before taking calls: runs an earlier runner left going are waited for again.
    runner.adopt_orphans();
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
