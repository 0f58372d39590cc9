//! Firing the wake-ups agents scheduled for themselves ([`switchboard_kit::wakeups`]).
//!
//! Every dispatch replica runs a [`WakeupFirer`]. Each tick it claims what is due (`FOR UPDATE
//! SKIP LOCKED`, held for `[wakeups] claim_s`), and for each publishes the turn's input where
//! the person's last channel's messages come in: from their address, so identify finds them and
//! the session stage gives it the next turn of their session with the agent that asked. The
//! note is the input's text, marked `scheduled = "wakeup"` so it is not taken for the person's
//! words. Only then is the wake-up marked fired.
//!
//! Once, whatever crashes: the input's id is drawn once and kept on the row, and it is
//! published under `wakeup:<id>` (Nats-Msg-Id and provider message id). A replica that dies
//! after publishing and before marking leaves a claim that lapses; the next one publishes the
//! same message again, which JetStream (within its duplicate window) and the session stage
//! (by provider id, always) drop. A wake-up due while every dispatcher or the database was down
//! fires when they are back, however late: the prompt says when it was due.
//!
//! In the person's order: the input is numbered among the messages from that address
//! ([`ArrivalCounter::number_input`]) and published on their sender subject, so a message the
//! person sent before the wake-up fired that is still on its way (a crashed worker held it)
//! has its turn first, and the wake-up the next one.
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::arrival::{ArrivalCounter, ArrivalError};
use switchboard_kit::config::WakeupsConfig;
use switchboard_kit::proto::{InboundMessage, Person};
use switchboard_kit::runtime::Runtime;
use switchboard_kit::wakeups::{
    self, InputRoute, RemindersCommand, Wakeup, WakeupError, WakeupFilter, WakeupStatus,
};
use switchboard_kit::{Output, Topology};
use uuid::Uuid;

use crate::schedule::last_route_with;

/// `scheduled` on a wake-up's input.
pub const WAKEUP_INPUT: &str = "wakeup";

/// Wake-ups claimed at most per tick; more wait for the next.
const BATCH: i64 = 100;

/// How soon a wake-up whose firing failed is tried again.
const RETRY: Duration = Duration::from_secs(3);

pub struct WakeupFirer {
    db: PgPool,
    runtime: Runtime,
    topology: Topology,
    arrivals: ArrivalCounter,
    tick: Duration,
    hold: Duration,
    /// Who holds a claim (this process), for an operator reading the table.
    claimer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FireError {
    #[error("wake-up store: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Store(#[from] WakeupError),
    #[error("numbering a wake-up's input among the person's messages: {0}")]
    Arrival(#[from] ArrivalError),
    #[error("publishing a wake-up's input: {0}")]
    Publish(#[source] anyhow::Error),
}

impl WakeupFirer {
    pub fn new(db: PgPool, runtime: Runtime, topology: Topology, config: &WakeupsConfig) -> Self {
        Self {
            arrivals: ArrivalCounter::new(runtime.js.clone(), &topology),
            db,
            runtime,
            topology,
            tick: Duration::from_millis(config.tick_ms.max(50)),
            hold: Duration::from_secs(config.claim_s.max(5)),
            claimer: format!("dispatch:{}:{}", std::process::id(), Uuid::now_v7()),
        }
    }

    /// Fire wake-ups as they come due, for as long as the future runs.
    pub async fn run(&self) {
        loop {
            match wakeups::claim_due(&self.db, &self.claimer, self.hold, BATCH).await {
                Ok(due) => {
                    for wakeup in &due {
                        if let Err(e) = self.fire(wakeup).await {
                            tracing::warn!(wakeup = %wakeup.id, error = %e, "wake-up did not fire");
                            // Tried again soon: its input's number may hold the person's next
                            // message back. (If even this fails, the claim lapses.)
                            let _ = wakeups::retry_soon(&self.db, wakeup.id, &self.claimer, RETRY)
                                .await;
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not look for due wake-ups"),
            }
            tokio::time::sleep(self.tick).await;
        }
    }

    async fn fire(&self, wakeup: &Wakeup) -> Result<(), FireError> {
        let found = last_route_with(&self.db, &wakeup.person_id, &wakeup.agent_identity).await?;
        let Some(found) = found else {
            tracing::warn!(wakeup = %wakeup.id, person = %wakeup.person_id,
                "no channel to reach this person on; the wake-up failed");
            metrics::counter!("sb_wakeups_failed_total").increment(1);
            wakeups::mark_failed(
                &self.db,
                wakeup,
                "the person has no channel to reach them on",
            )
            .await?;
            return Ok(());
        };
        let now = InputRoute {
            channel: found.channel,
            provider: found.provider,
            sender: found.sender,
            recipient: found.recipient.unwrap_or_default(),
            person_type: found.person_type,
        };
        // The first firing's id and route, whatever the person did since.
        let Some((id, route)) = wakeups::fix_input(&self.db, wakeup.id, &now).await? else {
            return Ok(());
        };
        let key = wakeups::input_key(wakeup.id);
        // After whatever the person sent before now; a re-fire gets the same number.
        let arrival = self
            .arrivals
            .number_input(&route.channel, &route.sender, &key)
            .await?;
        let message = InboundMessage {
            id: id.to_string(),
            channel: route.channel.clone(),
            provider: route.provider,
            sender: route.sender,
            recipient: route.recipient,
            text: wakeup.note.clone(),
            provider_message_id: key.clone(),
            arrival_seq: arrival.seq,
            arrival_epoch: arrival.epoch,
            received_at_ms: switchboard_kit::now_ms(),
            correlation_id: id.to_string(),
            agent: wakeup.agent_name.clone(),
            scheduled: WAKEUP_INPUT.to_string(),
            asserted: Some(Person {
                person_id: wakeup.person_id.clone(),
                person_type: route.person_type,
                ..Default::default()
            }),
            wakeup: Some(switchboard_kit::proto::Wakeup {
                id: wakeup.id.to_string(),
                due_at_ms: wakeup.due_at.timestamp_millis(),
                scheduled_at_ms: wakeup.created_at.timestamp_millis(),
            }),
            ..Default::default()
        };
        // The number is part of the dedupe id, as the gateway's: a re-fire that got another
        // one (the person wrote many times since) reaches the session stage, which maps it to
        // the first firing's turn and moves the person's cursor past it.
        let output = Output::new(
            self.topology
                .inbound_from(&message.channel, &message.sender),
            format!("{key}:{}.{}", arrival.epoch, arrival.seq),
            &message,
        )
        .correlated(message.correlation_id.clone());
        // A publish that fails after the input was numbered (a test's failpoint stands in for
        // NATS going away here).
        if switchboard_kit::failpoint::lose_once_at("dispatch.wakeup_publish") {
            return Err(FireError::Publish(anyhow::anyhow!(
                "failpoint: publish lost"
            )));
        }
        self.runtime
            .publish("wakeup", &output)
            .await
            .map_err(FireError::Publish)?;
        // Published and not yet marked: a crash here leaves the claim to lapse.
        switchboard_kit::failpoint::crash_at("dispatch.wakeup_published");
        if wakeups::mark_fired(&self.db, wakeup, id).await? {
            metrics::counter!("sb_wakeups_fired_total").increment(1);
            let late = chrono::Utc::now().signed_duration_since(wakeup.due_at);
            tracing::info!(wakeup = %wakeup.id, session = %wakeup.session_id,
                late_ms = late.num_milliseconds(), "wake-up fired");
        }
        Ok(())
    }
}

/// The answer to a person's `/reminders` message `message`: their pending wake-ups with
/// `identity`, or what it cancelled. Once-only: a turn run again after its cancel committed
/// answers with what that message cancelled, never cancels by the shifted numbers again.
pub(crate) async fn answer_reminders(
    db: &PgPool,
    person: &str,
    identity: &str,
    message: &str,
    command: RemindersCommand,
    zone: chrono_tz::Tz,
) -> Result<String, sqlx::Error> {
    let by = format!("person:{message}");
    let done = wakeups::cancelled_by(db, &by).await?;
    if !done.is_empty() {
        return Ok(wakeups::reminders_cancelled(&done, &[], zone));
    }
    let filter = WakeupFilter {
        person: Some(person.to_string()),
        identity: Some(identity.to_string()),
        status: Some(WakeupStatus::Pending),
        ..Default::default()
    };
    // Every pending one (a person has at most `[wakeups] max_pending_per_person`).
    let pending = wakeups::list(db, &filter, 10_000).await?;
    let chosen: Vec<usize> = match command {
        RemindersCommand::List => return Ok(wakeups::reminders_list(&pending, zone)),
        RemindersCommand::Unclear => return Ok(wakeups::REMINDERS_USAGE.to_string()),
        RemindersCommand::CancelAll => (1..=pending.len()).collect(),
        RemindersCommand::Cancel(numbers) => numbers,
    };
    let mut ids = Vec::new();
    let mut missing = Vec::new();
    for n in chosen {
        match pending.get(n - 1) {
            Some(w) => ids.push(w.id),
            None => missing.push(n),
        }
    }
    // All at once: a rerun of this turn finds every one this message cancelled, or none.
    let cancelled = wakeups::cancel_all(db, &ids, &by).await?;
    // Cancelled and not yet answered: a crash here runs the turn again.
    switchboard_kit::failpoint::crash_at("dispatch.reminders_cancelled");
    // Those already on their way (their input fixed as the person asked) were not cancelled.
    let firing: Vec<usize> = ids
        .iter()
        .filter(|id| !cancelled.iter().any(|c| c.id == **id))
        .filter_map(|id| pending.iter().position(|w| w.id == *id).map(|i| i + 1))
        .collect();
    let mut answer = wakeups::reminders_cancelled(&cancelled, &missing, zone);
    if !firing.is_empty() {
        let list: Vec<String> = firing.iter().map(|n| n.to_string()).collect();
        answer.push_str(&format!(
            "\nReminder {} is already on its way and could not be cancelled.",
            list.join(", ")
        ));
    }
    Ok(answer)
}
