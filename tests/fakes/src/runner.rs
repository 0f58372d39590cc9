//! An agent host's runner: `POST /run` (an `Idempotency-Key`, a JSON body of `agent`,
//! `prompt`, `session_id`, …) answers `{"text","session_id","processing_ms","tool_calls_count"}`;
//! `DELETE /run/<key>` cancels the call running under that key. Like a real runner it answers a
//! repeated `Idempotency-Key` from its cache. On demand it is slow, holds calls, fails them,
//! answers 503 (the host is down) or stops listening altogether (connections refused).
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{Notify, oneshot};

use crate::serve::{Failures, header};

/// One call the fake runner received.
#[derive(Debug, Clone)]
pub struct RunnerCall {
    pub agent: String,
    pub prompt: String,
    pub session_id: Option<String>,
    pub idempotency_key: String,
    pub authorization: Option<String>,
    /// The session's folder, when workspaces are on.
    pub workspace: Option<String>,
    /// The turn's token for the API (`sbt_…`) and the API's URL, as the body carried them.
    pub turn_token: Option<String>,
    pub api_url: Option<String>,
}

/// Told of every call, for a run that checks order and overlap across thousands of calls
/// without keeping them all (the load tools).
pub trait RunObserver: Send + Sync + 'static {
    /// A call began (the host is up). What this returns lives while the call runs: it is
    /// dropped when the call ends, answered, cancelled or its connection dropped.
    fn began(&self, call: &RunnerCall) -> Box<dyn Send>;
    /// A call answered 503 while the host was down (it ran nothing).
    fn refused(&self, call: &RunnerCall);
}

type Answerer = Arc<dyn Fn(&RunnerCall, &str) -> String + Send + Sync>;
type SessionNamer = Arc<dyn Fn() -> String + Send + Sync>;

#[derive(Deserialize)]
struct RunBody {
    agent: String,
    prompt: String,
    session_id: Option<String>,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    turn_token: Option<String>,
    #[serde(default)]
    api_url: Option<String>,
}

#[derive(Clone)]
pub struct FakeRunner {
    /// The runner's URL to configure (`agents.<name>.runner_url`); empty for a fake only
    /// mounted in another server's router ([`FakeRunner::router`]).
    pub url: String,
    /// Announced as each call begins (before a hold).
    pub received: Arc<Notify>,
    /// Lets one held call go on ([`FakeRunner::set_hold`]).
    pub release: Arc<Notify>,
    /// Highest number of calls for one person seen at the same time.
    pub max_overlap: Arc<AtomicUsize>,
    /// Calls answered 503 while the host was down (not in `calls`).
    pub refused: Arc<AtomicUsize>,
    /// Keys whose call was cancelled (a later POST with one answers `cancelled`).
    pub cancelled: Arc<Mutex<Vec<String>>>,
    inner: Arc<Inner>,
}

struct Inner {
    /// Keep every call and cache every answer (tests); a load run's observer keeps its own.
    keep: bool,
    calls: Mutex<Vec<RunnerCall>>,
    cache: Mutex<HashMap<String, serde_json::Value>>,
    delay: Mutex<Duration>,
    hold: AtomicBool,
    in_flight: Mutex<HashMap<String, usize>>,
    failures: Failures,
    sessions: AtomicUsize,
    down: AtomicBool,
    /// Calls in progress by Idempotency-Key, for `DELETE /run/<key>`.
    running: Mutex<HashMap<String, Arc<Notify>>>,
    /// Fixed answers by what the prompt contains (the first that matches).
    needles: Mutex<Vec<(String, String)>>,
    /// The tool names every answer reports (`tool_names`), if any.
    tools: Mutex<Vec<String>>,
    answer: Mutex<Option<Answerer>>,
    new_session: Mutex<Option<SessionNamer>>,
    observer: OnceLock<Arc<dyn RunObserver>>,
    /// Where it listens, and the server while it does.
    addr: Mutex<String>,
    server: tokio::sync::Mutex<Option<Listening>>,
}

struct Listening {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// A person's count of calls in flight, given back however the call ends.
struct InFlight {
    inner: Arc<Inner>,
    person: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(n) = self.inner.in_flight.lock().unwrap().get_mut(&self.person) {
            *n = n.saturating_sub(1);
        }
    }
}

impl FakeRunner {
    /// A runner that keeps every call (see [`Self::calls`]), not yet listening: mount
    /// [`Self::router`] where it should answer, or use [`Self::start`].
    pub fn new() -> Self {
        Self::with_keep(true)
    }

    /// A runner that keeps neither calls nor answers (a long run's memory): what it sees goes
    /// to its [`RunObserver`].
    pub fn unrecorded() -> Self {
        Self::with_keep(false)
    }

    fn with_keep(keep: bool) -> Self {
        Self {
            url: String::new(),
            received: Arc::default(),
            release: Arc::default(),
            max_overlap: Arc::default(),
            refused: Arc::default(),
            cancelled: Arc::default(),
            inner: Arc::new(Inner {
                keep,
                calls: Mutex::default(),
                cache: Mutex::default(),
                delay: Mutex::default(),
                hold: AtomicBool::new(false),
                in_flight: Mutex::default(),
                failures: Failures::default(),
                sessions: AtomicUsize::new(0),
                down: AtomicBool::new(false),
                running: Mutex::default(),
                needles: Mutex::default(),
                tools: Mutex::default(),
                answer: Mutex::default(),
                new_session: Mutex::default(),
                observer: OnceLock::new(),
                addr: Mutex::default(),
                server: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// A runner that keeps every call, on a free port.
    pub async fn start() -> Self {
        Self::new().listening_on("127.0.0.1:0").await
    }

    /// Listen on `addr` (`host:port`; port 0 takes a free one); the runner listens there
    /// again after [`Self::stop_listening`].
    pub async fn listening_on(mut self, addr: &str) -> Self {
        let listener = switchboard_kit::net::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("the fake runner cannot listen on {addr}: {e}"));
        let bound = listener.local_addr().expect("a bound address").to_string();
        self.url = format!("http://{bound}");
        *self.inner.addr.lock().unwrap() = bound;
        self.serve(listener).await;
        self
    }

    /// The runner's routes: `/run` and `/run/{key}`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/run", post(Self::run))
            .route("/run/{key}", delete(Self::cancel))
            .with_state(self.clone())
    }

    async fn serve(&self, listener: tokio::net::TcpListener) {
        let (stop, stopped) = oneshot::channel::<()>();
        let router = self.router();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        *self.inner.server.lock().await = Some(Listening { stop, task });
    }

    /// Listen on the runner's port again (after [`Self::stop_listening`]); waits until the
    /// port is free to take.
    pub async fn listen(&self) {
        let addr = self.inner.addr.lock().unwrap().clone();
        let listener = loop {
            match tokio::net::TcpListener::bind(addr.as_str()).await {
                Ok(l) => break l,
                Err(e) => {
                    eprintln!("fake runner: cannot listen on {addr} yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        self.serve(listener).await;
    }

    /// Stop listening, as a runner host that went away: new connections are refused, and the
    /// open ones close once their call is answered.
    pub async fn stop_listening(&self) {
        if let Some(Listening { stop, task }) = self.inner.server.lock().await.take() {
            let _ = stop.send(());
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Tell `observer` of every call from now on (one observer a runner).
    pub fn observe(&self, observer: Arc<dyn RunObserver>) {
        if self.inner.observer.set(observer).is_err() {
            panic!("a fake runner takes one observer");
        }
    }

    /// Every call so far, in order (none for an [`Self::unrecorded`] runner).
    pub fn calls(&self) -> Vec<RunnerCall> {
        self.inner.calls.lock().unwrap().clone()
    }

    pub fn set_delay(&self, d: Duration) {
        *self.inner.delay.lock().unwrap() = d;
    }

    /// Answer the next `n` calls with HTTP `status`.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.inner.failures.fail_next(n, status);
    }

    /// Take the agent host down (every call 503) or bring it back.
    pub fn set_down(&self, down: bool) {
        self.inner.down.store(down, Ordering::SeqCst);
    }

    /// Hold every call until [`Self::release`] lets it go (or it is cancelled).
    pub fn set_hold(&self, hold: bool) {
        self.inner.hold.store(hold, Ordering::SeqCst);
    }

    /// Answer a call whose prompt contains `needle` with `text` (as an agent that decided
    /// what to say), not with the echo.
    pub fn answer_when(&self, needle: &str, text: &str) {
        self.inner
            .needles
            .lock()
            .unwrap()
            .push((needle.to_string(), text.to_string()));
    }

    /// Report `names` as the tools every answer's engine called (`tool_names`), as a runner
    /// whose engine says so does.
    pub fn report_tools(&self, names: &[&str]) {
        *self.inner.tools.lock().unwrap() = names.iter().map(|n| n.to_string()).collect();
    }

    /// Answer every call with `f(call, engine session id)` instead of `echo: <what was said>`.
    pub fn answer_with(&self, f: impl Fn(&RunnerCall, &str) -> String + Send + Sync + 'static) {
        *self.inner.answer.lock().unwrap() = Some(Arc::new(f));
    }

    /// Name a new engine session with `f` instead of `eng-<n>` (n counting from 1).
    pub fn name_sessions_with(&self, f: impl Fn() -> String + Send + Sync + 'static) {
        *self.inner.new_session.lock().unwrap() = Some(Arc::new(f));
    }

    /// The person's text inside a prompt's (first) fence.
    pub fn said(prompt: &str) -> String {
        fenced_texts(prompt)
            .first()
            .copied()
            .unwrap_or("")
            .to_string()
    }

    /// `DELETE /run/<key>`: cancel the call running under that key, as a runner kills the
    /// engine's process group.
    async fn cancel(State(s): State<FakeRunner>, Path(key): Path<String>) -> StatusCode {
        let running = s.inner.running.lock().unwrap().get(&key).cloned();
        match running {
            Some(call) => {
                s.cancelled.lock().unwrap().push(key);
                call.notify_one();
                StatusCode::ACCEPTED
            }
            None => StatusCode::NOT_FOUND,
        }
    }

    async fn run(
        State(s): State<FakeRunner>,
        headers: HeaderMap,
        Json(body): Json<RunBody>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let inner = &s.inner;
        let key = header(&headers, "idempotency-key").to_string();
        let call = RunnerCall {
            agent: body.agent,
            prompt: body.prompt,
            session_id: body.session_id,
            idempotency_key: key.clone(),
            authorization: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            workspace: body.workspace,
            turn_token: body.turn_token,
            api_url: body.api_url,
        };
        if inner.down.load(Ordering::SeqCst) {
            s.refused.fetch_add(1, Ordering::SeqCst);
            if let Some(observer) = inner.observer.get() {
                observer.refused(&call);
            }
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"error": "agent host is down"})),
            );
        }
        if inner.keep {
            inner.calls.lock().unwrap().push(call.clone());
        }
        if let Some(status) = inner.failures.take() {
            return (status, Json(json!({"error": "agent host says no"})));
        }
        let person = person_of(&call.prompt);
        {
            let mut f = inner.in_flight.lock().unwrap();
            let n = f.entry(person.clone()).or_insert(0);
            *n += 1;
            s.max_overlap.fetch_max(*n, Ordering::SeqCst);
        }
        let in_flight = InFlight {
            inner: inner.clone(),
            person,
        };
        let observed = inner.observer.get().map(|o| o.began(&call));
        let cancelled = || {
            (
                StatusCode::CONFLICT,
                Json(json!({"error": {"code": "cancelled", "message": "cancelled"}})),
            )
        };
        if s.cancelled.lock().unwrap().contains(&key) {
            return cancelled();
        }
        let cancel = Arc::new(Notify::new());
        inner
            .running
            .lock()
            .unwrap()
            .insert(key.clone(), cancel.clone());
        s.received.notify_one();
        if inner.hold.load(Ordering::SeqCst) {
            tokio::select! {
                _ = s.release.notified() => {}
                _ = cancel.notified() => {
                    inner.running.lock().unwrap().remove(&key);
                    return cancelled();
                }
            }
        }
        inner.running.lock().unwrap().remove(&key);
        let delay = *inner.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        drop(observed);
        drop(in_flight);
        if inner.keep
            && let Some(cached) = inner.cache.lock().unwrap().get(&key)
        {
            return (StatusCode::OK, Json(cached.clone()));
        }
        let session_id = call.session_id.clone().unwrap_or_else(|| {
            let namer = inner.new_session.lock().unwrap().clone();
            match namer {
                Some(name) => name(),
                None => format!("eng-{}", inner.sessions.fetch_add(1, Ordering::SeqCst) + 1),
            }
        });
        let needle = inner
            .needles
            .lock()
            .unwrap()
            .iter()
            .find(|(needle, _)| call.prompt.contains(needle.as_str()))
            .map(|(_, text)| text.clone());
        let answerer = inner.answer.lock().unwrap().clone();
        let text = match (needle, answerer) {
            (Some(text), _) => text,
            (None, Some(answer)) => answer(&call, &session_id),
            (None, None) => format!("echo: {}", Self::said(&call.prompt)),
        };
        // What the engine reports of its work: the delay it was given, or 7 ms (a value a test
        // can tell from a default), and two tool calls.
        let processing_ms = if delay.is_zero() {
            7
        } else {
            delay.as_millis() as u64
        };
        let mut answer = json!({
            "text": text,
            "session_id": session_id,
            "processing_ms": processing_ms,
            "tool_calls_count": 2,
        });
        let tools = inner.tools.lock().unwrap().clone();
        if !tools.is_empty() {
            answer["tool_names"] = json!(tools);
        }
        if inner.keep {
            inner.cache.lock().unwrap().insert(key, answer.clone());
        }
        (StatusCode::OK, Json(answer))
    }
}

impl Default for FakeRunner {
    fn default() -> Self {
        Self::new()
    }
}

/// The resolved person id in a prompt's header (`| id <person_id> |`).
pub fn person_of(prompt: &str) -> String {
    prompt
        .split("| id ")
        .nth(1)
        .and_then(|r| r.split(" |").next())
        .unwrap_or("")
        .to_string()
}

/// Every fenced message text of a prompt, in order (one, or several in a call that joins
/// messages): what is between `<<<MSG-<nonce>` and `MSG-<nonce>>>>`.
pub fn fenced_texts(prompt: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(start) = rest.find("<<<MSG-") {
        let after = &rest[start + 3..];
        let Some(marker_end) = after.find('\n') else {
            break;
        };
        let marker = &after[..marker_end];
        let body = &after[marker_end + 1..];
        let close = format!("\n{marker}>>>");
        let Some(end) = body.find(&close) else { break };
        out.push(&body[..end]);
        rest = &body[end + close.len()..];
    }
    out
}
