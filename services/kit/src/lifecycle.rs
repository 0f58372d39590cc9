//! When a session starts a fresh engine session: the person asks (`/new`, `/reset`), the session
//! idled past the agent's `idle_reset_s`, or the agent's daily reset time (in its time zone)
//! passed since the person's last message. Pure rules over times, so they are tested with a
//! clock of our choosing; the session stage applies them to each message's received time.
use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::config::AgentConfig;
pub use crate::config::PolicyError;
use crate::status::ResetReason;

/// An agent's reset rules (`[[agents]]` `idle_reset_s`, `daily_reset`, `time_zone`,
/// `reset_commands`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResetPolicy {
    /// Reset when the gap since the person's last message is longer than this.
    pub idle: Option<Duration>,
    /// Reset when this local time passed since the person's last message.
    pub daily: Option<(NaiveTime, Tz)>,
    /// `/new` and `/reset` start a fresh engine session.
    pub commands: bool,
}

impl ResetPolicy {
    pub fn of(agent: &AgentConfig) -> Result<Self, PolicyError> {
        Ok(Self {
            idle: (agent.idle_reset_s > 0).then(|| Duration::from_secs(agent.idle_reset_s)),
            daily: agent.daily_reset_at()?,
            commands: agent.reset_commands,
        })
    }

    /// The reset a message received at `now` starts with, given when the person's previous
    /// message was received (`None`: this is the session's first). The idle rule is checked
    /// first: a session idle for days says so, not "a new day".
    pub fn due(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<ResetReason> {
        let last = last?;
        if let Some(idle) = self.idle
            && now.signed_duration_since(last).to_std().unwrap_or_default() > idle
        {
            return Some(ResetReason::Idle);
        }
        if let Some((at, zone)) = self.daily
            && last < latest_daily(at, zone, now)
        {
            return Some(ResetReason::Daily);
        }
        None
    }
}

/// The latest instant at or before `now` at which the local clock of `zone` showed `at` (or, on
/// a day the clocks skipped that time, the first instant after it).
pub fn latest_daily(at: NaiveTime, zone: Tz, now: DateTime<Utc>) -> DateTime<Utc> {
    let today = now.with_timezone(&zone).date_naive();
    let on = |day: NaiveDate| local_instant(day, at, zone);
    let candidate = on(today);
    if candidate <= now {
        candidate
    } else {
        on(today.checked_sub_days(Days::new(1)).unwrap_or(today))
    }
}

/// `day` at `at` local time in `zone`: the earlier instant when the clocks went back over it,
/// the end of the gap when they jumped over it.
fn local_instant(day: NaiveDate, at: NaiveTime, zone: Tz) -> DateTime<Utc> {
    let local = day.and_time(at);
    if let Some(t) = zone.from_local_datetime(&local).earliest() {
        return t.with_timezone(&Utc);
    }
    // In a gap (spring forward): the first local minute after it that exists.
    (1..=180)
        .find_map(|m| {
            zone.from_local_datetime(&(local + chrono::Duration::minutes(m)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| Utc.from_utc_datetime(&local))
}

/// What a message asks to be remembered when it is `/remember <text>` (any case): `Some(text)`,
/// trimmed and not empty. `None` for any other message (`/remember` alone, `/remembered`).
pub fn remember_command(text: &str) -> Option<&str> {
    let t = text.trim_start();
    let command = "/remember";
    if t.len() > command.len()
        && t.is_char_boundary(command.len())
        && t[..command.len()].eq_ignore_ascii_case(command)
    {
        let rest = &t[command.len()..];
        if rest.starts_with(char::is_whitespace) && !rest.trim().is_empty() {
            return Some(rest.trim());
        }
    }
    None
}

/// What a message asks when it starts with `/new` or `/reset` (any case, alone or followed by
/// more text): `Some(rest)`, the text after the command (trimmed; empty when it was only the
/// command). `None` for any other message, `/newsletter` included.
pub fn reset_command(text: &str) -> Option<&str> {
    let t = text.trim_start();
    for command in ["/reset", "/new"] {
        if t.len() >= command.len()
            && t.is_char_boundary(command.len())
            && t[..command.len()].eq_ignore_ascii_case(command)
        {
            let rest = &t[command.len()..];
            if rest.is_empty() || rest.starts_with(char::is_whitespace) {
                return Some(rest.trim());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn policy(idle_s: u64, daily: &str, zone: &str) -> ResetPolicy {
        ResetPolicy::of(&AgentConfig {
            name: "reggie_oc".into(),
            idle_reset_s: idle_s,
            daily_reset: daily.into(),
            time_zone: zone.into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn a_session_idle_longer_than_the_gap_starts_over() {
        let p = policy(3600, "", "UTC");
        let last = utc("2026-11-23T10:00:00Z");
        assert_eq!(p.due(Some(last), utc("2026-11-23T10:59:59Z")), None);
        assert_eq!(p.due(Some(last), utc("2026-11-23T11:00:00Z")), None);
        assert_eq!(
            p.due(Some(last), utc("2026-11-23T11:00:01Z")),
            Some(ResetReason::Idle)
        );
        // A session's first message resets nothing.
        assert_eq!(p.due(None, utc("2026-11-23T11:00:01Z")), None);
        // Switched off.
        assert_eq!(
            policy(0, "", "UTC").due(Some(last), utc("2030-01-01T00:00:00Z")),
            None
        );
    }

    #[test]
    fn the_daily_reset_fires_once_the_hour_passed_in_the_agents_time_zone() {
        // 04:00 in Sydney (UTC+11 in November) is 17:00 UTC the day before.
        let p = policy(0, "04:00", "Australia/Sydney");
        let last = utc("2026-11-23T16:30:00Z"); // 03:30 Sydney
        assert_eq!(p.due(Some(last), utc("2026-11-23T16:59:00Z")), None);
        assert_eq!(
            p.due(Some(last), utc("2026-11-23T17:00:00Z")),
            Some(ResetReason::Daily)
        );
        // Both messages after the same 04:00: no reset.
        let after = utc("2026-11-23T17:05:00Z");
        assert_eq!(p.due(Some(after), utc("2026-11-24T16:59:00Z")), None);
        assert_eq!(
            p.due(Some(after), utc("2026-11-24T17:01:00Z")),
            Some(ResetReason::Daily)
        );
    }

    #[test]
    fn idle_is_told_before_daily_when_both_apply() {
        let p = policy(3600, "04:00", "UTC");
        assert_eq!(
            p.due(
                Some(utc("2026-11-20T12:00:00Z")),
                utc("2026-11-23T12:00:00Z")
            ),
            Some(ResetReason::Idle)
        );
    }

    #[test]
    fn a_daily_time_the_clocks_skip_fires_when_they_land() {
        // London springs forward at 01:00 UTC on 2026-03-29: 01:30 local never happens.
        let p = policy(0, "01:30", "Europe/London");
        let at = latest_daily(
            NaiveTime::from_hms_opt(1, 30, 0).unwrap(),
            "Europe/London".parse().unwrap(),
            utc("2026-03-29T12:00:00Z"),
        );
        assert_eq!(at, utc("2026-03-29T01:00:00Z")); // 02:00 BST, the end of the gap
        assert_eq!(
            p.due(
                Some(utc("2026-03-28T23:00:00Z")),
                utc("2026-03-29T01:00:00Z")
            ),
            Some(ResetReason::Daily)
        );
        // Autumn: 01:30 happens twice on 2026-10-25; the first one counts.
        let at = latest_daily(
            NaiveTime::from_hms_opt(1, 30, 0).unwrap(),
            "Europe/London".parse().unwrap(),
            utc("2026-10-25T12:00:00Z"),
        );
        assert_eq!(at, utc("2026-10-25T00:30:00Z"));
    }

    #[test]
    fn bad_times_and_zones_are_refused_with_the_agents_name() {
        let bad = |daily: &str, zone: &str| {
            ResetPolicy::of(&AgentConfig {
                name: "reggie_oc".into(),
                daily_reset: daily.into(),
                time_zone: zone.into(),
                ..Default::default()
            })
            .unwrap_err()
            .to_string()
        };
        assert!(bad("4am", "UTC").contains("reggie_oc"));
        assert!(bad("25:00", "UTC").contains("daily_reset"));
        assert!(bad("04:00", "Mars/Olympus").contains("time_zone"));
    }

    #[test]
    fn only_a_message_starting_with_the_command_word_resets() {
        assert_eq!(reset_command("/new"), Some(""));
        assert_eq!(reset_command("  /RESET  "), Some(""));
        assert_eq!(
            reset_command("/new let's plan Friday"),
            Some("let's plan Friday")
        );
        assert_eq!(reset_command("/reset\nhello"), Some("hello"));
        assert_eq!(reset_command("/newsletter please"), None);
        assert_eq!(reset_command("please /reset"), None);
        assert_eq!(reset_command("/ne"), None);
        assert_eq!(reset_command("/néw"), None);
        assert_eq!(reset_command(""), None);
    }

    #[test]
    fn remember_takes_the_text_after_the_command_and_nothing_else() {
        assert_eq!(
            remember_command("/remember I am allergic to nuts "),
            Some("I am allergic to nuts")
        );
        assert_eq!(
            remember_command("  /REMEMBER\tmy badge is 42"),
            Some("my badge is 42")
        );
        assert_eq!(remember_command("/remember"), None);
        assert_eq!(remember_command("/remember   "), None);
        assert_eq!(remember_command("/remembered that"), None);
        assert_eq!(remember_command("please /remember this"), None);
    }
}
