//! The SMS providers' accounts: `[twilio]` and `[textmagic]`.
use serde::{Deserialize, Serialize};

use super::Secret;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TwilioConfig {
    pub account_sid: String,
    pub auth_token: Secret,
    pub from_number: String,
    /// Used instead of `from_number` when set.
    pub messaging_service_sid: String,
    pub api_base: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct TextMagicConfig {
    pub username: String,
    pub api_key: Secret,
    pub from_number: String,
    pub api_base: String,
    pub webhook_token: Secret,
}
