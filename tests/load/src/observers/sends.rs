//! What the providers' fakes took, as a load run watches it: a [`SendLog`] per fake (Twilio,
//! TextMagic, Telegram, Slack, WhatsApp), told of every accepted send through the fakes'
//! [`SendObserver`] hook.
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use switchboard_fakes::{
    FakeSlack, FakeTelegram, FakeTextMagic, FakeTwilio, FakeWhatsApp, Platform, Provider,
    SendObserver, SentMessage, SentSms,
};
use tokio::sync::oneshot;

use super::note;
use crate::channels::Channel;
use crate::{now_us, parse_text};

/// What a provider's fake records of every send it accepts: when each reply first arrived,
/// replies delivered more than once, each person's order, and whoever waits for a reply.
#[derive(Default)]
struct SendLog {
    /// Message text → arrival times, µs (more than one: delivered more than once).
    arrivals: Mutex<HashMap<String, Vec<u64>>>,
    /// Recipient → highest message index delivered so far.
    per_recipient: Mutex<HashMap<String, u32>>,
    /// Recipient → replies in the order they first arrived.
    sequence: Mutex<HashMap<String, Vec<String>>>,
    order_violations: AtomicU64,
    doubles: AtomicU64,
    total: AtomicU64,
    evidence: Mutex<Vec<String>>,
    waiters: Mutex<HashMap<String, oneshot::Sender<u64>>>,
    /// Every accepted send, in arrival order (the chaos checker judges these).
    log: Mutex<Vec<SendRecord>>,
}

impl SendLog {
    /// Record one accepted send (`at`, µs) of `body` to `to`, which the provider gave the id
    /// `sid`, made by the process its `User-Agent` names.
    fn record(&self, channel: Channel, at: u64, sid: &str, to: &str, body: &str, ua: Option<&str>) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let text = body.strip_prefix("echo: ").unwrap_or(body).to_string();
        self.log.lock().unwrap().push(SendRecord {
            channel,
            at_us: at,
            to: to.to_string(),
            text: text.clone(),
            sid: sid.to_string(),
            sender_pid: ua.and_then(pid_of_user_agent),
        });
        let first = {
            let mut arrivals = self.arrivals.lock().unwrap();
            let e = arrivals.entry(text.clone()).or_default();
            e.push(at);
            e.len() == 1
        };
        if !first {
            self.doubles.fetch_add(1, Ordering::Relaxed);
            note(
                &self.evidence,
                format!(
                    "double: reply to {text:?} delivered again to {to}, at {:.3}s",
                    at as f64 / 1e6
                ),
            );
            return;
        }
        self.sequence
            .lock()
            .unwrap()
            .entry(to.to_string())
            .or_default()
            .push(text.clone());
        if let Some((_, index)) = parse_text(&text) {
            let mut per = self.per_recipient.lock().unwrap();
            let max = per.entry(to.to_string()).or_insert(index);
            if *max > index {
                self.order_violations.fetch_add(1, Ordering::Relaxed);
                note(
                    &self.evidence,
                    format!(
                        "sms order: {to} got #{index} after #{}, at {:.3}s",
                        *max,
                        at as f64 / 1e6
                    ),
                );
            }
            *max = (*max).max(index);
        }
        if let Some(w) = self.waiters.lock().unwrap().remove(&text) {
            let _ = w.send(at);
        }
    }

    fn stats(&self, lookups: u64) -> SendStats {
        SendStats {
            total: self.total.load(Ordering::SeqCst),
            distinct: self.arrivals.lock().unwrap().len() as u64,
            doubles: self.doubles.load(Ordering::SeqCst),
            order_violations: self.order_violations.load(Ordering::SeqCst),
            lookups,
            evidence: self.evidence.lock().unwrap().clone(),
        }
    }
}

/// One message a provider's fake accepted.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct SendRecord {
    /// The provider (evidence of runs before TextMagic was driven holds Twilio's only).
    #[serde(default)]
    pub channel: Channel,
    pub at_us: u64,
    /// The recipient as the request named it (Twilio: `To`, E.164; TextMagic: `phones`,
    /// digits; Telegram: `chat_id`; Slack: `<channel>[:<thread ts>]`; WhatsApp: digits).
    pub to: String,
    /// The body less the runner's `echo: ` (so the message text it answers).
    pub text: String,
    /// The id this fake answered with.
    pub sid: String,
    /// The sending process, from the deliverer's `User-Agent` (`… (<host>:<pid>)`).
    pub sender_pid: Option<u32>,
}

/// The pid in a deliverer's `User-Agent`, `switchboard-deliver/<version> (<host>:<pid>)`.
pub fn pid_of_user_agent(ua: &str) -> Option<u32> {
    ua.rsplit_once(':')?.1.strip_suffix(')')?.parse().ok()
}

/// What a provider's fake saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SendStats {
    /// Every accepted send request.
    pub total: u64,
    /// Distinct replies.
    pub distinct: u64,
    /// Sends of a reply already delivered.
    pub doubles: u64,
    /// Replies that reached a person before an earlier one of theirs.
    pub order_violations: u64,
    /// Requests for the message list or history (deliverers looking up a part of uncertain
    /// outcome; Telegram and WhatsApp have none to ask).
    pub lookups: u64,
    pub evidence: Vec<String>,
}

impl SendObserver for SendLog {
    fn accepted(&self, sms: &SentSms) {
        let channel = match sms.provider {
            Provider::Twilio => Channel::Twilio,
            Provider::TextMagic => Channel::TextMagic,
        };
        let ua = sms.user_agent.as_deref();
        self.record(channel, now_us(), &sms.sid, &sms.to, &sms.body, ua);
    }

    fn posted(&self, m: &SentMessage) {
        let channel = match m.platform {
            Platform::Telegram => Channel::Telegram,
            Platform::Slack => Channel::Slack,
            Platform::WhatsApp => Channel::WhatsApp,
        };
        let ua = m.user_agent.as_deref();
        self.record(channel, now_us(), &m.sid, &m.to, &m.body, ua);
    }
}

/// A provider's fake a load run watches.
pub trait ProviderFake: Clone {
    fn observe(&self, observer: Arc<dyn SendObserver>);
    fn lookups(&self) -> u64;
}

impl ProviderFake for FakeTwilio {
    fn observe(&self, observer: Arc<dyn SendObserver>) {
        FakeTwilio::observe(self, observer);
    }
    fn lookups(&self) -> u64 {
        FakeTwilio::lookups(self)
    }
}

impl ProviderFake for FakeTextMagic {
    fn observe(&self, observer: Arc<dyn SendObserver>) {
        FakeTextMagic::observe(self, observer);
    }
    fn lookups(&self) -> u64 {
        FakeTextMagic::lookups(self)
    }
}

/// The Bot API keeps no log a bot can read: nothing to look up.
impl ProviderFake for FakeTelegram {
    fn observe(&self, observer: Arc<dyn SendObserver>) {
        FakeTelegram::observe(self, observer);
    }
    fn lookups(&self) -> u64 {
        0
    }
}

impl ProviderFake for FakeSlack {
    fn observe(&self, observer: Arc<dyn SendObserver>) {
        FakeSlack::observe(self, observer);
    }
    fn lookups(&self) -> u64 {
        self.history_lookups() as u64
    }
}

/// The Cloud API keeps no log a business can read: nothing to look up.
impl ProviderFake for FakeWhatsApp {
    fn observe(&self, observer: Arc<dyn SendObserver>) {
        FakeWhatsApp::observe(self, observer);
    }
    fn lookups(&self) -> u64 {
        0
    }
}

/// A provider's fake watched by a [`SendLog`]; its account (`url`, credentials) through
/// `Deref`.
#[derive(Clone)]
pub struct Watched<F> {
    fake: F,
    sends: Arc<SendLog>,
}

/// Twilio's Messages API ([`FakeTwilio`]) of a load run.
pub type LoadTwilio = Watched<FakeTwilio>;
/// TextMagic's v2 Messages API ([`FakeTextMagic`]) of a load run.
pub type LoadTextMagic = Watched<FakeTextMagic>;
/// Telegram's Bot API ([`FakeTelegram`]) of a load run's bot.
pub type LoadTelegram = Watched<FakeTelegram>;
/// Slack's Web API ([`FakeSlack`]) of a load run's workspace.
pub type LoadSlack = Watched<FakeSlack>;
/// WhatsApp's Cloud API ([`FakeWhatsApp`]) of a load run's business number.
pub type LoadWhatsApp = Watched<FakeWhatsApp>;

impl LoadTwilio {
    pub async fn start(account_sid: &str, auth_token: &str) -> Self {
        Watched::watch(FakeTwilio::start(account_sid, auth_token).await)
    }
}

impl LoadTextMagic {
    pub async fn start(username: &str, api_key: &str) -> Self {
        Watched::watch(FakeTextMagic::start(username, api_key).await)
    }
}

impl LoadTelegram {
    pub async fn start(bot_token: &str) -> Self {
        Watched::watch(FakeTelegram::start(bot_token).await)
    }
}

impl LoadSlack {
    pub async fn start(bot_token: &str, team_id: &str) -> Self {
        Watched::watch(FakeSlack::start(bot_token, team_id).await)
    }
}

impl LoadWhatsApp {
    /// Its 24-hour window always open: a load run's people have just written (to the
    /// gateway, never to this fake); the product's own window check still applies.
    pub async fn start(access_token: &str, phone_number_id: &str) -> Self {
        let fake = FakeWhatsApp::start(access_token, phone_number_id).await;
        fake.without_window();
        Watched::watch(fake)
    }
}

impl<F> std::ops::Deref for Watched<F> {
    type Target = F;
    fn deref(&self) -> &F {
        &self.fake
    }
}

impl<F: ProviderFake> Watched<F> {
    pub fn watch(fake: F) -> Self {
        let sends = Arc::new(SendLog::default());
        fake.observe(sends.clone());
        Self { fake, sends }
    }

    /// A receiver that fires (with the arrival time, µs) when the reply to `text` arrives.
    pub fn wait_for(&self, text: &str) -> oneshot::Receiver<u64> {
        let (tx, rx) = oneshot::channel();
        self.sends
            .waiters
            .lock()
            .unwrap()
            .insert(text.to_string(), tx);
        rx
    }

    /// When the reply to `text` arrived, µs (once per delivery).
    pub fn arrivals_of(&self, text: &str) -> Vec<u64> {
        self.sends
            .arrivals
            .lock()
            .unwrap()
            .get(text)
            .cloned()
            .unwrap_or_default()
    }

    /// First-arrival times of every reply, µs, sorted.
    pub fn arrival_times(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .sends
            .arrivals
            .lock()
            .unwrap()
            .values()
            .filter_map(|t| t.first().copied())
            .collect();
        v.sort_unstable();
        v
    }

    /// Replies delivered more than once: text → arrival times, µs.
    pub fn doubled(&self) -> Vec<(String, Vec<u64>)> {
        self.sends
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, t)| t.len() > 1)
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect()
    }

    /// Each recipient's replies in the order they first arrived.
    pub fn sequences(&self) -> HashMap<String, Vec<String>> {
        self.sends.sequence.lock().unwrap().clone()
    }

    /// Every accepted send so far, in arrival order.
    pub fn sends(&self) -> Vec<SendRecord> {
        self.sends.log.lock().unwrap().clone()
    }

    pub fn distinct(&self) -> u64 {
        self.sends.arrivals.lock().unwrap().len() as u64
    }

    pub fn stats(&self) -> SendStats {
        self.sends.stats(self.fake.lookups())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use switchboard_channels::textmagic::TextMagicSender;
    use switchboard_channels::twilio::TwilioSender;
    use switchboard_kit::config::{Secret, TextMagicConfig, TwilioConfig};

    #[tokio::test]
    async fn the_load_textmagic_records_sends_and_lists_them_as_textmagic_does() {
        let fake = LoadTextMagic::start("load-user", "load-key").await;
        let textmagic = TextMagicSender::new(TextMagicConfig {
            username: "load-user".into(),
            api_key: Secret::new("load-key"),
            from_number: "15555550198".into(),
            api_base: fake.url.clone(),
            ..Default::default()
        });
        let since = Utc::now();
        let id = textmagic
            .send_text("+14155550100", "", "echo: s1#0")
            .await
            .unwrap();
        // Others' messages come after it, more than one page of them.
        for i in 0..150 {
            textmagic
                .send_text("+14155550101", "", &format!("echo: s2#{i}"))
                .await
                .unwrap();
        }
        let found = textmagic
            .find_text("+14155550100", "", "echo: s1#0", since)
            .await;
        assert_eq!(found, Ok(vec![id.clone()]));
        let sends = fake.sends();
        assert_eq!(sends.len(), 151);
        assert_eq!(sends[0].channel, Channel::TextMagic);
        assert_eq!(
            (sends[0].to.as_str(), sends[0].text.as_str()),
            ("14155550100", "s1#0")
        );
        assert_eq!(sends[0].sid, id);
        assert!(fake.stats().lookups >= 2, "the look-up read two pages");
        assert_eq!(fake.stats().doubles, 0);
    }

    #[tokio::test]
    async fn the_load_twilio_lists_what_it_took_as_twilio_lists_its_messages() {
        let fake = LoadTwilio::start("ACload", "load-token").await;
        let twilio = TwilioSender::new(TwilioConfig {
            account_sid: "ACload".into(),
            auth_token: Secret::new("load-token"),
            from_number: "+15555550199".into(),
            api_base: fake.url.clone(),
            ..Default::default()
        });
        let since = Utc::now();
        let sid = twilio
            .send_body("+14155550100", "", "echo: s1#0")
            .await
            .unwrap();
        let found = twilio
            .find_body("+14155550100", "", "echo: s1#0", since)
            .await;
        assert_eq!(found, Ok(vec![sid]));
        let other = twilio
            .find_body("+14155550101", "", "echo: s1#0", since)
            .await;
        assert_eq!(other, Ok(vec![]));
        assert_eq!(fake.stats().lookups, 2);
        assert_eq!(fake.stats().doubles, 0);
    }
}
