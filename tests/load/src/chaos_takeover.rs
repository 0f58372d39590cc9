//! A takeover in the chaos run: an operator steps into one person's conversation while workers
//! are killed, NATS and Postgres crash and the runner is down, answers what the agent was paused
//! for, and hands it back.
//!
//! One Twilio person whose messages were all sent by then (neither returning, collecting nor given
//! a wake-up) is
//! taken over at `takeover_at` through the gateway with an `ops:write` key (retried through
//! gateway kills: a second take by the same operator is 200, unchanged). Then they send
//! [`EXTRA`] more messages, so that some are certainly held. Once every turn of theirs is done,
//! the operator answers each held message in the session's order, as the agent would
//! (`echo: s<sender>#<index>`, one reply each, under an Idempotency-Key of its own, retried), and
//! hands the conversation back. The verdict judges those replies like any: each message answered
//! once, in order, one outbound log row; and its takeover check adds what is the takeover's own: a message
//! held for the operator never reaches the agent, every message sent after the takeover is held,
//! and the hand-back leaves the agent nothing to answer.
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use switchboard_channels::api::{ApiKeys, Scope};

use super::channels::{AgentKind, Channel, Mix};
use super::chaos_check::TakeoverRecord;
use super::loadgen::LoadGen;
use super::returning;

/// Messages the person sends after the takeover.
pub const EXTRA: u32 = 3;

/// The person taken over: the first Twilio person among the first `among` senders (those whose
/// messages were all sent) who neither returns, collects nor gets a wake-up.
pub fn chosen(mix: &Mix, senders: usize, among: usize, wakeups: &[usize]) -> Option<usize> {
    let returners = returning::returners(mix, senders);
    (0..senders.min(among)).find(|&s| {
        mix.channel_of(s) == Channel::Twilio
            && mix.kind_of(s) == AgentKind::Own
            && !returners.contains(&s)
            && !wakeups.contains(&s)
    })
}

/// Answers of the gateway, retried until a status in `ok` or `deadline`.
async fn until_ok(
    http: &reqwest::Client,
    request: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ok: &[u16],
    what: &str,
    deadline: Instant,
) -> anyhow::Result<serde_json::Value> {
    loop {
        if let Ok(r) = request(http).send().await {
            let status = r.status().as_u16();
            if ok.contains(&status) {
                return r
                    .json()
                    .await
                    .with_context(|| format!("{what}: the answer"));
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: not done in time");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Take `sender`'s session with `agent` over, have them send [`EXTRA`] more messages (from
/// index `first_extra`), answer every held message once their turns are done, hand back.
pub async fn run(
    db: &sqlx::PgPool,
    gateway: &str,
    load: &LoadGen,
    agent: &str,
    sender: usize,
    first_extra: u32,
    deadline: Instant,
) -> anyhow::Result<TakeoverRecord> {
    let (key, _) = ApiKeys::new(db.clone())
        .create("chaos-takeover", &[Scope::OpsRead, Scope::OpsWrite])
        .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let person = Channel::Twilio.person(sender);
    let session: uuid::Uuid = loop {
        let found = sqlx::query_scalar(
            "SELECT id FROM switchboard.sessions WHERE person_id = $1 AND agent_name = $2",
        )
        .bind(&person)
        .bind(agent)
        .fetch_optional(db)
        .await;
        if let Ok(Some(id)) = found {
            break id;
        }
        anyhow::ensure!(Instant::now() < deadline, "{person} has no session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let auth = format!("Bearer {key}");
    let url = |path: &str| format!("{gateway}/api/v1/sessions/{session}/{path}");
    until_ok(
        &http,
        |h| h.post(url("takeover")).header("Authorization", &auth),
        &[200, 201],
        "the takeover",
        deadline,
    )
    .await?;
    let mut sent_after = Vec::new();
    for index in first_extra..first_extra + EXTRA {
        load.send(sender, index)
            .await
            .with_context(|| format!("{person}'s message {index} after the takeover"))?;
        sent_after.push(crate::message_text(sender, index));
    }
    // Every turn of theirs done (the held ones with no reply), and each held message logged.
    let expected = first_extra as i64 - 1 + EXTRA as i64;
    let held: Vec<String> = loop {
        let turns: Result<(i64, i64, i64), _> = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status <> 'done'),
                    count(*) FILTER (WHERE held_by IS NOT NULL)
               FROM switchboard.turns WHERE session_id = $1 AND provider_message_id LIKE 'SM%'",
        )
        .bind(session)
        .fetch_one(db)
        .await;
        if let Ok((opened, open, held)) = turns
            && opened >= expected
            && open == 0
        {
            let texts: Result<Vec<String>, _> = sqlx::query_scalar(
                "SELECT m.message FROM switchboard.turns t
                   JOIN switchboard.messages m
                     ON m.session_id = t.session_id AND m.direction = 'inbound'
                    AND m.external_id = t.provider_message_id
                  WHERE t.session_id = $1 AND t.held_by IS NOT NULL
                  ORDER BY t.seq",
            )
            .bind(session)
            .fetch_all(db)
            .await;
            if let Ok(texts) = texts
                && texts.len() as i64 == held
            {
                // The text less the person's canary.
                break texts
                    .iter()
                    .map(|t| t.split_whitespace().next().unwrap_or_default().to_string())
                    .collect();
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{person}'s turns were not all done in time"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for text in &held {
        let idempotency = format!("chaos-op-{}", text.replace('#', "-"));
        until_ok(
            &http,
            |h| {
                h.post(url("replies"))
                    .header("Authorization", &auth)
                    .header("Idempotency-Key", &idempotency)
                    .json(&json!({ "text": format!("echo: {text}") }))
            },
            &[202],
            "an operator's reply",
            deadline,
        )
        .await?;
    }
    let back = until_ok(
        &http,
        |h| h.post(url("handback")).header("Authorization", &auth),
        &[200],
        "the hand-back",
        deadline,
    )
    .await?;
    Ok(TakeoverRecord {
        sender,
        sent_after,
        held,
        agent_answers: back["agent_answers"] == true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::ChaosOptions;
    use crate::chaos_wakeups;

    #[test]
    fn the_small_and_the_full_run_each_take_someone_over_who_sent_everything_before() {
        for o in [
            ChaosOptions::small("/tmp".into()),
            ChaosOptions::full("/tmp".into()),
        ] {
            let wakeups =
                chaos_wakeups::chosen(&o.mix, o.sessions, o.wakeups_among, o.wakeups_due.len());
            let at = o.takeover_at.expect("a takeover in the run");
            let among = o.sent_by(at);
            let s = chosen(&o.mix, o.sessions, among, &wakeups).expect("someone to take over");
            assert!(s < among && !wakeups.contains(&s));
            assert_eq!(o.mix.channel_of(s), Channel::Twilio);
            assert!(!o.mix.collects(s));
        }
    }
}
