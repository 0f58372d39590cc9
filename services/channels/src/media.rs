//! A provider's media (the pictures of an MMS, its `MediaUrlN`): which URLs may be fetched and
//! with which credentials. The dispatcher keeps a person's media in the session's workspace; it
//! knows no provider and fetches only what the provider of the message vouches for, so a URL
//! in a message is never fetched blindly.
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use switchboard_kit::config::Config;

use crate::Adapter;

/// How one provider's media URLs are fetched.
pub trait MediaAccess: Send + Sync {
    /// The request for `url`, with the provider's credentials, or why it is not fetched (a URL
    /// outside the provider's media API, a file the provider no longer has). Asynchronous: a
    /// provider whose messages name files by id (Telegram) asks its API where the file is
    /// first.
    fn request<'a>(
        &'a self,
        http: &'a reqwest::Client,
        url: &'a str,
    ) -> BoxFuture<'a, Result<reqwest::RequestBuilder, String>>;
}

/// Builds a channel's media access from the configuration.
pub type MakeMedia = fn(&Config) -> Arc<dyn MediaAccess>;

/// Every adapter's media access, by provider name.
#[derive(Clone, Default)]
pub struct MediaSources(BTreeMap<&'static str, Arc<dyn MediaAccess>>);

impl MediaSources {
    /// The media access of each of `adapters` that has one.
    pub fn of(adapters: &[Adapter], config: &Config) -> Self {
        Self(
            adapters
                .iter()
                .filter_map(|a| a.media.map(|make| (a.provider, make(config))))
                .collect(),
        )
    }

    /// The media access of `provider`, if its messages can carry media.
    pub fn get(&self, provider: &str) -> Option<&Arc<dyn MediaAccess>> {
        self.0.get(provider)
    }
}
