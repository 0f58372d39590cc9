//! `[identity]`: who a sender is (directory lookups), and the links a person proves with a
//! texted code (`[identity.proof]`).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Config;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct IdentityConfig {
    /// Region used to read phone numbers written without a country code.
    pub default_region: String,
    /// Extra lookups against the operator's own tables, tried in order after the directory.
    pub lookups: Vec<IdentityLookup>,
    /// `[identity.proof]`: links a person proves with a code texted to their phone.
    pub proof: LinkProofConfig,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            default_region: "US".into(),
            lookups: Vec::new(),
            proof: LinkProofConfig::default(),
        }
    }
}

/// "link my phone +61…" in chat (or the API) texts a one-time code to that number; the code
/// texted back from it, or typed where it was asked for, within `code_ttl_s` records the link.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct LinkProofConfig {
    /// Off: the words are passed to the agent like any message.
    pub enabled: bool,
    /// How long a code may be used.
    pub code_ttl_s: u64,
    /// Wrong codes a claim survives; the next one voids it (a new code must be asked for).
    pub max_wrong_codes: u32,
    /// Codes one person may ask for, and one number may be sent, in an hour.
    pub codes_per_hour: u32,
    /// The provider that texts the code (`twilio`, `textmagic`); empty: Twilio when its
    /// account is set, else TextMagic when its account is set.
    pub sms_provider: ProofSmsProvider,
    /// The text of the code SMS: `{code}` and `{lifetime}` are filled in, and nothing a
    /// claimant chose (their name) ever is, so a claim cannot make Switchboard text a stranger
    /// someone's words. Must contain `{code}`.
    pub sms_template: String,
    /// Codes sent to anyone, by everyone, in an hour: over it nothing is sent and the claimant
    /// is told to try later (a flood of claims cannot run up the SMS bill). 0: no cap.
    pub max_codes_per_hour: u32,
    /// Codes sent in an hour to numbers starting with a prefix (`"+44" = 20`): expensive or
    /// abused destinations capped apart. Empty: no prefix caps.
    pub max_codes_per_hour_by_prefix: BTreeMap<String, u32>,
}

/// The provider that texts link codes (`identity.proof.sms_provider`). A misspelt name is
/// refused at load, naming the key and the choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum ProofSmsProvider {
    /// `""`: Twilio when its account is set up, else TextMagic when its is.
    #[default]
    #[serde(rename = "")]
    Auto,
    #[serde(rename = "twilio")]
    Twilio,
    #[serde(rename = "textmagic")]
    TextMagic,
}

/// The code SMS by default: what it is, how long it works, and what to do if unasked.
pub const DEFAULT_SMS_TEMPLATE: &str = "{code} is your Switchboard code to link this phone. \
     Text it back to this number, or type it where you asked for it, within {lifetime}. If you \
     did not ask for it, ignore this message and do not share the code.";

impl Default for LinkProofConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            code_ttl_s: 600,
            max_wrong_codes: 4,
            codes_per_hour: 3,
            sms_provider: ProofSmsProvider::Auto,
            sms_template: DEFAULT_SMS_TEMPLATE.into(),
            max_codes_per_hour: 100,
            max_codes_per_hour_by_prefix: BTreeMap::new(),
        }
    }
}

/// Who sends an SMS Switchboard starts itself: the provider and the number it is sent from
/// (empty when the provider picks it, as a Twilio Messaging Service does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmsSender {
    pub provider: String,
    pub from: String,
}

/// `sql` takes the normalised address as `$1` and returns one row with text columns
/// `person_id`, `name`, `role` (the last two may be NULL).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct IdentityLookup {
    pub person_type: String,
    /// Which contact kind it applies to (`phone`, the default; `chat_user`, `api_key_owner`,
    /// `webhook_sender`, `telegram`, `slack`, `whatsapp`, `address`): a misspelt kind is refused at load, not silently never
    /// matched.
    #[serde(default)]
    pub kind: ContactKind,
    pub sql: String,
}

/// The kind of address a contact point is (`contact_points.kind`): every address of one
/// channel is of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContactKind {
    #[default]
    Phone,
    ChatUser,
    ApiKeyOwner,
    /// Addressed `<source>:<sender>`: a sender id means something only within its source.
    WebhookSender,
    /// A Telegram chat (`telegram:<chat id>`): a person's private chat with the bot, or a
    /// group configured as a conversation of its own.
    Telegram,
    /// A Slack user (`slack:<team>:<user>`): user ids mean something only within their
    /// workspace.
    Slack,
    /// A WhatsApp number (`whatsapp:<E.164>`): a phone, but one the person proves or links to
    /// their SMS number, never assumed to be it.
    WhatsApp,
    /// Any other channel's address, as given.
    Address,
}

impl ContactKind {
    /// The kind of the addresses of `channel` (`sms`: phones).
    pub fn of_channel(channel: &str) -> Self {
        match channel {
            "sms" => ContactKind::Phone,
            "admin_chat" | "header_widget" => ContactKind::ChatUser,
            "api" => ContactKind::ApiKeyOwner,
            "webhook" => ContactKind::WebhookSender,
            "telegram" => ContactKind::Telegram,
            "slack" => ContactKind::Slack,
            "whatsapp" => ContactKind::WhatsApp,
            _ => ContactKind::Address,
        }
    }

    /// As `contact_points.kind` stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            ContactKind::Phone => "phone",
            ContactKind::ChatUser => "chat_user",
            ContactKind::ApiKeyOwner => "api_key_owner",
            ContactKind::WebhookSender => "webhook_sender",
            ContactKind::Telegram => "telegram",
            ContactKind::Slack => "slack",
            ContactKind::WhatsApp => "whatsapp",
            ContactKind::Address => "address",
        }
    }
}

impl Config {
    /// The provider that texts link codes ([`LinkProofConfig::sms_provider`]), if one is set up.
    pub fn proof_sms_sender(&self) -> Option<SmsSender> {
        let twilio = || {
            let t = &self.twilio;
            (!t.account_sid.is_empty()
                && (!t.from_number.is_empty() || !t.messaging_service_sid.is_empty()))
            .then(|| SmsSender {
                provider: "twilio".into(),
                from: t.from_number.clone(),
            })
        };
        let textmagic = || {
            (!self.textmagic.username.is_empty()).then(|| SmsSender {
                provider: "textmagic".into(),
                from: self.textmagic.from_number.clone(),
            })
        };
        match self.identity.proof.sms_provider {
            ProofSmsProvider::Auto => twilio().or_else(textmagic),
            ProofSmsProvider::Twilio => twilio(),
            ProofSmsProvider::TextMagic => textmagic(),
        }
    }
}
