//! Third parties as real HTTP servers speaking their real wire formats, one fake per provider:
//! Twilio ([`twilio`]), TextMagic ([`textmagic`]), an agent host's runner ([`runner`]), an
//! OpenAI-compatible model ([`model`]), a webhook source's callback receiver ([`webhook`])
//! and an OpenTelemetry collector's trace receiver ([`collector`]). The demo (`switchboard up` with `demo.enabled`) mounts them in its own
//! server, the end-to-end tests start them on ports of their own, and the load tools watch
//! every send and call through [`SendObserver`] and [`RunObserver`] without keeping them all
//! (the SMS providers' and the chat platforms' fakes, Telegram, Slack and WhatsApp, alike).
#[cfg(feature = "collector")]
pub mod collector;
pub mod model;
pub mod runner;
mod serve;
pub mod slack;
pub mod sms;
pub mod telegram;
#[cfg(test)]
mod test_client;
pub mod textmagic;
pub mod twilio;
pub mod webhook;
pub mod whatsapp;

#[cfg(feature = "collector")]
pub use collector::{CollectedSpan, FakeCollector};
pub use model::{ChatCall, FakeAnswer, FakeModel, bag_of_words};
pub use runner::{FakeRunner, RunObserver, RunnerCall, fenced_texts, person_of};
pub use serve::{Failures, serve};
pub use slack::{FakeSlack, SlackPosted, SlackUploaded};
pub use sms::{Platform, Provider, SendObserver, SentMessage, SentSms};
pub use telegram::{FakeTelegram, TelegramSent};
pub use textmagic::FakeTextMagic;
pub use twilio::FakeTwilio;
pub use webhook::{CallbackRequest, FakeCallbackReceiver, hmac_sha256, webhook_signature};
pub use whatsapp::{FakeWhatsApp, WhatsAppSent};
