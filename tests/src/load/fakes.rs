//! The third parties of a load or chaos run, as real HTTP servers on loopback:
//!
//! - [`LoadRunner`]: an agent runner (`POST /run`) with a configurable latency. It answers
//!   `echo: <text>` and checks, per person, that turns arrive in order (`s<sender>#<index>`) and
//!   never overlap.
//! - [`LoadTwilio`]: Twilio's Messages API. It records when each reply first arrived, counts
//!   replies delivered more than once, checks each person's SMS order, and wakes whoever waits
//!   for a reply. Its Messages list serves what it accepted, so a deliverer that finds a part
//!   of uncertain outcome can look it up as it does at Twilio.
//! - [`LoadTextMagic`]: TextMagic's v2 Messages API, recording the same, with its outbound list
//!   (the whole account's, newest first, as TextMagic lists it).
//!
//! Both keep counters for the bench and, for the chaos checker, a record of every call and
//! every send ([`CallRecord`], [`SendRecord`]).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use chrono::{DateTime, Utc};

use crate::fakes::person_of;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::channels::Channel;
use super::{now_us, parse_text};

/// Example lines kept per kind of finding (the text before the first `:`), so that a flood of
/// one kind never hides the first example of another.
const MAX_EVIDENCE_PER_KIND: usize = 20;

async fn serve(router: Router) -> String {
    let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn note(evidence: &Mutex<Vec<String>>, line: String) {
    let kind = |l: &str| l.split(':').next().unwrap_or("").to_string();
    let mine = kind(&line);
    let mut e = evidence.lock().unwrap();
    if e.iter().filter(|l| kind(l) == mine).count() < MAX_EVIDENCE_PER_KIND {
        e.push(line);
    }
}

#[derive(Default)]
struct PersonRun {
    in_flight: u32,
    /// Texts of the calls in flight: the same text twice is one turn run again (a redelivery
    /// while its first dispatcher still ran), not two turns at once.
    in_flight_texts: Vec<String>,
    /// By the sender's own numbering (arrival order at the gateway).
    max_index: Option<u32>,
    seen: HashSet<u32>,
    /// By the session's turn number (`seq`, given by the session stage).
    max_seq: Option<i64>,
    seen_seq: HashSet<i64>,
}

#[derive(Default)]
struct RunnerInner {
    delay_ms: AtomicU64,
    calls: AtomicU64,
    persons: Mutex<HashMap<String, PersonRun>>,
    overlaps: AtomicU64,
    /// A turn called again while its earlier call still ran (same Idempotency-Key).
    reruns: AtomicU64,
    max_overlap: AtomicUsize,
    order_violations: AtomicU64,
    seq_violations: AtomicU64,
    evidence: Mutex<Vec<String>>,
    record_timing: AtomicBool,
    /// Message text → the turn's seq (from the prompt).
    seq_of: Mutex<HashMap<String, i64>>,
    /// Message text → how long the last call for it took in the runner, µs.
    timing: Mutex<HashMap<String, u64>>,
    /// Every call, in the order they began (the chaos checker judges these).
    log: Mutex<Vec<CallRecord>>,
    /// Answer 503 to every call (the first phase of an outage).
    unavailable: AtomicBool,
    /// Calls answered 503.
    refused: Mutex<Vec<RefusedCall>>,
}

/// One call the runner received: who and what it was for, and when it began and ended.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CallRecord {
    pub start_us: u64,
    /// When the call answered or its connection dropped; `None` while it runs.
    pub end_us: Option<u64>,
    /// The person id the prompt names.
    pub person: String,
    /// The first fenced message text (`s<sender>#<index>`).
    pub text: String,
    /// Every fenced message text, in the prompt's order: more than one when the call joins
    /// messages (queue mode `collect`). Empty in evidence recorded before joins: `[text]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub texts: Vec<String>,
    /// The agent the prompt's first line names.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// The turn number from the prompt's first line (the first message's turn).
    pub seq: Option<i64>,
    pub idempotency_key: String,
    /// The canaries the prompt carried (chaos runs mark every message with its person's).
    #[serde(default)]
    pub canaries: super::canary::PromptCanaries,
}

impl CallRecord {
    /// The messages this call carries, in the prompt's order.
    pub fn messages(&self) -> Vec<&str> {
        if self.texts.is_empty() {
            vec![self.text.as_str()]
        } else {
            self.texts.iter().map(String::as_str).collect()
        }
    }

    /// Whether this call joins more than one message.
    pub fn joined(&self) -> bool {
        self.texts.len() > 1
    }
}

/// A call the runner answered 503 while it was down (it ran nothing).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RefusedCall {
    pub at_us: u64,
    pub person: String,
    pub texts: Vec<String>,
}

/// The runner's outage: 503 from `unavailable_us`, not listening (connections refused) from
/// `refusing_us`, listening and answering again from `back_us`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RunnerOutage {
    pub unavailable_us: u64,
    pub refusing_us: u64,
    pub back_us: u64,
}

/// Every fenced message text of a prompt, in order (one, or several in a joined call's).
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

/// The agent a prompt's first line names (`[Switchboard turn <seq> | agent <name> (…)]`).
fn agent_of_prompt(prompt: &str) -> String {
    prompt
        .lines()
        .next()
        .and_then(|l| l.split("| agent ").nth(1))
        .and_then(|r| r.split(' ').next())
        .unwrap_or("")
        .to_string()
}

/// What the runner saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunnerStats {
    pub calls: u64,
    /// Distinct turns (person, index) called at least once.
    pub turns: u64,
    /// Calls that began while another call for the same person was running.
    pub overlaps: u64,
    pub reruns: u64,
    pub max_overlap: usize,
    /// First calls for a message that came after a message the same person sent later
    /// (arrival order at the gateway).
    pub order_violations: u64,
    /// First calls for a turn that came after a later turn (`seq`) of the same session.
    pub seq_violations: u64,
    pub evidence: Vec<String>,
}

#[derive(Clone)]
pub struct LoadRunner {
    pub url: String,
    inner: Arc<RunnerInner>,
    /// The listening server, while it listens: stopping it refuses connections.
    server: Arc<tokio::sync::Mutex<Option<Listening>>>,
}

struct Listening {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Deserialize)]
struct RunBody {
    prompt: String,
    session_id: Option<String>,
}

/// Decrements a person's in-flight count however the call ends (a dropped connection cancels
/// the handler).
struct InFlight {
    inner: Arc<RunnerInner>,
    person: String,
    text: String,
    log_index: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(c) = self.inner.log.lock().unwrap().get_mut(self.log_index) {
            c.end_us = Some(now_us());
        }
        if let Some(p) = self.inner.persons.lock().unwrap().get_mut(&self.person) {
            p.in_flight = p.in_flight.saturating_sub(1);
            if let Some(i) = p.in_flight_texts.iter().position(|t| t == &self.text) {
                p.in_flight_texts.swap_remove(i);
            }
        }
    }
}

/// The turn number from the prompt's first line (`[Switchboard turn <seq> | …`).
fn seq_of_prompt(prompt: &str) -> Option<i64> {
    prompt
        .strip_prefix("[Switchboard turn ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

impl LoadRunner {
    /// Listening on a port of [`super::pipeline::LOAD_PORTS`], so that it can listen there
    /// again after an outage ([`Self::stop_listening`]).
    pub async fn start(delay: Duration) -> Self {
        let mut this = Self {
            url: String::new(),
            inner: Default::default(),
            server: Default::default(),
        };
        this.set_delay(delay);
        let port = super::pipeline::free_port();
        this.url = format!("http://127.0.0.1:{port}");
        this.listen().await;
        this
    }

    fn router(&self) -> Router {
        Router::new()
            .route("/run", post(Self::run))
            .with_state(self.clone())
    }

    /// Listen on the runner's port (again); waits until the port is free to take.
    pub async fn listen(&self) {
        let addr = self.url.trim_start_matches("http://").to_string();
        let listener = loop {
            match tokio::net::TcpListener::bind(addr.as_str()).await {
                Ok(l) => break l,
                Err(e) => {
                    eprintln!("load runner: cannot listen on {addr} yet: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let router = self.router();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        *self.server.lock().await = Some(Listening { stop, task });
    }

    /// Stop listening, as a runner host that went away: new connections are refused, and the
    /// open ones close once their call is answered.
    pub async fn stop_listening(&self) {
        if let Some(Listening { stop, task }) = self.server.lock().await.take() {
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

    /// Answer 503 to every call (on) or run them again (off).
    pub fn set_unavailable(&self, on: bool) {
        self.inner.unavailable.store(on, Ordering::SeqCst);
    }

    /// The calls answered 503.
    pub fn refused(&self) -> Vec<RefusedCall> {
        self.inner.refused.lock().unwrap().clone()
    }

    pub fn set_delay(&self, d: Duration) {
        self.inner
            .delay_ms
            .store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Keep how long each call took (for overhead = end to end minus runner time).
    pub fn record_timing(&self, on: bool) {
        self.inner.record_timing.store(on, Ordering::SeqCst);
    }

    /// How long the runner spent on this message's turn (last call), µs.
    pub fn time_of(&self, text: &str) -> Option<u64> {
        self.inner.timing.lock().unwrap().get(text).copied()
    }

    /// The seq the session stage gave the turn of this message.
    pub fn seq_of(&self, text: &str) -> Option<i64> {
        self.inner.seq_of.lock().unwrap().get(text).copied()
    }

    /// Every call so far, in the order they began.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.log.lock().unwrap().clone()
    }

    pub fn stats(&self) -> RunnerStats {
        let i = &self.inner;
        RunnerStats {
            calls: i.calls.load(Ordering::SeqCst),
            turns: i
                .persons
                .lock()
                .unwrap()
                .values()
                .map(|p| p.seen.len() as u64)
                .sum(),
            overlaps: i.overlaps.load(Ordering::SeqCst),
            reruns: i.reruns.load(Ordering::SeqCst),
            max_overlap: i.max_overlap.load(Ordering::SeqCst),
            order_violations: i.order_violations.load(Ordering::SeqCst),
            seq_violations: i.seq_violations.load(Ordering::SeqCst),
            evidence: i.evidence.lock().unwrap().clone(),
        }
    }

    async fn run(
        State(s): State<LoadRunner>,
        headers: HeaderMap,
        Json(body): Json<RunBody>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let started = now_us();
        let inner = &s.inner;
        let person = person_of(&body.prompt);
        let fenced = fenced_texts(&body.prompt);
        let canaries = super::canary::PromptCanaries::of_prompt(&body.prompt, &fenced);
        // The message texts without their canaries (`s<sender>#<index>`): what every order
        // check reads and what the answer echoes.
        let texts: Vec<String> = fenced
            .into_iter()
            .map(|t| super::canary::strip(t).to_string())
            .collect();
        if inner.unavailable.load(Ordering::SeqCst) {
            inner.refused.lock().unwrap().push(RefusedCall {
                at_us: started,
                person,
                texts,
            });
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": "runner unavailable"})),
            );
        }
        inner.calls.fetch_add(1, Ordering::Relaxed);
        let text = texts.first().cloned().unwrap_or_default();
        let index = parse_text(&text).map(|(_, i)| i);
        let seq = seq_of_prompt(&body.prompt);
        if let Some(q) = seq {
            inner.seq_of.lock().unwrap().insert(text.clone(), q);
        }
        {
            let mut persons = inner.persons.lock().unwrap();
            let p = persons.entry(person.clone()).or_default();
            p.in_flight += 1;
            let same_turn_again = p.in_flight_texts.iter().any(|t| t == &text);
            let other_turns = p.in_flight_texts.iter().filter(|t| *t != &text).count();
            p.in_flight_texts.push(text.clone());
            if same_turn_again {
                inner.reruns.fetch_add(1, Ordering::Relaxed);
            }
            if other_turns > 0 {
                inner.overlaps.fetch_add(1, Ordering::Relaxed);
                note(
                    &inner.evidence,
                    format!(
                        "overlap: {person} {text:?} began while {other_turns} other turn(s) ran, at {:.3}s",
                        started as f64 / 1e6
                    ),
                );
            }
            inner
                .max_overlap
                .fetch_max(p.in_flight as usize, Ordering::Relaxed);
            if let Some(i) = index
                && p.seen.insert(i)
            {
                if let Some(m) = p.max_index
                    && m > i
                {
                    inner.order_violations.fetch_add(1, Ordering::Relaxed);
                    note(
                        &inner.evidence,
                        format!(
                            "runner arrival order: {person} got #{i} (turn {}) after #{m}, at {:.3}s",
                            seq.unwrap_or(-1),
                            started as f64 / 1e6
                        ),
                    );
                }
                p.max_index = Some(p.max_index.map_or(i, |m| m.max(i)));
            }
            if let Some(q) = seq
                && p.seen_seq.insert(q)
            {
                if let Some(m) = p.max_seq
                    && m > q
                {
                    inner.seq_violations.fetch_add(1, Ordering::Relaxed);
                    note(
                        &inner.evidence,
                        format!(
                            "runner seq order: {person} got turn {q} ({text}) after turn {m}, at {:.3}s",
                            started as f64 / 1e6
                        ),
                    );
                }
                p.max_seq = Some(p.max_seq.map_or(q, |m| m.max(q)));
            }
        }
        let log_index = {
            let mut log = inner.log.lock().unwrap();
            log.push(CallRecord {
                start_us: started,
                end_us: None,
                person: person.clone(),
                text: text.clone(),
                texts: if texts.len() > 1 {
                    texts.clone()
                } else {
                    Vec::new()
                },
                agent: agent_of_prompt(&body.prompt),
                seq,
                idempotency_key: headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string(),
                canaries,
            });
            log.len() - 1
        };
        let guard = InFlight {
            inner: inner.clone(),
            person: person.clone(),
            text: text.clone(),
            log_index,
        };
        let delay = inner.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        drop(guard);
        if inner.record_timing.load(Ordering::Relaxed) {
            inner
                .timing
                .lock()
                .unwrap()
                .insert(text.clone(), now_us() - started);
        }
        let session_id = body.session_id.unwrap_or_else(|| format!("eng-{person}"));
        // One answer names every message the call carried, in order.
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "text": format!("echo: {}", texts.join(" ")),
                "session_id": session_id,
                "processing_ms": delay,
                "tool_calls_count": 0,
            })),
        )
    }
}

// ---- Twilio and TextMagic ----------------------------------------------------------------

/// What a fake SMS provider records of every send it accepts: when each reply first arrived,
/// replies delivered more than once, each person's order, and whoever waits for a reply.
#[derive(Default)]
struct SendLog {
    /// Message text → arrival times, µs (more than one: delivered more than once).
    arrivals: Mutex<HashMap<String, Vec<u64>>>,
    /// Recipient → highest message index delivered so far.
    per_recipient: Mutex<HashMap<String, u32>>,
    /// Recipient → replies in the order they first arrived.
    sequence: Mutex<HashMap<String, Vec<String>>>,
    order_violations: AtomicU64,
    doubles: AtomicU64,
    total: AtomicU64,
    evidence: Mutex<Vec<String>>,
    waiters: Mutex<HashMap<String, oneshot::Sender<u64>>>,
    /// Every accepted send, in arrival order (the chaos checker judges these).
    log: Mutex<Vec<SendRecord>>,
    /// Requests for the provider's message list.
    lookups: AtomicU64,
}

impl SendLog {
    /// Record one accepted send of `body` to `to`, made by the process `headers` name.
    fn record(
        &self,
        channel: Channel,
        at: u64,
        to: &str,
        body: &str,
        sid: &str,
        headers: &HeaderMap,
    ) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let text = body.strip_prefix("echo: ").unwrap_or(body).to_string();
        self.log.lock().unwrap().push(SendRecord {
            channel,
            at_us: at,
            to: to.to_string(),
            text: text.clone(),
            sid: sid.to_string(),
            sender_pid: headers
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .and_then(pid_of_user_agent),
        });
        let first = {
            let mut arrivals = self.arrivals.lock().unwrap();
            let e = arrivals.entry(text.clone()).or_default();
            e.push(at);
            e.len() == 1
        };
        if !first {
            self.doubles.fetch_add(1, Ordering::Relaxed);
            note(
                &self.evidence,
                format!(
                    "double: reply to {text:?} delivered again to {to}, at {:.3}s",
                    at as f64 / 1e6
                ),
            );
            return;
        }
        self.sequence
            .lock()
            .unwrap()
            .entry(to.to_string())
            .or_default()
            .push(text.clone());
        if let Some((_, index)) = parse_text(&text) {
            let mut per = self.per_recipient.lock().unwrap();
            let max = per.entry(to.to_string()).or_insert(index);
            if *max > index {
                self.order_violations.fetch_add(1, Ordering::Relaxed);
                note(
                    &self.evidence,
                    format!(
                        "sms order: {to} got #{index} after #{}, at {:.3}s",
                        *max,
                        at as f64 / 1e6
                    ),
                );
            }
            *max = (*max).max(index);
        }
        if let Some(w) = self.waiters.lock().unwrap().remove(&text) {
            let _ = w.send(at);
        }
    }

    fn stats(&self) -> SendStats {
        SendStats {
            total: self.total.load(Ordering::SeqCst),
            distinct: self.arrivals.lock().unwrap().len() as u64,
            doubles: self.doubles.load(Ordering::SeqCst),
            order_violations: self.order_violations.load(Ordering::SeqCst),
            lookups: self.lookups.load(Ordering::SeqCst),
            evidence: self.evidence.lock().unwrap().clone(),
        }
    }
}

/// The read side every fake SMS provider shares (its [`SendLog`]).
macro_rules! send_log_readers {
    () => {
        /// A receiver that fires (with the arrival time, µs) when the reply to `text` arrives.
        pub fn wait_for(&self, text: &str) -> oneshot::Receiver<u64> {
            let (tx, rx) = oneshot::channel();
            self.sends_log()
                .waiters
                .lock()
                .unwrap()
                .insert(text.to_string(), tx);
            rx
        }

        /// When the reply to `text` arrived, µs (once per delivery).
        pub fn arrivals_of(&self, text: &str) -> Vec<u64> {
            self.sends_log()
                .arrivals
                .lock()
                .unwrap()
                .get(text)
                .cloned()
                .unwrap_or_default()
        }

        /// First-arrival times of every reply, µs, sorted.
        pub fn arrival_times(&self) -> Vec<u64> {
            let mut v: Vec<u64> = self
                .sends_log()
                .arrivals
                .lock()
                .unwrap()
                .values()
                .filter_map(|t| t.first().copied())
                .collect();
            v.sort_unstable();
            v
        }

        /// Replies delivered more than once: text → arrival times, µs.
        pub fn doubled(&self) -> Vec<(String, Vec<u64>)> {
            self.sends_log()
                .arrivals
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, t)| t.len() > 1)
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect()
        }

        /// Each recipient's replies in the order they first arrived.
        pub fn sequences(&self) -> HashMap<String, Vec<String>> {
            self.sends_log().sequence.lock().unwrap().clone()
        }

        /// Every accepted send so far, in arrival order.
        pub fn sends(&self) -> Vec<SendRecord> {
            self.sends_log().log.lock().unwrap().clone()
        }

        pub fn distinct(&self) -> u64 {
            self.sends_log().arrivals.lock().unwrap().len() as u64
        }

        pub fn stats(&self) -> SendStats {
            self.sends_log().stats()
        }
    };
}

#[derive(Default)]
struct TwilioInner {
    expected_auth: String,
    sends: SendLog,
    /// Recipient → what was sent to them, oldest first: the Messages list.
    listed: Mutex<HashMap<String, Vec<Listed>>>,
}

/// A message as Twilio's Messages list shows it.
#[derive(Clone)]
struct Listed {
    sid: String,
    from: String,
    body: String,
    created: DateTime<Utc>,
}

/// One message a fake SMS provider accepted.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SendRecord {
    /// The provider (evidence of runs before TextMagic was driven holds Twilio's only).
    #[serde(default)]
    pub channel: Channel,
    pub at_us: u64,
    /// The recipient as the request named it (Twilio: `To`, E.164; TextMagic: `phones`,
    /// digits).
    pub to: String,
    /// The body less the runner's `echo: ` (so the message text it answers).
    pub text: String,
    /// The id this fake answered with.
    pub sid: String,
    /// The sending process, from the deliverer's `User-Agent` (`… (<host>:<pid>)`).
    pub sender_pid: Option<u32>,
}

/// The pid in a deliverer's `User-Agent`, `switchboard-deliver/<version> (<host>:<pid>)`.
pub fn pid_of_user_agent(ua: &str) -> Option<u32> {
    ua.rsplit_once(':')?.1.strip_suffix(')')?.parse().ok()
}

/// What a fake SMS provider saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SendStats {
    /// Every accepted send request.
    pub total: u64,
    /// Distinct replies.
    pub distinct: u64,
    /// Sends of a reply already delivered.
    pub doubles: u64,
    /// Replies that reached a person before an earlier one of theirs.
    pub order_violations: u64,
    /// Requests for the message list (deliverers looking up a part of uncertain outcome).
    pub lookups: u64,
    pub evidence: Vec<String>,
}

#[derive(Clone)]
pub struct LoadTwilio {
    pub url: String,
    pub account_sid: String,
    pub auth_token: String,
    inner: Arc<TwilioInner>,
}

#[derive(Deserialize)]
struct SendForm {
    #[serde(rename = "To")]
    to: String,
    #[serde(rename = "From", default)]
    from: String,
    #[serde(rename = "Body")]
    body: String,
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(rename = "To")]
    to: Option<String>,
    #[serde(rename = "From")]
    from: Option<String>,
    #[serde(rename = "DateSent>")]
    date_sent_after: Option<chrono::NaiveDate>,
    #[serde(rename = "PageSize")]
    page_size: Option<usize>,
    #[serde(rename = "Page")]
    page: Option<usize>,
}

impl LoadTwilio {
    pub async fn start(account_sid: &str, auth_token: &str) -> Self {
        let expected_auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{account_sid}:{auth_token}"))
        );
        let mut this = Self {
            url: String::new(),
            account_sid: account_sid.into(),
            auth_token: auth_token.into(),
            inner: Arc::new(TwilioInner {
                expected_auth,
                ..Default::default()
            }),
        };
        let router = Router::new()
            .route(
                "/2010-04-01/Accounts/{account}/Messages.json",
                post(Self::create_message).get(Self::list_messages),
            )
            .with_state(this.clone());
        this.url = serve(router).await;
        this
    }

    fn sends_log(&self) -> &SendLog {
        &self.inner.sends
    }

    send_log_readers!();

    /// Twilio's Messages list, for one recipient (`To` is required here: deliverers always
    /// name one, and a load run's whole log is too long to list), most recent first.
    async fn list_messages(
        State(s): State<LoadTwilio>,
        Path(account): Path<String>,
        headers: HeaderMap,
        Query(q): Query<ListQuery>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let inner = &s.inner;
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth != inner.expected_auth {
            return (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"code": 20003, "message": "Authenticate", "status": 401})),
            );
        }
        inner.sends.lookups.fetch_add(1, Ordering::Relaxed);
        let Some(to) = q.to else {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 20001, "message": "this fake lists by To only", "status": 400}),
                ),
            );
        };
        let mut listed: Vec<Listed> = inner
            .listed
            .lock()
            .unwrap()
            .get(&to)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| q.from.as_ref().is_none_or(|f| &m.from == f))
            .filter(|m| {
                q.date_sent_after
                    .is_none_or(|d| m.created.date_naive() >= d)
            })
            .collect();
        listed.reverse();
        let (page, size) = (
            q.page.unwrap_or(0),
            q.page_size.unwrap_or(50).clamp(1, 1000),
        );
        let rest = listed.split_off((page * size).min(listed.len()));
        let next = (rest.len() > size).then(|| {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query.append_pair("To", &to);
            if let Some(f) = &q.from {
                query.append_pair("From", f);
            }
            if let Some(d) = q.date_sent_after {
                query.append_pair("DateSent>", &d.to_string());
            }
            query.append_pair("PageSize", &size.to_string());
            query.append_pair("Page", &(page + 1).to_string());
            format!(
                "/2010-04-01/Accounts/{account}/Messages.json?{}",
                query.finish()
            )
        });
        let rfc2822 = |t: DateTime<Utc>| t.format("%a, %d %b %Y %H:%M:%S %z").to_string();
        let messages: Vec<_> = rest
            .iter()
            .take(size)
            .map(|m| {
                serde_json::json!({
                    "sid": m.sid, "to": to, "from": m.from, "body": m.body, "status": "sent",
                    "direction": "outbound-api", "date_created": rfc2822(m.created),
                    "date_sent": rfc2822(m.created),
                })
            })
            .collect();
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "messages": messages, "page": page, "page_size": size, "next_page_uri": next,
            })),
        )
    }

    async fn create_message(
        State(s): State<LoadTwilio>,
        headers: HeaderMap,
        Form(f): Form<SendForm>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let at = now_us();
        let inner = &s.inner;
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth != inner.expected_auth {
            return (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"code": 20003, "message": "Authenticate", "status": 401})),
            );
        }
        let sid = format!("SM{}", uuid::Uuid::new_v4().simple());
        // Listed before it is recorded, as Twilio lists a message once it took it.
        inner
            .listed
            .lock()
            .unwrap()
            .entry(f.to.clone())
            .or_default()
            .push(Listed {
                sid: sid.clone(),
                from: f.from.clone(),
                body: f.body.clone(),
                created: Utc::now(),
            });
        inner
            .sends
            .record(Channel::Twilio, at, &f.to, &f.body, &sid, &headers);
        (
            StatusCode::CREATED,
            Json(serde_json::json!({"sid": sid, "to": f.to, "status": "queued"})),
        )
    }
}

/// TextMagic's v2 Messages API as a deliverer uses it: `POST /api/v2/messages` (JSON `text`,
/// `phones` as digits, `from`; `X-TM-Username`/`X-TM-Key`) answers 201 with the message's id;
/// `GET` on it lists the account's outbound messages, newest first, by `page` and `limit` (the
/// list has no filter by recipient: a deliverer pages back until it passes the attempt).
#[derive(Clone)]
pub struct LoadTextMagic {
    pub url: String,
    pub username: String,
    pub api_key: String,
    inner: Arc<TextMagicInner>,
}

#[derive(Default)]
struct TextMagicInner {
    sends: SendLog,
    /// Every message taken, oldest first: the outbound list.
    listed: Mutex<Vec<TextMagicListed>>,
    ids: AtomicU64,
}

struct TextMagicListed {
    id: u64,
    receiver: String,
    sender: String,
    text: String,
    created: DateTime<Utc>,
}

#[derive(Deserialize)]
struct TextMagicSend {
    text: String,
    phones: String,
    #[serde(default)]
    from: String,
}

#[derive(Deserialize)]
struct TextMagicPage {
    page: Option<usize>,
    limit: Option<usize>,
}

impl LoadTextMagic {
    pub async fn start(username: &str, api_key: &str) -> Self {
        let mut this = Self {
            url: String::new(),
            username: username.into(),
            api_key: api_key.into(),
            inner: Arc::new(TextMagicInner {
                ids: AtomicU64::new(60_000_000),
                ..Default::default()
            }),
        };
        let router = Router::new()
            .route("/api/v2/messages", post(Self::send).get(Self::list))
            .with_state(this.clone());
        this.url = serve(router).await;
        this
    }

    fn sends_log(&self) -> &SendLog {
        &self.inner.sends
    }

    send_log_readers!();

    fn refused(&self, headers: &HeaderMap) -> Option<(StatusCode, Json<serde_json::Value>)> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        (header("x-tm-username") != Some(self.username.as_str())
            || header("x-tm-key") != Some(self.api_key.as_str()))
        .then(|| {
            (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"code": 401, "message": "Unauthorized"})),
            )
        })
    }

    async fn send(
        State(s): State<LoadTextMagic>,
        headers: HeaderMap,
        Json(m): Json<TextMagicSend>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        let at = now_us();
        if let Some(refused) = s.refused(&headers) {
            return refused;
        }
        if m.phones.is_empty() || !m.phones.bytes().all(|b| b.is_ascii_digit()) {
            return (
                StatusCode::BAD_REQUEST,
                Json(
                    serde_json::json!({"code": 400, "message": "Validation Failed",
                    "errors": {"fields": {"phones": ["Invalid phone number format."]}}}),
                ),
            );
        }
        let inner = &s.inner;
        let id = inner.ids.fetch_add(1, Ordering::SeqCst);
        inner.listed.lock().unwrap().push(TextMagicListed {
            id,
            receiver: m.phones.clone(),
            sender: m.from.clone(),
            text: m.text.clone(),
            created: Utc::now(),
        });
        inner.sends.record(
            Channel::TextMagic,
            at,
            &m.phones,
            &m.text,
            &id.to_string(),
            &headers,
        );
        (
            StatusCode::CREATED,
            Json(serde_json::json!({
                "id": id, "href": format!("/api/v2/messages/{id}"), "type": "message",
                "sessionId": id, "bulkId": null, "messageId": id, "scheduleId": null,
            })),
        )
    }

    async fn list(
        State(s): State<LoadTextMagic>,
        headers: HeaderMap,
        Query(q): Query<TextMagicPage>,
    ) -> (StatusCode, Json<serde_json::Value>) {
        if let Some(refused) = s.refused(&headers) {
            return refused;
        }
        let inner = &s.inner;
        inner.sends.lookups.fetch_add(1, Ordering::Relaxed);
        let (page, limit) = (
            q.page.unwrap_or(1).max(1),
            q.limit.unwrap_or(10).clamp(1, 100),
        );
        let listed = inner.listed.lock().unwrap();
        let page_count = listed.len().div_ceil(limit).max(1);
        let resources: Vec<_> = listed
            .iter()
            .rev()
            .skip((page - 1) * limit)
            .take(limit)
            .map(|m| {
                serde_json::json!({
                    "id": m.id, "receiver": m.receiver, "sender": m.sender, "text": m.text,
                    "messageTime": m.created.format("%Y-%m-%dT%H:%M:%S%z").to_string(),
                    "status": "d", "charset": "ISO-8859-1", "partsCount": 1, "deleted": false,
                })
            })
            .collect();
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "page": page, "limit": limit, "pageCount": page_count, "resources": resources,
            })),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_channels::textmagic::TextMagicSender;
    use switchboard_channels::twilio::TwilioSender;
    use switchboard_kit::config::{Secret, TextMagicConfig, TwilioConfig};

    #[tokio::test]
    async fn the_load_textmagic_records_sends_and_lists_them_as_textmagic_does() {
        let fake = LoadTextMagic::start("load-user", "load-key").await;
        let textmagic = TextMagicSender::new(TextMagicConfig {
            username: "load-user".into(),
            api_key: Secret::new("load-key"),
            from_number: "15555550198".into(),
            api_base: fake.url.clone(),
            ..Default::default()
        });
        let since = Utc::now();
        let id = textmagic
            .send_text("+14155550100", "", "echo: s1#0")
            .await
            .unwrap();
        // Others' messages come after it, more than one page of them.
        for i in 0..150 {
            textmagic
                .send_text("+14155550101", "", &format!("echo: s2#{i}"))
                .await
                .unwrap();
        }
        let found = textmagic
            .find_text("+14155550100", "", "echo: s1#0", since)
            .await;
        assert_eq!(found, Ok(vec![id.clone()]));
        let sends = fake.sends();
        assert_eq!(sends.len(), 151);
        assert_eq!(sends[0].channel, Channel::TextMagic);
        assert_eq!(
            (sends[0].to.as_str(), sends[0].text.as_str()),
            ("14155550100", "s1#0")
        );
        assert_eq!(sends[0].sid, id);
        assert!(fake.stats().lookups >= 2, "the look-up read two pages");
        assert_eq!(fake.stats().doubles, 0);
    }

    #[tokio::test]
    async fn the_load_twilio_lists_what_it_took_as_twilio_lists_its_messages() {
        let fake = LoadTwilio::start("ACload", "load-token").await;
        let twilio = TwilioSender::new(TwilioConfig {
            account_sid: "ACload".into(),
            auth_token: Secret::new("load-token"),
            from_number: "+15555550199".into(),
            api_base: fake.url.clone(),
            ..Default::default()
        });
        let since = Utc::now();
        let sid = twilio
            .send_body("+14155550100", "", "echo: s1#0")
            .await
            .unwrap();
        let found = twilio
            .find_body("+14155550100", "", "echo: s1#0", since)
            .await;
        assert_eq!(found, Ok(vec![sid]));
        let other = twilio
            .find_body("+14155550101", "", "echo: s1#0", since)
            .await;
        assert_eq!(other, Ok(vec![]));
        assert_eq!(fake.stats().lookups, 2);
        assert_eq!(fake.stats().doubles, 0);
    }
}
