//! `switchboard send --channel whatsapp`: a message from a WhatsApp number posted to the
//! gateway's webhook as Meta would (signed with the app secret), the reply read from the demo
//! outbox.
use anyhow::{Context as _, bail};
use switchboard_channels::whatsapp::{PROVIDER, SIGNATURE_HEADER, WhatsAppSettings};
use switchboard_kit::Config;

use crate::demo_outbox::DemoOutbox;

/// Post a text message from `from` (a phone number) to the configured business number and wait
/// up to `wait` seconds for the replies in the demo outbox.
pub async fn send_text(
    config: &Config,
    from: &str,
    text: &str,
    wait: u64,
) -> anyhow::Result<(String, Vec<String>)> {
    let number = switchboard_kit::address::normalize_phone(from, &config.identity.default_region)?;
    let settings: WhatsAppSettings = config
        .provider_settings(PROVIDER)
        .context("reading [providers.whatsapp]")?;
    if settings.app_secret.is_empty() || settings.phone_number_id.is_empty() {
        bail!("[providers.whatsapp] app_secret and phone_number_id must be set");
    }
    let wa_id = number.trim_start_matches('+');
    let wamid = format!("wamid.{}", uuid::Uuid::new_v4().simple());
    let body = switchboard_fakes::whatsapp::text_message(
        &settings.phone_number_id,
        switchboard_fakes::whatsapp::DISPLAY_PHONE_NUMBER,
        wa_id,
        "",
        &wamid,
        text,
    )
    .to_string();
    let signature = switchboard_channels::whatsapp::sign(
        settings.app_secret.expose().as_bytes(),
        body.as_bytes(),
    );
    let outbox = DemoOutbox::of(config, wa_id, Some(PROVIDER));
    let before = outbox.list().await.map(|l| l.len());
    let url = format!(
        "{}/webhooks/whatsapp",
        config.gateway.public_url.trim_end_matches('/')
    );
    let resp = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .header(SIGNATURE_HEADER, signature)
        .body(body)
        .send()
        .await
        .with_context(|| format!("posting to {url} (is `make run` running?)"))?;
    let status = resp.status();
    if !status.is_success() {
        bail!(
            "the gateway answered {status}: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let Some(before) = before.filter(|_| wait > 0) else {
        bail!("no demo outbox to read the reply from: it went out through WhatsApp");
    };
    let replies = outbox.wait_past(before, wait).await?;
    Ok((
        format!("whatsapp:{number}"),
        replies.into_iter().map(|m| m.body).collect(),
    ))
}
