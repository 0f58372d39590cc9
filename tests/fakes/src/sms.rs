//! What the SMS providers' fakes share: the message they took, the outbox that lists it, and
//! the hook through which a load run watches every send (the chat platforms' fakes, Telegram,
//! Slack and WhatsApp, report theirs through the same hook).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, Utc};

/// Which provider's send API took a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    Twilio,
    TextMagic,
}

/// One SMS a fake provider accepted.
#[derive(Debug, Clone)]
pub struct SentSms {
    pub provider: Provider,
    /// The id the provider answered with (Twilio `SM…`, TextMagic a number).
    pub sid: String,
    /// The recipient as the request named it (Twilio `To`, E.164; TextMagic `phones`, digits).
    pub to: String,
    pub from: String,
    pub body: String,
    /// The media sent with it (Twilio `MediaUrl`, in order; TextMagic sends text alone).
    pub media_urls: Vec<String>,
    /// When the provider took it (its log's `date_created` / `messageTime`).
    pub created: DateTime<Utc>,
    /// The sender's `User-Agent` (a deliverer names its host and pid there).
    pub user_agent: Option<String>,
}

/// A chat platform whose fake reports what it took through [`SendObserver::posted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    Telegram,
    Slack,
    WhatsApp,
}

/// One message a chat platform's fake accepted, as an SMS provider's would be reported.
#[derive(Debug, Clone)]
pub struct SentMessage {
    pub platform: Platform,
    /// The platform's id of the message: Telegram's `message_id`, Slack's `ts`, a `wamid`.
    pub sid: String,
    /// Where it went, as the fake records it: Telegram's `chat_id`, Slack's
    /// `<channel>[:<thread ts>]`, the WhatsApp number's digits.
    pub to: String,
    /// The text (a file's caption; a template's name).
    pub body: String,
    pub created: DateTime<Utc>,
    /// The sender's `User-Agent` (a deliverer names its host and pid there).
    pub user_agent: Option<String>,
}

/// Told of every send a provider's fake accepts, once it is listed (as the provider lists a
/// message once it took it). Load runs keep their order and duplicate checks here.
pub trait SendObserver: Send + Sync + 'static {
    fn accepted(&self, sms: &SentSms);

    /// Told of every message a chat platform's fake accepts, once it recorded it. Apart from
    /// [`Self::accepted`] so that [`Provider`] stays the SMS providers' (code matching on it
    /// keeps compiling); an observer of SMS alone (the demo's log) has nothing to do here.
    fn posted(&self, _message: &SentMessage) {}
}

/// The observer a chat platform's fake reports to, once one is set.
#[derive(Default)]
pub(crate) struct PostedObserver(OnceLock<Arc<dyn SendObserver>>);

impl PostedObserver {
    pub(crate) fn set(&self, observer: Arc<dyn SendObserver>) {
        if self.0.set(observer).is_err() {
            panic!("a fake provider takes one observer");
        }
    }

    pub(crate) fn tell(&self, message: SentMessage) {
        if let Some(observer) = self.0.get() {
            observer.posted(&message);
        }
    }
}

/// Every message a provider took, oldest first, and by recipient (the lists a deliverer reads
/// filter by recipient; a load run's whole log is long).
#[derive(Default)]
pub(crate) struct Outbox {
    all: Mutex<Vec<SentSms>>,
    by_to: Mutex<HashMap<String, Vec<usize>>>,
    observer: OnceLock<Arc<dyn SendObserver>>,
    /// Requests for the provider's message list (deliverers looking up a part of uncertain
    /// outcome).
    lookups: AtomicU64,
}

impl Outbox {
    pub(crate) fn take(&self, sms: SentSms) {
        {
            let mut all = self.all.lock().unwrap();
            self.by_to
                .lock()
                .unwrap()
                .entry(sms.to.clone())
                .or_default()
                .push(all.len());
            all.push(sms.clone());
        }
        if let Some(observer) = self.observer.get() {
            observer.accepted(&sms);
        }
    }

    pub(crate) fn all(&self) -> Vec<SentSms> {
        self.all.lock().unwrap().clone()
    }

    /// What was sent to `to`, oldest first.
    pub(crate) fn to(&self, to: &str) -> Vec<SentSms> {
        let all = self.all.lock().unwrap();
        let by_to = self.by_to.lock().unwrap();
        by_to
            .get(to)
            .map(|ix| ix.iter().map(|&i| all[i].clone()).collect())
            .unwrap_or_default()
    }

    /// `f` over the newest `skip..skip+take` messages, newest first, and how many there are.
    pub(crate) fn newest<T>(
        &self,
        skip: usize,
        take: usize,
        f: impl Fn(&SentSms) -> T,
    ) -> (Vec<T>, usize) {
        let all = self.all.lock().unwrap();
        (
            all.iter().rev().skip(skip).take(take).map(f).collect(),
            all.len(),
        )
    }

    pub(crate) fn looked_up(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::SeqCst)
    }

    pub(crate) fn observe(&self, observer: Arc<dyn SendObserver>) {
        if self.observer.set(observer).is_err() {
            panic!("a fake provider takes one observer");
        }
    }
}
