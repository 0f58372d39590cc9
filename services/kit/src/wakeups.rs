//! Agent wake-ups (seed 002): an agent asks, with its turn's token, to come back to its session
//! at a time, with a note. The note is the input of that later turn; the reply goes to the
//! person on the channel they last wrote on.
//!
//! One store for the gateway (schedule, list, cancel), dispatch (fire what is due) and the
//! person's `/reminders` command. Every change is journalled in the session's events, in the
//! change's own transaction. A wake-up is durable: a row, not a timer in a process. Dispatchers
//! claim what is due with `FOR UPDATE SKIP LOCKED` for `claim_s`; a claim that lapsed (its
//! dispatcher died) is taken again, and the input is keyed `wakeup:<id>` so a second firing is
//! the same message, dropped by JetStream and by the session stage.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::status::SessionEventKind;

/// Where a wake-up is (`switchboard.wakeups.status`): `pending → fired | cancelled | failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, Serialize)]
#[sqlx(type_name = "text", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum WakeupStatus {
    Pending,
    Fired,
    Cancelled,
    /// It could not fire: the person has no channel to reach them on.
    Failed,
}

impl WakeupStatus {
    pub const ALL: [WakeupStatus; 4] = [
        WakeupStatus::Pending,
        WakeupStatus::Fired,
        WakeupStatus::Cancelled,
        WakeupStatus::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WakeupStatus::Pending => "pending",
            WakeupStatus::Fired => "fired",
            WakeupStatus::Cancelled => "cancelled",
            WakeupStatus::Failed => "failed",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// A wake-up as stored.
#[derive(Debug, Clone, Serialize)]
pub struct Wakeup {
    pub id: Uuid,
    pub session_id: Uuid,
    pub person_id: String,
    pub agent_name: String,
    pub agent_identity: String,
    pub due_at: DateTime<Utc>,
    pub note: String,
    pub status: WakeupStatus,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub fired_at: Option<DateTime<Utc>>,
    /// The inbound message (and correlation id) its firing published.
    pub message_id: Option<Uuid>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub cancelled_by: Option<String>,
    pub failure: Option<String>,
}

/// A wake-up to schedule.
#[derive(Debug, Clone)]
pub struct NewWakeup {
    pub session_id: Uuid,
    pub person_id: String,
    pub agent_name: String,
    pub agent_identity: String,
    pub due_at: DateTime<Utc>,
    pub note: String,
    /// `agent:<name>` or `key:<owner>`.
    pub created_by: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WakeupError {
    #[error("wake-up store: {0}")]
    Database(#[from] sqlx::Error),
    /// The person already has `cap` pending with this agent identity.
    #[error("this person already has {cap} pending wake-ups with this agent")]
    TooMany { cap: u32 },
    #[error("no session {0}")]
    NoSession(Uuid),
}

/// Which wake-ups a list shows (each filter, when given, must hold).
#[derive(Debug, Default, Clone)]
pub struct WakeupFilter {
    pub person: Option<String>,
    pub identity: Option<String>,
    pub session: Option<Uuid>,
    pub status: Option<WakeupStatus>,
}

/// Journal `kind` about `wakeup` in `tx`: its id and due time, and `more` (an object). Once
/// per (kind, wake-up): the key is the kind as stored and the id.
async fn journal(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    wakeup: &Wakeup,
    kind: SessionEventKind,
    more: serde_json::Value,
) -> Result<(), sqlx::Error> {
    let mut detail = serde_json::json!({"wakeup_id": wakeup.id, "due_at": wakeup.due_at});
    if let (Some(d), serde_json::Value::Object(more)) = (detail.as_object_mut(), more) {
        d.extend(more);
    }
    let kind_name = serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let key = format!("{kind_name}:{}", wakeup.id);
    sqlx::query!(
        "INSERT INTO switchboard.session_events (id, session_id, key, kind, seq, detail)
         SELECT $1, $2, $3, $4,
                (SELECT last_seq FROM switchboard.sessions WHERE id = $2), $5
         ON CONFLICT (key) DO NOTHING",
        Uuid::now_v7(),
        wakeup.session_id,
        key,
        kind as SessionEventKind,
        detail,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Schedule `new`, unless its person already has `cap` pending with its agent identity. The
/// count and the insert hold the person's lock, so replicas racing cannot pass the cap.
pub async fn schedule(db: &PgPool, new: NewWakeup, cap: u32) -> Result<Wakeup, WakeupError> {
    let mut tx = db.begin().await?;
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('wakeups:' || $1, 0))",
        new.person_id,
    )
    .execute(&mut *tx)
    .await?;
    let pending = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM switchboard.wakeups
            WHERE person_id = $1 AND agent_identity = $2 AND status = 'pending'"#,
        new.person_id,
        new.agent_identity,
    )
    .fetch_one(&mut *tx)
    .await?;
    if pending >= i64::from(cap) {
        return Err(WakeupError::TooMany { cap });
    }
    let wakeup = sqlx::query_as!(
        Wakeup,
        r#"INSERT INTO switchboard.wakeups
               (id, session_id, person_id, agent_name, agent_identity, due_at, note, created_by)
           SELECT $1, s.id, $3, $4, $5, $6, $7, $8 FROM switchboard.sessions s WHERE s.id = $2
           RETURNING id, session_id, person_id, agent_name, agent_identity, due_at, note,
                     status AS "status: WakeupStatus", created_by, created_at, fired_at,
                     message_id, cancelled_at, cancelled_by, failure"#,
        Uuid::now_v7(),
        new.session_id,
        new.person_id,
        new.agent_name,
        new.agent_identity,
        new.due_at,
        new.note,
        new.created_by,
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(WakeupError::NoSession(new.session_id))?;
    journal(
        &mut tx,
        &wakeup,
        SessionEventKind::WakeupScheduled,
        serde_json::json!({
            "by": wakeup.created_by,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(wakeup)
}

/// Wake-up `id`, if there is one.
pub async fn find(db: &PgPool, id: Uuid) -> Result<Option<Wakeup>, sqlx::Error> {
    sqlx::query_as!(
        Wakeup,
        r#"SELECT id, session_id, person_id, agent_name, agent_identity, due_at, note,
                  status AS "status: WakeupStatus", created_by, created_at, fired_at,
                  message_id, cancelled_at, cancelled_by, failure
             FROM switchboard.wakeups WHERE id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await
}

/// Up to `limit` wake-ups, by due time (the soonest first), then id.
pub async fn list(
    db: &PgPool,
    filter: &WakeupFilter,
    limit: i64,
) -> Result<Vec<Wakeup>, sqlx::Error> {
    sqlx::query_as!(
        Wakeup,
        r#"SELECT id, session_id, person_id, agent_name, agent_identity, due_at, note,
                  status AS "status: WakeupStatus", created_by, created_at, fired_at,
                  message_id, cancelled_at, cancelled_by, failure
             FROM switchboard.wakeups
            WHERE ($1::text IS NULL OR person_id = $1)
              AND ($2::text IS NULL OR agent_identity = $2)
              AND ($3::uuid IS NULL OR session_id = $3)
              AND ($4::text IS NULL OR status = $4)
            ORDER BY due_at, id
            LIMIT $5"#,
        filter.person,
        filter.identity,
        filter.session,
        filter.status.map(WakeupStatus::as_str),
        limit,
    )
    .fetch_all(db)
    .await
}

/// Cancel wake-up `id` if it is still pending and not firing yet: the cancelled wake-up, or
/// `None` when it fired, failed, was cancelled already, is firing (its input is fixed: it is
/// on its way) or never was.
pub async fn cancel(db: &PgPool, id: Uuid, by: &str) -> Result<Option<Wakeup>, sqlx::Error> {
    Ok(cancel_all(db, &[id], by).await?.pop())
}

/// Cancel, in one transaction, those of `ids` still pending and not firing yet (see
/// [`cancel`]): the ones cancelled, soonest first.
pub async fn cancel_all(db: &PgPool, ids: &[Uuid], by: &str) -> Result<Vec<Wakeup>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let cancelled = sqlx::query_as!(
        Wakeup,
        r#"UPDATE switchboard.wakeups
              SET status = 'cancelled', cancelled_at = now(), cancelled_by = $2
            WHERE id = ANY($1) AND status = 'pending' AND message_id IS NULL
           RETURNING id, session_id, person_id, agent_name, agent_identity, due_at, note,
                     status AS "status: WakeupStatus", created_by, created_at, fired_at,
                     message_id, cancelled_at, cancelled_by, failure"#,
        ids,
        by,
    )
    .fetch_all(&mut *tx)
    .await?;
    for w in &cancelled {
        journal(
            &mut tx,
            w,
            SessionEventKind::WakeupCancelled,
            serde_json::json!({"by": by}),
        )
        .await?;
    }
    tx.commit().await?;
    let mut cancelled = cancelled;
    cancelled.sort_by_key(|w| (w.due_at, w.id));
    Ok(cancelled)
}

/// The wake-ups cancelled by `by` (a person's `/reminders cancel` message), soonest first.
pub async fn cancelled_by(db: &PgPool, by: &str) -> Result<Vec<Wakeup>, sqlx::Error> {
    sqlx::query_as!(
        Wakeup,
        r#"SELECT id, session_id, person_id, agent_name, agent_identity, due_at, note,
                  status AS "status: WakeupStatus", created_by, created_at, fired_at,
                  message_id, cancelled_at, cancelled_by, failure
             FROM switchboard.wakeups WHERE cancelled_by = $1 ORDER BY due_at, id"#,
        by,
    )
    .fetch_all(db)
    .await
}

/// Claim up to `limit` wake-ups due by `now` for `claimer`, for `hold`: pending ones nobody
/// holds, or whose holder's claim lapsed.
pub async fn claim_due(
    db: &PgPool,
    claimer: &str,
    hold: std::time::Duration,
    limit: i64,
) -> Result<Vec<Wakeup>, sqlx::Error> {
    let hold_ms = i64::try_from(hold.as_millis()).unwrap_or(i64::MAX);
    sqlx::query_as!(
        Wakeup,
        r#"UPDATE switchboard.wakeups w
              SET claimed_by = $1, claimed_until = now() + make_interval(secs => $2::float8 / 1000)
            WHERE w.id IN (SELECT id FROM switchboard.wakeups
                            WHERE status = 'pending' AND due_at <= now()
                              AND (claimed_until IS NULL OR claimed_until < now())
                            ORDER BY due_at
                            LIMIT $3
                            FOR UPDATE SKIP LOCKED)
           RETURNING w.id, w.session_id, w.person_id, w.agent_name, w.agent_identity, w.due_at,
                     w.note, w.status AS "status: WakeupStatus", w.created_by, w.created_at,
                     w.fired_at, w.message_id, w.cancelled_at, w.cancelled_by, w.failure"#,
        claimer,
        hold_ms as f64,
        limit,
    )
    .fetch_all(db)
    .await
}

/// Shorten `claimer`'s claim on `wakeup` to `after` from now: its firing failed (the input
/// could not be numbered or published) and is tried again soon, not once the whole claim
/// lapses, because the input's number may already hold the person's next message back.
pub async fn retry_soon(
    db: &PgPool,
    wakeup: Uuid,
    claimer: &str,
    after: std::time::Duration,
) -> Result<(), sqlx::Error> {
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    sqlx::query!(
        "UPDATE switchboard.wakeups
            SET claimed_until = LEAST(claimed_until,
                                      now() + make_interval(secs => $3::float8 / 1000))
          WHERE id = $1 AND claimed_by = $2 AND status = 'pending'",
        wakeup,
        claimer,
        after_ms as f64,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Record that `wakeup`'s input, message `message`, was published (the claim is let go).
/// `false` when it was no longer pending (cancelled while it fired: the input is out all the
/// same, and the journal says what happened first).
pub async fn mark_fired(db: &PgPool, wakeup: &Wakeup, message: Uuid) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    let done = sqlx::query!(
        "UPDATE switchboard.wakeups
            SET status = 'fired', fired_at = now(), claimed_by = NULL, claimed_until = NULL
          WHERE id = $1 AND status = 'pending' AND message_id = $2",
        wakeup.id,
        message,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if done {
        journal(
            &mut tx,
            wakeup,
            SessionEventKind::WakeupFired,
            serde_json::json!({
                "message_id": message,
            }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(done)
}

/// Record that `wakeup` cannot fire, and why.
pub async fn mark_failed(db: &PgPool, wakeup: &Wakeup, why: &str) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    let done = sqlx::query!(
        "UPDATE switchboard.wakeups
            SET status = 'failed', failure = $2, claimed_by = NULL, claimed_until = NULL
          WHERE id = $1 AND status = 'pending' AND message_id IS NULL",
        wakeup.id,
        why,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if done {
        journal(
            &mut tx,
            wakeup,
            SessionEventKind::WakeupFailed,
            serde_json::json!({"why": why}),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The way to the person a wake-up's input goes by: their last message's channel, provider
/// and addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct InputRoute {
    pub channel: String,
    pub provider: String,
    pub sender: String,
    pub recipient: String,
    pub person_type: String,
}

/// The id of the inbound message `wakeup`'s firing publishes, and the route it goes by: drawn
/// (a UUIDv7, so it sorts with the session's other messages by when it came in; `route`, the
/// person's way as it is now) the first time it fires and kept, so a firing repeated after a
/// crash publishes the same message on the same channel, whatever the person did since.
/// `None` once it is no longer pending (cancelled since it was claimed: it does not fire).
pub async fn fix_input(
    db: &PgPool,
    wakeup: Uuid,
    route: &InputRoute,
) -> Result<Option<(Uuid, InputRoute)>, WakeupError> {
    let fixed = sqlx::query!(
        r#"UPDATE switchboard.wakeups
              SET message_id = COALESCE(message_id, $2), input_route = COALESCE(input_route, $3)
            WHERE id = $1 AND status = 'pending'
           RETURNING message_id AS "message_id!", input_route AS "input_route!""#,
        wakeup,
        Uuid::now_v7(),
        serde_json::to_value(route).expect("a route serialises"),
    )
    .fetch_optional(db)
    .await?;
    let Some(row) = fixed else {
        return Ok(None);
    };
    let route = serde_json::from_value(row.input_route)
        .map_err(|e| WakeupError::Database(sqlx::Error::Decode(Box::new(e))))?;
    Ok(Some((row.message_id, route)))
}

/// The provider message id (and Nats-Msg-Id) of a wake-up's input.
pub fn input_key(wakeup: Uuid) -> String {
    format!("wakeup:{wakeup}")
}

/// What a person asks with `/reminders` (any case): to see their pending wake-ups with the
/// agent, or to cancel some (`/reminders cancel 2`, `/reminders cancel 1 3`, `/reminders
/// cancel all`), numbered as the list shows them (soonest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemindersCommand {
    List,
    Cancel(Vec<usize>),
    CancelAll,
    /// `/reminders` followed by something it does not understand: answered with its use.
    Unclear,
}

/// The command a message is, if it is `/reminders …`. `None` for any other message
/// (`/remindersplease` included).
pub fn reminders_command(text: &str) -> Option<RemindersCommand> {
    let t = text.trim();
    let command = "/reminders";
    if t.len() < command.len()
        || !t.is_char_boundary(command.len())
        || !t[..command.len()].eq_ignore_ascii_case(command)
    {
        return None;
    }
    let rest = &t[command.len()..];
    if rest.is_empty() {
        return Some(RemindersCommand::List);
    }
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let mut words = rest.split_whitespace();
    let Some(verb) = words.next() else {
        return Some(RemindersCommand::List);
    };
    if !verb.eq_ignore_ascii_case("cancel") {
        return Some(RemindersCommand::Unclear);
    }
    let words: Vec<&str> = words
        .flat_map(|w| w.split(','))
        .filter(|w| !w.is_empty())
        .collect();
    if words.len() == 1 && words[0].eq_ignore_ascii_case("all") {
        return Some(RemindersCommand::CancelAll);
    }
    let numbers: Option<Vec<usize>> = words
        .iter()
        .map(|w| {
            w.trim_start_matches('#')
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
        })
        .collect();
    match numbers {
        Some(n) if !n.is_empty() => Some(RemindersCommand::Cancel(n)),
        _ => Some(RemindersCommand::Unclear),
    }
}

/// How `/reminders` is used (the answer to one it did not understand).
pub const REMINDERS_USAGE: &str = "Send /reminders to see what I will come back to you about, \
     /reminders cancel 2 to cancel the second, or /reminders cancel all.";

/// The answer to `/reminders`: `pending` (soonest first), numbered, with when each is due
/// (in `zone`) and its note's start.
pub fn reminders_list(pending: &[Wakeup], zone: chrono_tz::Tz) -> String {
    if pending.is_empty() {
        return "You have no reminders with me.".to_string();
    }
    let mut out = format!("Your reminders ({}):\n", pending.len());
    for (n, w) in pending.iter().enumerate() {
        out.push_str(&format!(
            "{}. {}: {}\n",
            n + 1,
            when(w.due_at, zone),
            gist(&w.note)
        ));
    }
    out.push_str("To cancel one: /reminders cancel <number>");
    out
}

/// The answer once `cancelled` were cancelled (`missing`: numbers that named none).
pub fn reminders_cancelled(cancelled: &[Wakeup], missing: &[usize], zone: chrono_tz::Tz) -> String {
    let mut out = String::new();
    if cancelled.is_empty() {
        out.push_str("Nothing was cancelled.");
    } else {
        out.push_str("Cancelled:");
        for w in cancelled {
            out.push_str(&format!("\n- {}: {}", when(w.due_at, zone), gist(&w.note)));
        }
    }
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|n| n.to_string()).collect();
        out.push_str(&format!(
            "\nNo reminder {} (send /reminders to see the list).",
            list.join(", ")
        ));
    }
    out
}

fn when(at: DateTime<Utc>, zone: chrono_tz::Tz) -> String {
    at.with_timezone(&zone)
        .format("%a %-d %b %H:%M %Z")
        .to_string()
}

/// A note's first line, at most 80 characters.
fn gist(note: &str) -> String {
    let line = note
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut out: String = line.chars().take(80).collect();
    if line.chars().count() > 80 || note.trim().lines().count() > 1 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_back_by_their_names() {
        for s in WakeupStatus::ALL {
            assert_eq!(WakeupStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(WakeupStatus::parse("asleep"), None);
    }

    #[test]
    fn reminders_are_listed_and_cancelled_by_number() {
        use RemindersCommand::*;
        assert_eq!(reminders_command("/reminders"), Some(List));
        assert_eq!(reminders_command("  /Reminders \n"), Some(List));
        assert_eq!(
            reminders_command("/reminders cancel 2"),
            Some(Cancel(vec![2]))
        );
        assert_eq!(
            reminders_command("/reminders CANCEL 1, 3"),
            Some(Cancel(vec![1, 3]))
        );
        assert_eq!(
            reminders_command("/reminders cancel #4"),
            Some(Cancel(vec![4]))
        );
        assert_eq!(reminders_command("/reminders cancel all"), Some(CancelAll));
        assert_eq!(reminders_command("/reminders cancel"), Some(Unclear));
        assert_eq!(reminders_command("/reminders cancel 0"), Some(Unclear));
        assert_eq!(reminders_command("/reminders please"), Some(Unclear));
        assert_eq!(reminders_command("/remindersplease"), None);
        assert_eq!(reminders_command("remind me at 6"), None);
    }

    #[test]
    fn a_list_numbers_each_reminder_with_its_time_and_note() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let w = |due: &str, note: &str| Wakeup {
            id: Uuid::now_v7(),
            session_id: Uuid::now_v7(),
            person_id: "p".into(),
            agent_name: "reggie_oc".into(),
            agent_identity: "reggie".into(),
            due_at: at(due),
            note: note.into(),
            status: WakeupStatus::Pending,
            created_by: "agent:reggie_oc".into(),
            created_at: at(due),
            fired_at: None,
            message_id: None,
            cancelled_at: None,
            cancelled_by: None,
            failure: None,
        };
        let list = [
            w(
                "2026-12-08T05:30:00Z",
                "Remind Dana her shift starts at 7\nbring the badge",
            ),
            w("2026-12-09T12:00:00Z", "Ask how the interview went"),
        ];
        assert_eq!(
            reminders_list(&list, chrono_tz::Australia::Sydney),
            "Your reminders (2):\n\
             1. Tue 8 Dec 16:30 AEDT: Remind Dana her shift starts at 7…\n\
             2. Wed 9 Dec 23:00 AEDT: Ask how the interview went\n\
             To cancel one: /reminders cancel <number>"
        );
        assert_eq!(
            reminders_list(&[], chrono_tz::UTC),
            "You have no reminders with me."
        );
        assert_eq!(
            reminders_cancelled(&list[1..], &[5], chrono_tz::UTC),
            "Cancelled:\n- Wed 9 Dec 12:00 UTC: Ask how the interview went\n\
             No reminder 5 (send /reminders to see the list)."
        );
    }

    #[test]
    fn a_wakeups_input_is_keyed_by_the_wakeup() {
        let id = Uuid::now_v7();
        assert_eq!(input_key(id), format!("wakeup:{id}"));
    }
}
