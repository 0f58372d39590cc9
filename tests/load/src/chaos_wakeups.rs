//! Wake-ups in the chaos run: agents' returns to their sessions (`POST /api/v1/wakeups`), due
//! while workers are killed, the runner is down and Postgres is crashed, must each come back
//! exactly once when the product is back.
//!
//! Early in the run, once they sent their last message (which may still be on its way when
//! the wake-up fires: the wake-up must come after it), a few Twilio people (none the
//! [`returning`](super::returning) ones, none talking to the `collect` agent) each get a
//! wake-up scheduled through the gateway, as an operator's API key schedules one, whose note
//! is the message text `s<sender>#<index>` with an index past their last message. The fake
//! runner answers it like any message (`echo: s<sender>#<index>`), so the verdict judges each
//! wake-up's input as one more message of that person ([`as_accepted`]): exactly one turn, one
//! inbound and one outbound log row, one SMS, in the person's order, told of the runner's outage
//! if it waited on it. One that never fired has no turn, and fails the run.
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use switchboard_channels::api::{ApiKeys, Scope};

use super::channels::{AgentKind, Channel, Mix};
use super::chaos_check::AcceptedMessage;
use super::message_text;
use super::now_us;
use super::returning;

/// A wake-up the run scheduled.
#[derive(Debug, Clone)]
pub struct Planned {
    pub sender: usize,
    pub index: u32,
    pub id: uuid::Uuid,
}

/// The senders who get a wake-up: up to `n` Twilio people among the first `among` senders (the
/// first groups, whose messages are all sent early), neither returning nor collecting.
pub fn chosen(mix: &Mix, senders: usize, among: usize, n: usize) -> Vec<usize> {
    let returners = returning::returners(mix, senders);
    (0..senders.min(among))
        .filter(|&s| mix.channel_of(s) == Channel::Twilio)
        .filter(|&s| mix.kind_of(s) == AgentKind::Own && !returners.contains(&s))
        .take(n)
        .collect()
}

/// Schedule a wake-up for each of `senders`, the k-th due `due[k]` from now, with the note
/// `s<sender>#<index>`. Retried through gateway kills until `deadline`; a request whose answer
/// was lost is not made twice (the note is looked for first).
pub async fn schedule(
    db: &sqlx::PgPool,
    gateway: &str,
    agent: &str,
    senders: &[usize],
    index: u32,
    due: &[Duration],
    deadline: Instant,
) -> anyhow::Result<Vec<Planned>> {
    let (key, _) = ApiKeys::new(db.clone())
        .create(
            "chaos-operator",
            &[Scope::OutboundWrite, Scope::SessionsRead],
        )
        .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut planned = Vec::new();
    for (k, &sender) in senders.iter().enumerate() {
        let note = message_text(sender, index);
        let due_at = chrono::Utc::now()
            + chrono::Duration::from_std(due.get(k).copied().unwrap_or_default())?;
        let person = Channel::Twilio.person(sender);
        let id = loop {
            anyhow::ensure!(
                Instant::now() < deadline,
                "could not schedule {note}'s wake-up in time"
            );
            if let Ok(Some(id)) = sqlx::query_scalar::<_, uuid::Uuid>(
                "SELECT id FROM switchboard.wakeups WHERE note = $1",
            )
            .bind(&note)
            .fetch_optional(db)
            .await
            {
                break id;
            }
            let session = sqlx::query_scalar::<_, uuid::Uuid>(
                "SELECT id FROM switchboard.sessions WHERE person_id = $1 AND agent_name = $2",
            )
            .bind(&person)
            .bind(agent)
            .fetch_optional(db)
            .await;
            if let Ok(Some(session)) = session {
                let sent = http
                    .post(format!("{gateway}/api/v1/wakeups"))
                    .bearer_auth(&key)
                    .json(&json!({
                        "session_id": session, "due_at": due_at.to_rfc3339(), "note": note,
                    }))
                    .send()
                    .await;
                if let Ok(r) = sent
                    && r.status().as_u16() == 201
                {
                    let body: serde_json::Value = r.json().await.context("the wake-up")?;
                    break body["id"].as_str().context("its id")?.parse()?;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        planned.push(Planned { sender, index, id });
    }
    Ok(planned)
}

/// Each planned wake-up as the message it became: accepted when it fired (on the harness's
/// clock), keyed by its input's provider id. One that never fired is "accepted" when it was
/// due, so the verdict finds it without a turn.
pub async fn as_accepted(
    db: &sqlx::PgPool,
    planned: &[Planned],
) -> anyhow::Result<Vec<AcceptedMessage>> {
    let offset_us = chrono::Utc::now().timestamp_micros() - now_us() as i64;
    let mut out = Vec::new();
    for p in planned {
        let (due, fired, message) = sqlx::query_as::<_, (i64, Option<i64>, Option<uuid::Uuid>)>(
            "SELECT (extract(epoch FROM due_at) * 1000000)::bigint,
                    (extract(epoch FROM fired_at) * 1000000)::bigint, message_id
               FROM switchboard.wakeups WHERE id = $1",
        )
        .bind(p.id)
        .fetch_one(db)
        .await?;
        out.push(AcceptedMessage {
            channel: Channel::Twilio,
            sender: p.sender,
            index: p.index,
            sid: switchboard_kit::wakeups::input_key(p.id),
            correlation_id: message.map(|m| m.to_string()).unwrap_or_default(),
            accepted_us: (fired.unwrap_or(due) - offset_us).max(0) as u64,
            collect: false,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ups_go_to_twilio_people_who_neither_return_nor_collect() {
        let mix = Mix::CHAOS;
        let chosen = chosen(&mix, 60, 10, 4);
        assert!(!chosen.is_empty());
        let returners = returning::returners(&mix, 60);
        for s in &chosen {
            assert_eq!(mix.channel_of(*s), Channel::Twilio);
            assert!(!mix.collects(*s));
            assert!(!returners.contains(s));
        }
    }

    #[test]
    fn the_small_and_the_full_run_find_someone_for_every_wake_up_they_plan() {
        for o in [
            crate::chaos::ChaosOptions::small("/tmp".into()),
            crate::chaos::ChaosOptions::full("/tmp".into()),
        ] {
            let n = o.wakeups_due.len();
            assert_eq!(chosen(&o.mix, o.sessions, o.wakeups_among, n).len(), n);
        }
    }
}
