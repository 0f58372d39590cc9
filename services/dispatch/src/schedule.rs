//! Scheduled inputs (`[[schedules]]`): at each time a schedule's cron pattern gives, in its
//! time zone, its text opens a turn of each target person's session with its agent; the reply
//! goes out on the channel the person last wrote on.
//!
//! Every dispatch replica runs the scheduler; a time fires once across them: each message is
//! published with a Nats-Msg-Id and a provider id made of (schedule, time, person), so copies
//! from other replicas are dropped by JetStream and by the session stage, and the firing is
//! recorded (`schedule_fires`) so no replica fires it again later. A time missed by more than
//! `dispatch.schedule_lateness_s` (every replica was down) is skipped rather than fired late.
//!
//! A heartbeat (`kind = "heartbeat"`, OpenClaw's name for a periodic agent turn) fires one
//! turn for the whole batch: the target people are listed in one message, which runs in a
//! session of the schedule's own (person `schedule:<name>`, never any target's), and the
//! answer goes to `deliver_to` on the channel they last wrote on, unless it is
//! [`HEARTBEAT_OK`] (nothing needs attention), which is logged and not sent.
use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use sqlx::PgPool;
use switchboard_kit::config::{ScheduleConfig, ScheduleKind};
use switchboard_kit::proto::{InboundMessage, Person};
use switchboard_kit::runtime::Runtime;
use switchboard_kit::{Output, Topology};
use uuid::Uuid;

/// The answer that says a heartbeat found nothing to report (OpenClaw's token).
pub const HEARTBEAT_OK: &str = "HEARTBEAT_OK";

pub use switchboard_kit::proto::HEARTBEAT_OK_KIND;

/// What of a heartbeat's answer is sent: `None` when it is the no-op token alone; else the
/// answer with the token taken off its start or end (an agent may say "HEARTBEAT_OK" and
/// still report something).
pub fn heartbeat_report(answer: &str) -> Option<&str> {
    let text = answer.trim();
    let joint = |c: char| c.is_whitespace() || matches!(c, '.' | '!' | ',' | ':' | ';' | '-');
    let rest = if let Some(after) = text.strip_prefix(HEARTBEAT_OK) {
        after.trim_start_matches(joint).trim_end()
    } else if let Some(before) = text.strip_suffix(HEARTBEAT_OK) {
        before.trim_end()
    } else {
        text
    };
    (!rest.is_empty()).then_some(rest)
}

/// The time a schedule is due at, if one came within `lateness` before `now` (inclusive).
pub fn due(
    cron: &croner::Cron,
    zone: chrono_tz::Tz,
    now: DateTime<Utc>,
    lateness: Duration,
) -> Option<DateTime<Utc>> {
    // Whole seconds: croner keeps the start time's fraction, and a time must be the same at
    // every tick and on every replica.
    let now = now.with_nanosecond(0)?;
    let at = cron
        .find_previous_occurrence(&now.with_timezone(&zone), true)
        .ok()?
        .with_timezone(&Utc)
        .with_nanosecond(0)?;
    let late = now.signed_duration_since(at).to_std().ok()?;
    (late <= lateness).then_some(at)
}

struct Entry {
    config: ScheduleConfig,
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

/// One person of a heartbeat's batch, as the directory knows them.
struct Member {
    person_id: String,
    name: Option<String>,
    person_type: Option<String>,
    role: Option<String>,
}

/// The heartbeat's text and the batch, one person a line.
fn batch_text(text: &str, members: &[Member]) -> String {
    let mut out = format!(
        "{}\n\nPeople in this batch ({}):\n",
        text.trim(),
        members.len()
    );
    if members.is_empty() {
        out.push_str("(none)\n");
    }
    for m in members {
        let mut about: Vec<&str> = Vec::new();
        about.extend(m.person_type.as_deref().filter(|s| !s.is_empty()));
        about.extend(m.role.as_deref().filter(|s| !s.is_empty()));
        let name = m
            .name
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or("(no name)");
        if about.is_empty() {
            out.push_str(&format!("- {}: {name}\n", m.person_id));
        } else {
            out.push_str(&format!(
                "- {}: {name} ({})\n",
                m.person_id,
                about.join(", ")
            ));
        }
    }
    out
}

/// Where a person's replies go: their latest message's channel, provider and addresses.
pub(crate) struct Route {
    pub channel: String,
    pub provider: String,
    pub sender: String,
    pub recipient: Option<String>,
    pub person_type: String,
}

/// The way back to `person` in their conversations with `identity`: the channel, provider and
/// addresses of their latest message to it (under a per-channel session scope, that is the
/// session the agent spoke in), else of their latest message to anyone.
pub(crate) async fn last_route_with(
    db: &PgPool,
    person: &str,
    identity: &str,
) -> Result<Option<Route>, sqlx::Error> {
    let with = sqlx::query_as!(
        Route,
        r#"SELECT m.channel, m.metadata->>'provider' AS "provider!",
                  m.metadata->>'sender' AS "sender!", m.metadata->>'recipient' AS recipient,
                  s.person_type
             FROM switchboard.messages m
             JOIN switchboard.sessions s ON s.id = m.session_id
            WHERE m.person_id = $1 AND m.agent_identity = $2 AND m.direction = 'inbound'
              AND m.metadata ? 'sender' AND m.metadata ? 'provider'
            ORDER BY m.id DESC
            LIMIT 1"#,
        person,
        identity,
    )
    .fetch_optional(db)
    .await?;
    match with {
        Some(route) => Ok(Some(route)),
        None => last_route(db, person).await,
    }
}

/// The way back to `person`: the channel, provider and addresses of their latest message.
/// `None` when they never wrote on any channel.
pub(crate) async fn last_route(db: &PgPool, person: &str) -> Result<Option<Route>, sqlx::Error> {
    sqlx::query_as!(
        Route,
        r#"SELECT m.channel, m.metadata->>'provider' AS "provider!",
                  m.metadata->>'sender' AS "sender!", m.metadata->>'recipient' AS recipient,
                  s.person_type
             FROM switchboard.messages m
             JOIN switchboard.sessions s ON s.id = m.session_id
            WHERE m.person_id = $1 AND m.direction = 'inbound'
              AND m.metadata ? 'sender' AND m.metadata ? 'provider'
            ORDER BY m.id DESC
            LIMIT 1"#,
        person,
    )
    .fetch_optional(db)
    .await
}

impl Route {
    /// A scheduled input of `schedule` arriving on this route under `key` (the same on every
    /// replica: JetStream and the session stage keep one), with its own id.
    fn input(&self, schedule: &ScheduleConfig, key: String, text: String) -> InboundMessage {
        let id = Uuid::now_v7().to_string();
        InboundMessage {
            id: id.clone(),
            channel: self.channel.clone(),
            provider: self.provider.clone(),
            sender: self.sender.clone(),
            recipient: self.recipient.clone().unwrap_or_default(),
            text,
            provider_message_id: key,
            received_at_ms: switchboard_kit::now_ms(),
            correlation_id: id,
            agent: schedule.agent.clone(),
            scheduled: schedule.name.clone(),
            ..Default::default()
        }
    }
}

pub struct Scheduler {
    db: PgPool,
    runtime: Runtime,
    topology: Topology,
    entries: Vec<Entry>,
    tick: Duration,
    lateness: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule store: {0}")]
    Database(#[from] sqlx::Error),
    #[error("publishing a scheduled input: {0}")]
    Publish(#[source] anyhow::Error),
}

impl Scheduler {
    /// The configured schedules (validated with the configuration; one that does not parse
    /// here is left out with a warning).
    pub fn new(
        db: PgPool,
        runtime: Runtime,
        topology: Topology,
        schedules: &[ScheduleConfig],
        tick: Duration,
        lateness: Duration,
    ) -> Self {
        let entries = schedules
            .iter()
            .filter_map(|c| match c.timetable() {
                Ok((cron, zone)) => Some(Entry {
                    config: c.clone(),
                    cron,
                    zone,
                }),
                Err(why) => {
                    tracing::warn!(schedule = %c.name, %why, "schedule left out");
                    None
                }
            })
            .collect();
        Self {
            db,
            runtime,
            topology,
            entries,
            tick: tick.max(Duration::from_millis(50)),
            lateness,
        }
    }

    /// Fire schedules as their times come, for as long as the future runs.
    pub async fn run(&self) {
        if self.entries.is_empty() {
            return std::future::pending().await;
        }
        let mut fired: HashSet<(String, DateTime<Utc>)> = HashSet::new();
        loop {
            let now = Utc::now();
            for entry in &self.entries {
                let Some(at) = due(&entry.cron, entry.zone, now, self.lateness) else {
                    continue;
                };
                let key = (entry.config.name.clone(), at);
                if fired.contains(&key) {
                    continue;
                }
                match self.fire(entry, at).await {
                    Ok(()) => {
                        fired.insert(key);
                    }
                    // Tried again on the next tick.
                    Err(e) => {
                        tracing::warn!(schedule = %entry.config.name, error = %e, "schedule did not fire")
                    }
                }
            }
            // Forget what can no longer be due.
            fired.retain(|(_, at)| {
                now.signed_duration_since(*at)
                    .to_std()
                    .is_ok_and(|d| d <= self.lateness * 2)
            });
            tokio::time::sleep(self.tick).await;
        }
    }

    /// Fire `entry` for `at`, unless a replica already did.
    async fn fire(&self, entry: &Entry, at: DateTime<Utc>) -> Result<(), ScheduleError> {
        let name = &entry.config.name;
        let done = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.schedule_fires
                               WHERE schedule = $1 AND fire_at = $2) AS "done!""#,
            name,
            at,
        )
        .fetch_one(&self.db)
        .await?;
        if done {
            return Ok(());
        }
        let people = self.targets(&entry.config).await?;
        if entry.config.kind == ScheduleKind::Heartbeat {
            return self.fire_heartbeat(entry, at, &people).await;
        }
        let mut sent = 0;
        for person in &people {
            let Some(route) = self.route(person).await? else {
                // Nobody to reach: they never wrote on any channel.
                tracing::warn!(schedule = %name, person, "no channel to reach this person on; skipped");
                metrics::counter!("sb_schedule_unreachable_total").increment(1);
                continue;
            };
            self.publish(entry, at, person, route).await?;
            sent += 1;
        }
        self.record_fire(name, at, sent).await?;
        metrics::counter!("sb_schedule_inputs_total").increment(sent as u64);
        tracing::info!(schedule = %name, at = %at, people = sent, "schedule fired");
        Ok(())
    }

    async fn record_fire(
        &self,
        name: &str,
        at: DateTime<Utc>,
        people: i32,
    ) -> Result<(), ScheduleError> {
        sqlx::query!(
            "INSERT INTO switchboard.schedule_fires (schedule, fire_at, people)
             VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            name,
            at,
            people,
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// One turn for the batch `people`, answered to `deliver_to`.
    async fn fire_heartbeat(
        &self,
        entry: &Entry,
        at: DateTime<Utc>,
        people: &[String],
    ) -> Result<(), ScheduleError> {
        let config = &entry.config;
        let reader = config.deliver_to.trim();
        let Some(route) = self.route(reader).await? else {
            // Recorded all the same: the next replica would find no channel either.
            tracing::warn!(schedule = %config.name, deliver_to = reader,
                "no channel to reach the heartbeat's reader on; not fired");
            metrics::counter!("sb_schedule_unreachable_total").increment(1);
            return self.record_fire(&config.name, at, 0).await;
        };
        let mut members = sqlx::query_as!(
            Member,
            "SELECT person_id, name, person_type, role FROM switchboard.people
              WHERE person_id = ANY($1)",
            people,
        )
        .fetch_all(&self.db)
        .await?;
        // In the order the query gave, and those the directory does not hold by id alone.
        members.sort_by_key(|m| people.iter().position(|p| *p == m.person_id));
        for p in people {
            if !members.iter().any(|m| m.person_id == *p) {
                members.push(Member {
                    person_id: p.clone(),
                    name: None,
                    person_type: None,
                    role: None,
                });
            }
        }
        let key = format!("schedule:{}:{}:heartbeat", config.name, at.timestamp());
        let message = InboundMessage {
            // The session is the schedule's, not the reader's nor any target's.
            asserted: Some(Person {
                person_id: format!("schedule:{}", config.name),
                person_type: "schedule".into(),
                name: format!("{} (heartbeat)", config.name),
                ..Default::default()
            }),
            heartbeat: true,
            ..route.input(config, key.clone(), batch_text(&config.text, &members))
        };
        self.publish_input(&route.channel, key, &message).await?;
        self.record_fire(&config.name, at, members.len() as i32)
            .await?;
        metrics::counter!("sb_schedule_heartbeats_total").increment(1);
        tracing::info!(schedule = %config.name, at = %at, people = members.len(), "heartbeat fired");
        Ok(())
    }

    /// The person, or the people the directory query names (read-only).
    async fn targets(&self, config: &ScheduleConfig) -> Result<Vec<String>, ScheduleError> {
        if !config.person.trim().is_empty() {
            return Ok(vec![config.person.trim().to_string()]);
        }
        let mut tx = self.db.begin().await?;
        sqlx::query!("SET TRANSACTION READ ONLY")
            .execute(&mut *tx)
            .await?;
        // The configured directory query, known only at run time: checked when it runs.
        let people: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT person_id::text FROM ({}) AS targets",
            config.people
        ))
        .fetch_all(&mut *tx)
        .await?;
        tx.rollback().await?;
        Ok(people)
    }

    async fn route(&self, person: &str) -> Result<Option<Route>, ScheduleError> {
        Ok(last_route(&self.db, person).await?)
    }

    async fn publish(
        &self,
        entry: &Entry,
        at: DateTime<Utc>,
        person: &str,
        route: Route,
    ) -> Result<(), ScheduleError> {
        let key = format!("schedule:{}:{}:{person}", entry.config.name, at.timestamp());
        let message = InboundMessage {
            asserted: Some(Person {
                person_id: person.to_string(),
                person_type: route.person_type.clone(),
                ..Default::default()
            }),
            ..route.input(&entry.config, key.clone(), entry.config.text.clone())
        };
        self.publish_input(&route.channel, key, &message).await
    }

    /// Publish a scheduled input where the channel's messages come in, under `key` (the same
    /// on every replica, so JetStream keeps one).
    async fn publish_input(
        &self,
        channel: &str,
        key: String,
        message: &InboundMessage,
    ) -> Result<(), ScheduleError> {
        let output = Output::new(self.topology.inbound(channel), key, message)
            .correlated(message.correlation_id.clone());
        self.runtime
            .publish("schedule", &output)
            .await
            .map_err(ScheduleError::Publish)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_schedule_is_due_from_its_time_until_it_is_too_late() {
        // 09:00 on weekdays in Sydney is 22:00 UTC the day before (UTC+11 in November).
        let cron = croner::Cron::from_str("0 9 * * 1-5").unwrap();
        let zone: chrono_tz::Tz = "Australia/Sydney".parse().unwrap();
        let late = Duration::from_secs(300);
        // Tuesday 24 Nov 2026, 09:00 Sydney.
        assert_eq!(
            due(&cron, zone, utc("2026-11-23T22:00:00Z"), late),
            Some(utc("2026-11-23T22:00:00Z"))
        );
        assert_eq!(
            due(&cron, zone, utc("2026-11-23T22:04:59Z"), late),
            Some(utc("2026-11-23T22:00:00Z"))
        );
        assert_eq!(due(&cron, zone, utc("2026-11-23T22:05:01Z"), late), None);
        assert_eq!(due(&cron, zone, utc("2026-11-23T21:59:59Z"), late), None);
        // Saturday 28 Nov, 09:00 Sydney: not a weekday.
        assert_eq!(due(&cron, zone, utc("2026-11-27T22:01:00Z"), late), None);
    }

    #[test]
    fn a_time_is_the_same_whatever_fraction_of_a_second_it_is_looked_at() {
        let cron = croner::Cron::from_str("5 10 0 * * *").unwrap();
        let at = |s: &str| due(&cron, chrono_tz::UTC, utc(s), Duration::from_secs(300));
        assert_eq!(
            at("2026-11-23T00:10:05.250Z"),
            Some(utc("2026-11-23T00:10:05Z"))
        );
        assert_eq!(
            at("2026-11-23T00:10:09.999Z"),
            Some(utc("2026-11-23T00:10:05Z"))
        );
    }

    #[test]
    fn a_heartbeat_answer_of_the_token_alone_is_not_sent() {
        assert_eq!(heartbeat_report("HEARTBEAT_OK"), None);
        assert_eq!(heartbeat_report("  HEARTBEAT_OK.\n"), None);
        assert_eq!(
            heartbeat_report("HEARTBEAT_OK - Dana has not answered since Monday."),
            Some("Dana has not answered since Monday.")
        );
        assert_eq!(
            heartbeat_report("Two people need a call.\nHEARTBEAT_OK"),
            Some("Two people need a call.")
        );
        assert_eq!(
            heartbeat_report("Everything is fine."),
            Some("Everything is fine.")
        );
    }

    #[test]
    fn a_batch_lists_each_person_once_a_line() {
        let text = batch_text(
            "Check on everyone.",
            &[
                Member {
                    person_id: "staff-7".into(),
                    name: Some("Dana".into()),
                    person_type: Some("staff".into()),
                    role: Some("admin".into()),
                },
                Member {
                    person_id: "phone:+14155550100".into(),
                    name: None,
                    person_type: None,
                    role: None,
                },
            ],
        );
        assert_eq!(
            text,
            "Check on everyone.\n\nPeople in this batch (2):\n- staff-7: Dana (staff, admin)\n\
             - phone:+14155550100: (no name)\n"
        );
    }

    #[test]
    fn seconds_may_be_given_first() {
        let cron = croner::Cron::from_str("30 0 12 * * *").unwrap();
        let at = due(
            &cron,
            chrono_tz::UTC,
            utc("2026-11-23T12:00:31Z"),
            Duration::from_secs(5),
        );
        assert_eq!(at, Some(utc("2026-11-23T12:00:30Z")));
    }
}
