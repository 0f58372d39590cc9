//! `[wakeups]`: what an agent may ask when it schedules its own wake-up ([`crate::wakeups`],
//! `POST /api/v1/wakeups`), and how dispatchers fire them.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct WakeupsConfig {
    /// Pending wake-ups one person may have with one agent identity at a time; one more is
    /// refused (429 `too_many_wakeups`) until one fires or is cancelled.
    pub max_pending_per_person: u32,
    /// How far ahead a wake-up may be due.
    pub max_ahead_days: u32,
    /// The longest note (characters); the note is the later turn's input.
    pub max_note_chars: usize,
    /// How often each dispatcher looks for wake-ups that are due.
    pub tick_ms: u64,
    /// How long a dispatcher holds a due wake-up while it fires it; a dispatcher that died
    /// holding one lets it go when this lapses, and another fires it.
    pub claim_s: u64,
    /// The IANA time zone a person's `/reminders` list shows times in.
    pub time_zone: String,
}

impl WakeupsConfig {
    /// [`Self::time_zone`], or why it names none.
    pub fn tz(&self) -> Result<chrono_tz::Tz, String> {
        self.time_zone.parse().map_err(|_| {
            format!(
                "{:?} is not an IANA time zone name (e.g. \"UTC\", \"Europe/London\")",
                self.time_zone
            )
        })
    }
}

impl Default for WakeupsConfig {
    fn default() -> Self {
        Self {
            max_pending_per_person: 10,
            max_ahead_days: 365,
            max_note_chars: 2_000,
            tick_ms: 1_000,
            claim_s: 60,
            time_zone: "UTC".into(),
        }
    }
}
