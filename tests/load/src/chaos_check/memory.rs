//! The memory half of the chaos verdict: what the embedding, categorisation and summary
//! workers (SIGKILLed like the others) left behind, and whether any prompt carried another
//! person's words.
//!
//! - **Canaries.** Every message of a chaos run carries its person's canary
//!   ([`crate::canary`]). A runner prompt for a person that carries anyone else's canary
//!   (in the message, the summary, curated memory, recalled messages: anywhere in the prompt),
//!   a prompt to the summary or label model carrying two people's canaries, a memory key whose
//!   messages carry two people's canaries, and a summary carrying a canary of someone other
//!   than its person are each a leak.
//! - **Embedded once.** Every logged message of the conversation (not a flush's silent answer,
//!   not a heartbeat's "nothing needs attention") has exactly one vector under the configured
//!   model, filed under the message's own person.
//! - **Categorised once.** Every exchange (a reply, and the message it answers) has one
//!   `exchange_categories` row naming that message, and exactly one `exchange.categorised`
//!   event on the stream.
//! - **No summary lost or doubled.** Per memory key, the journal's `summarised` versions are
//!   1..n, each once; the number of messages version v says it merged is the number marked
//!   with v (`message_marks.summary_version`, set in the summary's own transaction: none merged
//!   twice, none counted and left unmarked); no message carries a version never written; the
//!   row's `messages_covered` is the number of the key's marked messages; and after the run's
//!   wait no message of the key (what is conversation) is left unmarked.
//! - The memory workers caught up within the run's wait (their dead letters are dead letters
//!   like any other: [`Kind::DeadLetter`]).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::{Evidence, Kind, Verdict};
use crate::canary::Canaries;
use crate::parse_text;
use crate::returning::Returned;

/// The stages of the memory workers (their dead letters are counted apart in the report).
pub const MEMORY_STAGES: [&str; 3] = ["embed", "categorise", "summary"];

/// A row of `switchboard.messages`, as the memory checks need it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LoggedMessage {
    pub id: String,
    pub memory_key: String,
    pub person_id: String,
    /// `inbound` or `outbound`.
    pub direction: String,
    /// `metadata->>'kind'` (`notice` for what the person was told while a turn waited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// When its row was written (`created_at`), ms since the epoch.
    #[serde(default)]
    pub logged_ms: i64,
    /// The summary version that merged it (`message_marks.summary_version`; none: not yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_version: Option<i64>,
    /// The canaries its text carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<String>,
    /// An operator wrote it during a takeover (`metadata.operator`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator: bool,
}

impl LoggedMessage {
    /// An answer of the agent (an exchange's reply), not a notice or a heartbeat.
    pub fn is_reply(&self) -> bool {
        self.direction == "outbound"
            && !matches!(self.kind.as_deref(), Some("notice" | "heartbeat_ok"))
    }

    /// What a summary merges: everything but the flush's silent answer and a heartbeat's
    /// "nothing needs attention" (`switchboard_memory::NOT_CONVERSATION`).
    pub fn is_conversation(&self) -> bool {
        !matches!(self.kind.as_deref(), Some("memory_flush" | "heartbeat_ok"))
    }
}

/// A row of `switchboard.message_vectors` (without the vector).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VectorRow {
    pub message_id: String,
    pub model: String,
    pub person_id: String,
}

/// A row of `switchboard.exchange_categories`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CategoryRow {
    pub outbound_id: String,
    pub inbound_id: Option<String>,
    pub person_id: String,
    pub label: String,
}

/// A row of `switchboard.summaries`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SummaryRow {
    pub memory_key: String,
    pub version: i64,
    pub last_message: Option<String>,
    pub messages_covered: i64,
    /// The canaries its text carries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<String>,
}

/// A `summarised` entry of a session's journal.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SummarisedEntry {
    pub memory_key: String,
    pub session_id: String,
    pub version: i64,
    pub last_message: String,
    pub merged: i64,
    pub covered: i64,
    /// When it was written, ms since the epoch.
    #[serde(default)]
    pub at_ms: i64,
}

/// One prompt the summary or label model got: what it was for, and the canaries it carried.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelPrompt {
    /// `summary` or `label`.
    pub purpose: String,
    pub canaries: Vec<String>,
}

/// What a chaos run recorded of memory (`Evidence::memory`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryEvidence {
    pub canaries: Canaries,
    /// `[embedding] model`: the model every message must have its vector under.
    pub embedding_model: String,
    pub messages: Vec<LoggedMessage>,
    pub vectors: Vec<VectorRow>,
    pub categories: Vec<CategoryRow>,
    /// The outbound message id of every `exchange.categorised` event on the stream (repeats
    /// kept).
    pub categorised_events: Vec<String>,
    /// Why the events could not be read, if they could not.
    #[serde(default)]
    pub events_unreadable: Option<String>,
    pub summaries: Vec<SummaryRow>,
    pub summarised: Vec<SummarisedEntry>,
    pub model_prompts: Vec<ModelPrompt>,
    /// The memory workers caught up (every message embedded, every exchange labelled, every
    /// key summarised, their consumers empty) within the run's wait.
    pub caught_up: bool,
    /// How long the run waited for that after the drain, s.
    pub waited_s: f64,
    /// The people who came back after the load ([`crate::returning`]).
    #[serde(default)]
    pub returned: Vec<Returned>,
}

/// The memory figures of a run, for the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MemoryTally {
    pub prompts: u64,
    /// Runner prompts with a canary outside their own message (memory reached the prompt).
    pub prompts_with_memory: u64,
    pub prompts_with_foreign_canary: u64,
    pub model_prompts: u64,
    pub model_prompts_mixed: u64,
    pub messages: u64,
    pub embedded_once: u64,
    pub exchanges: u64,
    pub categorised_once: u64,
    pub categorised_events: u64,
    pub memory_keys: u64,
    pub summaries: u64,
    pub summary_versions: u64,
    pub messages_summarised: u64,
    pub messages_unsummarised: u64,
    /// Messages of sessions everyone shares (scope `main`), each marked never to be merged.
    pub messages_shared: u64,
    pub memory_dead_letters: u64,
    /// People who came back once their summary was written, and of them those whose prompt
    /// carried memory.
    pub returned_summarised: u64,
    pub returned_remembered: u64,
    pub caught_up: bool,
    pub waited_s: f64,
}

/// Judge the memory evidence into `v` (findings and `v.memory`).
pub(super) fn judge(e: &Evidence, v: &mut Verdict) {
    let Some(m) = &e.memory else { return };
    let mut t = MemoryTally {
        caught_up: m.caught_up,
        waited_s: m.waited_s,
        memory_dead_letters: e
            .dead_letters
            .iter()
            .filter(|d| MEMORY_STAGES.contains(&d.stage.as_str()))
            .count() as u64,
        ..Default::default()
    };
    canaries(e, m, v, &mut t);
    returned(e, m, v, &mut t);
    embedded(m, v, &mut t);
    categorised(m, v, &mut t);
    summaries(m, v, &mut t);
    if !m.caught_up {
        v.add(
            Kind::MemoryNotCaughtUp,
            format!(
                "the memory workers had not caught up {:.0} s after the drain",
                m.waited_s
            ),
        );
    }
    v.memory = Some(t);
}

/// A person who came back after their summary was written finds it in the prompt: every
/// runner call carrying their message carries memory (a canary outside the message fences).
fn returned(e: &Evidence, m: &MemoryEvidence, v: &mut Verdict, t: &mut MemoryTally) {
    for r in m
        .returned
        .iter()
        .filter(|r| r.summarised_before && r.accepted)
    {
        t.returned_summarised += 1;
        let calls: Vec<_> = e
            .runner_calls
            .iter()
            .filter(|c| {
                c.messages()
                    .iter()
                    .any(|text| crate::parse_text(text) == Some((r.sender, r.index)))
            })
            .collect();
        if calls.is_empty() {
            continue; // never run: the answered checks say so
        }
        if calls.iter().all(|c| c.canaries.outside_messages > 0) {
            t.returned_remembered += 1;
        } else {
            v.add(
                Kind::ReturnerForgotten,
                format!(
                    "s{}#{} came back after their summary was written, yet {} of its {} runner \
                     calls carried no memory",
                    r.sender,
                    r.index,
                    calls
                        .iter()
                        .filter(|c| c.canaries.outside_messages == 0)
                        .count(),
                    calls.len()
                ),
            );
        }
    }
}

/// Whose canaries `tokens` are (`None`: nobody's of this run).
fn owners(c: &Canaries, tokens: &[String]) -> BTreeSet<Option<usize>> {
    tokens.iter().map(|t| c.owner(t)).collect()
}

fn canaries(e: &Evidence, m: &MemoryEvidence, v: &mut Verdict, t: &mut MemoryTally) {
    let c = &m.canaries;
    for call in &e.runner_calls {
        t.prompts += 1;
        if call.canaries.outside_messages > 0 {
            t.prompts_with_memory += 1;
        }
        let Some((sender, _)) = parse_text(&call.text) else {
            continue;
        };
        let foreign: Vec<&String> = call
            .canaries
            .tokens
            .iter()
            .filter(|k| c.owner(k) != Some(sender))
            .collect();
        if !foreign.is_empty() {
            t.prompts_with_foreign_canary += 1;
            v.add(
                Kind::ForeignCanary,
                format!(
                    "the prompt of {} (turn {:?}, {}) carried {foreign:?}, not sender {sender}'s",
                    call.text, call.seq, call.person
                ),
            );
        }
    }
    for p in &m.model_prompts {
        t.model_prompts += 1;
        let o = owners(c, &p.canaries);
        if o.len() > 1 || o.contains(&None) {
            t.model_prompts_mixed += 1;
            v.add(
                Kind::ModelPromptMixed,
                format!("a {} prompt carried {:?}", p.purpose, p.canaries),
            );
        }
    }
    // Each memory key is one person's: by the canaries of its messages.
    let mut key_owners: BTreeMap<&str, BTreeSet<Option<usize>>> = BTreeMap::new();
    for msg in &m.messages {
        key_owners
            .entry(msg.memory_key.as_str())
            .or_default()
            .extend(owners(c, &msg.canaries));
    }
    // A shared session's key holds everyone's messages by design: it is never summarised
    // (judged in `summaries`) nor read into anyone's prompt (the canary checks).
    for (key, o) in key_owners.iter().filter(|(key, _)| !is_shared_key(key)) {
        if o.len() > 1 || o.contains(&None) {
            v.add(
                Kind::KeyMixesPeople,
                format!("memory key {key} holds messages of senders {o:?}"),
            );
        }
    }
    for s in &m.summaries {
        let own = key_owners.get(s.memory_key.as_str());
        let foreign: Vec<&String> = s
            .canaries
            .iter()
            .filter(|k| {
                c.owner(k)
                    .is_none_or(|who| own.is_none_or(|o| !o.contains(&Some(who))))
            })
            .collect();
        if !foreign.is_empty() {
            v.add(
                Kind::SummaryOfAnotherPerson,
                format!(
                    "the summary of {} (version {}) carried {foreign:?}, its messages {:?}",
                    s.memory_key, s.version, own
                ),
            );
        }
    }
}

fn embedded(m: &MemoryEvidence, v: &mut Verdict, t: &mut MemoryTally) {
    let person: HashMap<&str, &str> = m
        .messages
        .iter()
        .map(|x| (x.id.as_str(), x.person_id.as_str()))
        .collect();
    let mut vectors: HashMap<&str, u32> = HashMap::new();
    for r in m.vectors.iter().filter(|r| r.model == m.embedding_model) {
        *vectors.entry(r.message_id.as_str()).or_default() += 1;
        if let Some(p) = person.get(r.message_id.as_str())
            && *p != r.person_id
        {
            v.add(
                Kind::VectorOfAnotherPerson,
                format!(
                    "the vector of message {} is filed under {}, the message is {}'s",
                    r.message_id, r.person_id, p
                ),
            );
        }
    }
    // What is not conversation is never embedded (nor recalled, nor summarised).
    for msg in m.messages.iter().filter(|x| x.is_conversation()) {
        t.messages += 1;
        match vectors.get(msg.id.as_str()).copied().unwrap_or(0) {
            1 => t.embedded_once += 1,
            n => v.add(
                Kind::NotEmbeddedOnce,
                format!(
                    "{} message {} of {} has {n} vectors under {}",
                    msg.direction, msg.id, msg.memory_key, m.embedding_model
                ),
            ),
        }
    }
}

fn categorised(m: &MemoryEvidence, v: &mut Verdict, t: &mut MemoryTally) {
    if let Some(why) = &m.events_unreadable {
        v.add(
            Kind::MemoryEvidenceUnreadable,
            format!("exchange.categorised events: {why}"),
        );
    }
    let by_id: HashMap<&str, &LoggedMessage> =
        m.messages.iter().map(|x| (x.id.as_str(), x)).collect();
    let mut rows: HashMap<&str, Vec<&CategoryRow>> = HashMap::new();
    for r in &m.categories {
        rows.entry(r.outbound_id.as_str()).or_default().push(r);
    }
    let mut events: HashMap<&str, u32> = HashMap::new();
    for id in &m.categorised_events {
        *events.entry(id.as_str()).or_default() += 1;
    }
    t.categorised_events = m.categorised_events.len() as u64;
    for reply in m.messages.iter().filter(|x| x.is_reply()) {
        t.exchanges += 1;
        let labels = rows.get(reply.id.as_str()).map_or(&[][..], Vec::as_slice);
        if labels.len() != 1 {
            v.add(
                Kind::NotCategorisedOnce,
                format!(
                    "the exchange of reply {} ({}) has {} labels",
                    reply.id,
                    reply.memory_key,
                    labels.len()
                ),
            );
            continue;
        }
        let answered = labels[0].inbound_id.as_deref().and_then(|id| by_id.get(id));
        match answered {
            Some(msg) if msg.direction == "inbound" && msg.memory_key == reply.memory_key => {}
            // An operator's reply is an exchange of its own, as a message the agent starts: the
            // messages it answers were held, never paired with an answer of the agent's.
            None if reply.operator && labels[0].inbound_id.is_none() => {}
            _ => v.add(
                Kind::LabelWithoutItsMessage,
                format!(
                    "the exchange of reply {} ({}) names {:?} as the message it answers",
                    reply.id, reply.memory_key, labels[0].inbound_id
                ),
            ),
        }
        match events.get(reply.id.as_str()).copied().unwrap_or(0) {
            1 => t.categorised_once += 1,
            n => v.add(
                Kind::CategorisedEventsNotOnce,
                format!(
                    "the exchange of reply {} ({}) was announced {n} times",
                    reply.id, reply.memory_key
                ),
            ),
        }
    }
}

/// The time a UUIDv7 was minted, ms since the epoch (its first 48 bits).
fn minted_ms(id: &str) -> Option<i64> {
    let hex: String = id.chars().filter(|c| *c != '-').take(12).collect();
    i64::from_str_radix(&hex, 16).ok()
}

/// "<id> (minted <t>, logged <t>)", times in s since `origin` ms.
fn when(msg: &LoggedMessage, origin: i64) -> String {
    let s = |ms: i64| format!("{:.3}s", (ms - origin) as f64 / 1e3);
    format!(
        "{} {} (minted {}, logged {})",
        msg.direction,
        msg.id,
        minted_ms(&msg.id).map_or("?".into(), s),
        s(msg.logged_ms)
    )
}

/// Whether `key` is the memory key of a session everyone shares (`<identity>:main`).
fn is_shared_key(key: &str) -> bool {
    key.ends_with(":main")
}

fn summaries(m: &MemoryEvidence, v: &mut Verdict, t: &mut MemoryTally) {
    // Every key's conversation, in id order (UUIDv7 text sorts as the ids do).
    let mut of_key: BTreeMap<&str, Vec<&LoggedMessage>> = BTreeMap::new();
    for msg in m.messages.iter().filter(|x| x.is_conversation()) {
        of_key.entry(msg.memory_key.as_str()).or_default().push(msg);
    }
    of_key
        .values_mut()
        .for_each(|ms| ms.sort_unstable_by(|a, b| a.id.cmp(&b.id)));
    // Times in findings count from the first message logged.
    let origin = m.messages.iter().map(|x| x.logged_ms).min().unwrap_or(0);
    t.memory_keys = of_key.len() as u64;
    let rows: HashMap<&str, &SummaryRow> = m
        .summaries
        .iter()
        .map(|s| (s.memory_key.as_str(), s))
        .collect();
    // Per key and version, the distinct things the journal says that version did, and when
    // (each sibling session journals the same entry).
    type Did<'a> = (BTreeSet<(&'a str, i64, i64)>, i64);
    let mut journal: BTreeMap<&str, BTreeMap<i64, Did>> = BTreeMap::new();
    for j in &m.summarised {
        let did = journal
            .entry(j.memory_key.as_str())
            .or_default()
            .entry(j.version)
            .or_insert_with(|| (BTreeSet::new(), j.at_ms));
        did.0.insert((j.last_message.as_str(), j.merged, j.covered));
        did.1 = did.1.min(j.at_ms);
    }
    t.summaries = rows.len() as u64;
    let empty = Vec::new();
    let keys: BTreeSet<&str> = rows.keys().copied().chain(of_key.keys().copied()).collect();
    for key in keys {
        let msgs = of_key.get(key).unwrap_or(&empty);
        let row = rows.get(key);
        let versions = journal.remove(key).unwrap_or_default();
        if is_shared_key(key) {
            t.messages_shared += msgs.len() as u64;
            let unmarked = msgs.iter().filter(|x| x.summary_version != Some(0)).count();
            if row.is_some() || !versions.is_empty() || unmarked > 0 {
                v.add(
                    Kind::SharedSummarised,
                    format!(
                        "{key}: summary {:?}, journal versions {:?}, {unmarked} of {} \
                         messages not marked never to merge",
                        row.map(|r| r.version),
                        versions.keys().collect::<Vec<_>>(),
                        msgs.len()
                    ),
                );
            }
            continue;
        }
        let top = row.map_or(0, |r| r.version);
        t.summary_versions += versions.len() as u64;
        let expected: Vec<i64> = (1..=top).collect();
        let got: Vec<i64> = versions.keys().copied().collect();
        if got != expected {
            v.add(
                Kind::SummaryVersions,
                format!("{key}: the summary is at version {top}, the journal has versions {got:?}"),
            );
        }
        let mut marked: BTreeMap<i64, u64> = BTreeMap::new();
        for x in msgs {
            if let Some(version) = x.summary_version {
                *marked.entry(version).or_default() += 1;
            }
        }
        for (version, (did, at_ms)) in &versions {
            if did.len() != 1 {
                v.add(
                    Kind::SummaryVersions,
                    format!("{key}: version {version} was written more than once: {did:?}"),
                );
                continue;
            }
            let &(last, merged, _) = did.iter().next().expect("one");
            let carry = marked.remove(version).unwrap_or(0);
            if merged != carry as i64 {
                v.add(
                    Kind::SummaryCoverage,
                    format!(
                        "{key}: version {version} (written at {:.3}s, up to {last}) says it \
                         merged {merged} messages; {carry} carry its mark",
                        (at_ms - origin) as f64 / 1e3
                    ),
                );
            }
        }
        for (version, n) in marked.iter().filter(|(version, _)| **version > top) {
            v.add(
                Kind::SummaryCoverage,
                format!("{key}: {n} messages carry version {version}; the summary is at {top}"),
            );
        }
        let covered = msgs.iter().filter(|x| x.summary_version.is_some()).count() as i64;
        if let Some(r) = row
            && r.messages_covered != covered
        {
            v.add(
                Kind::SummaryCoverage,
                format!(
                    "{key}: the summary says it covers {} messages; {covered} carry a version",
                    r.messages_covered
                ),
            );
        }
        let left: Vec<&&LoggedMessage> = msgs
            .iter()
            .filter(|x| x.summary_version.is_none())
            .collect();
        t.messages_summarised += covered as u64;
        t.messages_unsummarised += left.len() as u64;
        if !left.is_empty() {
            let first: Vec<String> = left.iter().take(3).map(|x| when(x, origin)).collect();
            v.add(
                Kind::NotSummarised,
                format!(
                    "{key}: {} of {} messages never summarised, first {first:?}",
                    left.len(),
                    msgs.len()
                ),
            );
        }
    }
}
