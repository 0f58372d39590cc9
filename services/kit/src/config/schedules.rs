//! `[[schedules]]`: inputs agents get on a timetable (fired by dispatch).
use serde::{Deserialize, Serialize};

/// `[[schedules]]`: an input an agent gets on a timetable, for one person or for everyone a
/// directory query names. At each time the cron pattern gives (in `time_zone`), `text` opens a
/// turn of the person's session with `agent`, once across all dispatch replicas, and the
/// agent's reply goes out on the channel the person last wrote on. A heartbeat
/// (`kind = "heartbeat"`) opens one turn for the whole batch instead, answered to `deliver_to`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ScheduleConfig {
    /// Names the schedule in the log and in its firing record (letters, digits, `-`, `_`).
    pub name: String,
    pub agent: String,
    /// `person` (each person's own turn) or `heartbeat` (one turn for the batch).
    pub kind: ScheduleKind,
    /// A heartbeat's reader: the person (canonical id) its answer is sent to, on the channel
    /// they last wrote on. Only for `kind = "heartbeat"`.
    pub deliver_to: String,
    /// One person, by canonical id (e.g. `staff-7`, `phone:+14155550100`)...
    pub person: String,
    /// ...or a directory query: SQL returning a `person_id` column, e.g.
    /// `SELECT person_id FROM switchboard.people WHERE person_type = 'staff'`. Run read-only.
    pub people: String,
    /// POSIX cron (`minute hour day month weekday`), optionally with seconds first.
    pub cron: String,
    pub time_zone: String,
    /// What the agent is given at that time.
    pub text: String,
}

/// What one firing of a schedule is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Each target person gets the text as a turn of their own session; each is answered.
    #[default]
    Person,
    /// One turn for the whole batch (the targets listed in one prompt), run in a session of
    /// the schedule's own; the answer goes to `deliver_to`, unless it is `HEARTBEAT_OK`
    /// (nothing to report), which is only logged.
    Heartbeat,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            agent: String::new(),
            kind: ScheduleKind::Person,
            deliver_to: String::new(),
            person: String::new(),
            people: String::new(),
            cron: String::new(),
            time_zone: "UTC".into(),
            text: String::new(),
        }
    }
}

impl ScheduleConfig {
    /// The parsed pattern and zone, or why not.
    pub fn timetable(&self) -> Result<(croner::Cron, chrono_tz::Tz), String> {
        let cron = croner::parser::CronParser::new()
            .parse(&self.cron)
            .map_err(|e| format!("cron {:?}: {e}", self.cron))?;
        let zone = self
            .time_zone
            .trim()
            .parse()
            .map_err(|_| format!("time_zone {:?} is not an IANA time zone", self.time_zone))?;
        Ok((cron, zone))
    }
}
