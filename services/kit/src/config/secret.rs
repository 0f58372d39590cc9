//! [`Secret`]: the type of every key, token and password in the configuration; [`SecretUrl`]
//! of every URL that may carry one; [`ProviderSections`] of the adapters' own settings.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A secret value: deserialised like a string, never printed by `Debug`.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// A URL that may carry credentials (`postgres://user:pass@host/db`, `nats://token@host`):
/// read as text where it is connected to (it derefs to `str`), printed by `Debug` with its
/// password, token and query left out ([`crate::endpoint::redact_url`]).
#[derive(Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// What `Debug` prints: the URL without its credentials.
    pub fn redacted(&self) -> String {
        crate::endpoint::redact_url(&self.0)
    }
}

impl std::ops::Deref for SecretUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretUrl {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for SecretUrl {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl PartialEq<&str> for SecretUrl {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

/// `[providers.<name>]`: each channel adapter's own settings, by provider
/// ([`super::Config::provider_settings`]). They may hold secrets, so `Debug` names the
/// sections only.
#[derive(Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct ProviderSections(pub BTreeMap<String, figment::value::Dict>);

impl std::fmt::Debug for ProviderSections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}
