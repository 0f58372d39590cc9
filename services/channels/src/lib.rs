//! Channel adapters: everything Switchboard knows about one provider, in one module.
//!
//! A channel adapter has an ingress (a [`Webhook`]: the route a provider posts to, how to
//! authenticate the request and how to read it into a [`Received`] message) and an egress (an
//! [`Egress`]: how to send one part of a reply and how to read the provider's answer). The
//! gateway and the deliver stage know no provider: they mount every webhook of [`ADAPTERS`] and
//! look senders up by the provider name a reply carries; the dispatcher fetches a message's
//! media through its provider's [`MediaAccess`]. Adding a channel is one module and one
//! line in [`ADAPTERS`] (see `docs/adding-a-channel.md`).
pub mod api;
pub mod chat;
pub mod egress;
pub mod error;
pub mod form;
pub mod generic;
pub mod ingress;
pub mod mailbox;
pub mod media;
pub mod textmagic;
pub mod twilio;

use std::collections::BTreeMap;
use std::sync::Arc;

use switchboard_kit::config::Config;

pub use egress::{Egress, OutboundPart, SEND_LEASE, SendError, split_message};
pub use error::ApiError;
pub use ingress::{Ack, Received, Webhook, WebhookRequest, client_id, client_message_key};
pub use mailbox::{MAILBOX_LEASE, Mailbox, MailboxEgress, MailboxEntry};
pub use media::{MakeMedia, MediaAccess, MediaSources};

/// Builds a channel's webhook from the configuration.
pub type MakeWebhook = fn(&Config) -> Arc<dyn Webhook>;
/// Builds a channel's sender from the configuration.
pub type MakeEgress = fn(&Config) -> Arc<dyn Egress>;

/// One provider's adapter, as the product lists it.
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
pub const ADAPTERS: &[Adapter] = &[twilio::ADAPTER, textmagic::ADAPTER, generic::ADAPTER];

/// Every adapter's webhook, built from `config`.
pub fn webhooks(config: &Config) -> Vec<Arc<dyn Webhook>> {
    ADAPTERS
        .iter()
        .filter_map(|a| a.webhook.map(|make| make(config)))
        .collect()
}

/// Every adapter's egress, by provider name.
#[derive(Clone)]
pub struct Senders(BTreeMap<&'static str, Arc<dyn Egress>>);

impl Senders {
    pub fn from_config(config: &Config) -> Self {
        Self(
            ADAPTERS
                .iter()
                .filter_map(|a| a.egress.map(|make| (a.provider, make(config))))
                .collect(),
        )
    }

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
        let mut routes: Vec<_> = webhooks(&config).iter().map(|w| w.route()).collect();
        let n = routes.len();
        routes.sort();
        routes.dedup();
        assert_eq!(routes.len(), n);
        let senders = Senders::from_config(&config);
        for provider in ["twilio", "textmagic", "generic"] {
            assert!(senders.get(provider).is_some(), "{provider}");
        }
        assert!(senders.get("carrier-pigeon").is_none());
    }
}
