//! Channel adapters: everything Switchboard knows about one provider, in one module.
//!
//! A channel adapter has an ingress (a [`Webhook`]: the route a provider posts to, how to
//! authenticate the request and how to read it into a [`Received`] message) and an egress (an
//! [`Egress`]: how to send one part of a reply and how to read the provider's answer). The
//! gateway and the deliver stage know no provider: they mount every webhook of the app's
//! [`Channels`] ([`ADAPTERS`] in the product) and look senders up by the provider name a reply
//! carries; the dispatcher fetches a message's media through its provider's [`MediaAccess`].
//! Adding a channel is one module and one line in [`ADAPTERS`] (see
//! `docs/adding-a-channel.md`).
pub mod api;
pub mod chat;
pub mod egress;
pub mod error;
pub mod form;
pub mod generic;
pub mod ingress;
pub mod mailbox;
pub mod media;
pub mod slack;
pub mod telegram;
pub mod textmagic;
pub mod twilio;
pub mod whatsapp;

use std::collections::BTreeMap;
use std::sync::Arc;

use switchboard_kit::config::Config;
use switchboard_kit::startup::App;

pub use egress::{
    AttachmentStyle, Egress, OutboundPart, SEND_LEASE, SendError, split_message, with_links,
};
pub use error::ApiError;
pub use ingress::{
    Ack, Answer, Incoming, Receipt, ReceiptStatus, Received, Webhook, WebhookRequest, client_id,
    client_message_key,
};
pub use mailbox::{MAILBOX_LEASE, Mailbox, MailboxEgress, MailboxEntry};
pub use media::{MakeMedia, MediaAccess, MediaSources};

/// Builds a channel's webhook from the configuration.
pub type MakeWebhook = fn(&Config) -> Arc<dyn Webhook>;
/// Builds a channel's sender from the configuration.
pub type MakeEgress = fn(&Config) -> Arc<dyn Egress>;

/// One provider's adapter, as the product lists it.
#[derive(Clone, Copy)]
pub struct Adapter {
    /// The provider name inbound messages and replies carry (`InboundMessage.provider`).
    pub provider: &'static str,
    /// Its ingress, built from the configuration (absent for send-only providers).
    pub webhook: Option<MakeWebhook>,
    /// Its egress (absent for receive-only providers).
    pub egress: Option<MakeEgress>,
    /// How the media its messages carry are fetched (absent when they carry none).
    pub media: Option<MakeMedia>,
}

/// Every channel adapter the product has.
pub const ADAPTERS: &[Adapter] = &[
    twilio::ADAPTER,
    twilio::whatsapp::ADAPTER,
    textmagic::ADAPTER,
    generic::ADAPTER,
    telegram::ADAPTER,
    slack::ADAPTER,
    whatsapp::ADAPTER,
];

/// The channel adapters a process has: the product's ([`ADAPTERS`]), and any a test adds the
/// way `docs/adding-a-channel.md` says ([`Channels::with`], put in the [`App`] with
/// `App::with`). The gateway mounts their webhooks, the deliver stage sends through their
/// egresses and the dispatcher fetches media through them, each reading [`Channels::of`] the
/// app.
#[derive(Clone)]
pub struct Channels(Vec<Adapter>);

impl Channels {
    /// The product's adapters.
    pub fn product() -> Self {
        Self(ADAPTERS.to_vec())
    }

    /// These and `adapter` (replacing one of the same provider).
    pub fn with(mut self, adapter: Adapter) -> Self {
        self.0.retain(|a| a.provider != adapter.provider);
        self.0.push(adapter);
        self
    }

    /// The adapters `app` has: the product's unless the app was given others.
    pub fn of(app: &App) -> Self {
        app.extensions
            .get::<Channels>()
            .cloned()
            .unwrap_or_else(Self::product)
    }

    pub fn adapters(&self) -> &[Adapter] {
        &self.0
    }

    /// Every adapter's webhook, built from `config`.
    pub fn webhooks(&self, config: &Config) -> Vec<Arc<dyn Webhook>> {
        self.0
            .iter()
            .filter_map(|a| a.webhook.map(|make| make(config)))
            .collect()
    }

    /// Every adapter's egress, by provider name.
    pub fn senders(&self, config: &Config) -> Senders {
        Senders(
            self.0
                .iter()
                .filter_map(|a| a.egress.map(|make| (a.provider, make(config))))
                .collect(),
        )
    }

    /// The media access of every adapter that has one.
    pub fn media(&self, config: &Config) -> MediaSources {
        MediaSources::of(&self.0, config)
    }
}

/// Every adapter's egress, by provider name.
#[derive(Clone)]
pub struct Senders(BTreeMap<&'static str, Arc<dyn Egress>>);

impl Senders {
    /// Add (or replace) the sender of `provider`: for egresses that need more than the
    /// configuration (the mailbox needs the database and NATS).
    pub fn with(mut self, provider: &'static str, egress: Arc<dyn Egress>) -> Self {
        self.0.insert(provider, egress);
        self
    }

    /// The sender for replies to messages that came in through `provider`.
    pub fn get(&self, provider: &str) -> Option<&Arc<dyn Egress>> {
        self.0.get(provider)
    }
}

/// `switchboard-deliver/<version> (<host>:<pid>)`: which replica sent a message, as the
/// provider's request log (or a test's fake) sees it.
pub fn user_agent() -> String {
    format!(
        "switchboard-deliver/{} ({})",
        env!("CARGO_PKG_VERSION"),
        switchboard_kit::instance_id()
    )
}

/// The longest a request to a provider's API may take, connecting included: a send that started
/// at `t` reached the provider by `t + REQUEST_TIMEOUT` or not at all (a provider's log is
/// searched up to then, [`egress::not_after`]).
pub(crate) const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// An HTTP client for a provider's API: our user agent, bounded connect and request times.
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(user_agent())
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("HTTP client")
}

/// `[providers.<provider>]` of the example configuration (`switchboard.toml`), read as the
/// adapter's settings after checking it names no key they do not have (a misspelt key would
/// otherwise be dropped by `#[serde(default)]` without a word).
#[cfg(test)]
pub(crate) fn example_settings<T>(provider: &str) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned + Default,
{
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../switchboard.toml");
    let file: toml::Table = std::fs::read_to_string(example)
        .expect("the example configuration")
        .parse()
        .expect("it is TOML");
    let section = file["providers"][provider]
        .as_table()
        .unwrap_or_else(|| panic!("[providers.{provider}]"));
    let known = toml::Table::try_from(T::default()).expect("a table");
    for key in section.keys() {
        assert!(
            known.contains_key(key),
            "unknown key providers.{provider}.{key}"
        );
    }
    section.clone().try_into().expect("it reads")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_adapter_is_listed_once_and_routes_do_not_clash() {
        let config = Config::default();
        let mut providers: Vec<_> = ADAPTERS.iter().map(|a| a.provider).collect();
        providers.sort();
        providers.dedup();
        assert_eq!(providers.len(), ADAPTERS.len());
        let channels = Channels::product();
        let mut routes: Vec<_> = channels
            .webhooks(&config)
            .iter()
            .map(|w| w.route())
            .collect();
        let n = routes.len();
        routes.sort();
        routes.dedup();
        assert_eq!(routes.len(), n);
        let senders = channels.senders(&config);
        for provider in [
            "twilio",
            "textmagic",
            "generic",
            "telegram",
            "slack",
            "whatsapp",
            "twilio_whatsapp",
        ] {
            assert!(senders.get(provider).is_some(), "{provider}");
        }
        assert!(senders.get("carrier-pigeon").is_none());
    }
}
