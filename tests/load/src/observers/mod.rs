//! What a load or chaos run watches at the third parties, on the shared fakes of
//! `switchboard-fakes` (one per provider), through their observer hooks:
//!
//! - [`LoadRunner`]: the agent runner ([`FakeRunner`]) with a configurable latency. It answers
//!   `echo: <text>` and checks, per person, that turns arrive in order (`s<sender>#<index>`) and
//!   never overlap; it can answer 503 or stop listening (an outage).
//! - [`LoadTwilio`], [`LoadTextMagic`]: the SMS providers ([`FakeTwilio`], [`FakeTextMagic`],
//!   whose message lists a deliverer reads for a part of uncertain outcome), and
//!   [`LoadTelegram`], [`LoadSlack`], [`LoadWhatsApp`]: the chat platforms ([`FakeTelegram`],
//!   [`FakeSlack`], whose history a deliverer reads, [`FakeWhatsApp`]). Each one's [`SendLog`]
//!   records when each reply first arrived, counts replies delivered more than once, checks
//!   each person's order, and wakes whoever waits for a reply.
//!
//! Both keep counters for the bench and, for the chaos checker, a record of every call and
//! every send ([`CallRecord`], [`SendRecord`]).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use switchboard_fakes::{FakeRunner, RunObserver, RunnerCall, fenced_texts, person_of};

use super::{now_us, parse_text};

mod sends;

pub use sends::{
    LoadSlack, LoadTelegram, LoadTextMagic, LoadTwilio, LoadWhatsApp, ProviderFake, SendRecord,
    SendStats, Watched, pid_of_user_agent,
};

/// Example lines kept per kind of finding (the text before the first `:`), so that a flood of
/// one kind never hides the first example of another.
const MAX_EVIDENCE_PER_KIND: usize = 20;

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

/// What the runner saw, call by call: the [`RunObserver`] of a load run's runner.
#[derive(Default)]
struct RunLog {
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
    /// Calls answered 503.
    refused: Mutex<Vec<RefusedCall>>,
}

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

/// The turn number from the prompt's first line (`[Switchboard turn <seq> | …`).
fn seq_of_prompt(prompt: &str) -> Option<i64> {
    prompt
        .strip_prefix("[Switchboard turn ")?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// The message texts of a prompt without their canaries (`s<sender>#<index>`): what every
/// order check reads and what the answer echoes.
fn message_texts(prompt: &str) -> Vec<String> {
    fenced_texts(prompt)
        .into_iter()
        .map(|t| super::canary::strip(t).to_string())
        .collect()
}

/// The end of a call: its record's end time, the person's in-flight count, its timing.
struct CallEnd {
    log: Arc<RunLog>,
    person: String,
    text: String,
    log_index: usize,
    started: u64,
}

impl Drop for CallEnd {
    fn drop(&mut self) {
        let now = now_us();
        if let Some(c) = self.log.log.lock().unwrap().get_mut(self.log_index) {
            c.end_us = Some(now);
        }
        if let Some(p) = self.log.persons.lock().unwrap().get_mut(&self.person) {
            p.in_flight = p.in_flight.saturating_sub(1);
            if let Some(i) = p.in_flight_texts.iter().position(|t| t == &self.text) {
                p.in_flight_texts.swap_remove(i);
            }
        }
        if self.log.record_timing.load(Ordering::Relaxed) {
            self.log
                .timing
                .lock()
                .unwrap()
                .insert(std::mem::take(&mut self.text), now - self.started);
        }
    }
}

/// The log behind an `Arc`, so a call's end can reach it.
struct RunWatch(Arc<RunLog>);

impl RunObserver for RunWatch {
    fn refused(&self, call: &RunnerCall) {
        self.0.refused.lock().unwrap().push(RefusedCall {
            at_us: now_us(),
            person: person_of(&call.prompt),
            texts: message_texts(&call.prompt),
        });
    }

    fn began(&self, call: &RunnerCall) -> Box<dyn Send> {
        let started = now_us();
        let inner = &self.0;
        let person = person_of(&call.prompt);
        let fenced = fenced_texts(&call.prompt);
        let canaries = super::canary::PromptCanaries::of_prompt(&call.prompt, &fenced);
        let texts = message_texts(&call.prompt);
        inner.calls.fetch_add(1, Ordering::Relaxed);
        let text = texts.first().cloned().unwrap_or_default();
        let index = parse_text(&text).map(|(_, i)| i);
        let seq = seq_of_prompt(&call.prompt);
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
                texts: if texts.len() > 1 { texts } else { Vec::new() },
                agent: agent_of_prompt(&call.prompt),
                seq,
                idempotency_key: call.idempotency_key.clone(),
                canaries,
            });
            log.len() - 1
        };
        Box::new(CallEnd {
            log: inner.clone(),
            person,
            text,
            log_index,
            started,
        })
    }
}

/// The agent runner of a load run: [`FakeRunner`] keeping no calls of its own, watched by a
/// [`RunLog`], answering every message a call carries (`echo: s1#2 s1#3`).
#[derive(Clone)]
pub struct LoadRunner {
    pub url: String,
    runner: FakeRunner,
    log: Arc<RunLog>,
}

impl LoadRunner {
    /// Listening on a port of [`super::pipeline::LOAD_PORTS`], so that it can listen there
    /// again after an outage ([`Self::stop_listening`]).
    pub async fn start(delay: Duration) -> Self {
        let runner = FakeRunner::unrecorded();
        let log = Arc::new(RunLog::default());
        runner.observe(Arc::new(RunWatch(log.clone())));
        // One answer names every message the call carried, in order.
        runner.answer_with(|call, _| format!("echo: {}", message_texts(&call.prompt).join(" ")));
        runner.set_delay(delay);
        let addr = format!("127.0.0.1:{}", super::pipeline::free_port());
        let runner = runner.listening_on(&addr).await;
        Self {
            url: runner.url.clone(),
            runner,
            log,
        }
    }

    /// Listen on the runner's port again; waits until the port is free to take.
    pub async fn listen(&self) {
        self.runner.listen().await;
    }

    /// Stop listening, as a runner host that went away: new connections are refused, and the
    /// open ones close once their call is answered.
    pub async fn stop_listening(&self) {
        self.runner.stop_listening().await;
    }

    /// Answer 503 to every call (on) or run them again (off).
    pub fn set_unavailable(&self, on: bool) {
        self.runner.set_down(on);
    }

    /// The calls answered 503.
    pub fn refused(&self) -> Vec<RefusedCall> {
        self.log.refused.lock().unwrap().clone()
    }

    pub fn set_delay(&self, d: Duration) {
        self.runner.set_delay(d);
    }

    /// Keep how long each call took (for overhead = end to end minus runner time).
    pub fn record_timing(&self, on: bool) {
        self.log.record_timing.store(on, Ordering::SeqCst);
    }

    /// How long the runner spent on this message's turn (last call), µs.
    pub fn time_of(&self, text: &str) -> Option<u64> {
        self.log.timing.lock().unwrap().get(text).copied()
    }

    /// The seq the session stage gave the turn of this message.
    pub fn seq_of(&self, text: &str) -> Option<i64> {
        self.log.seq_of.lock().unwrap().get(text).copied()
    }

    /// Every call so far, in the order they began.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.log.log.lock().unwrap().clone()
    }

    pub fn stats(&self) -> RunnerStats {
        let i = &self.log;
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
}
