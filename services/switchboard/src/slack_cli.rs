//! `switchboard send --channel slack`: a direct message to the app posted to the gateway's
//! Events API URL as Slack would (signed with the app's signing secret), the reply read from
//! the demo outbox.
use anyhow::{Context as _, bail};
use switchboard_channels::slack::{PROVIDER, SIGNATURE_HEADER, SlackSettings, TIMESTAMP_HEADER};
use switchboard_kit::Config;

use crate::demo_outbox::DemoOutbox;

/// Post a direct message from Slack user `from` (`U…`) of the demo workspace and wait up to
/// `wait` seconds for the replies in the demo outbox.
pub async fn send_dm(
    config: &Config,
    from: &str,
    text: &str,
    wait: u64,
) -> anyhow::Result<(String, Vec<String>)> {
    let user_id = from.len() > 1
        && from.starts_with('U')
        && from
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    if !user_id {
        bail!("--from {from:?} is not a Slack user id (U followed by capitals and digits)");
    }
    let settings: SlackSettings = config
        .provider_settings(PROVIDER)
        .context("reading [providers.slack]")?;
    if settings.signing_secret.is_empty() {
        bail!("[providers.slack] signing_secret is not set: events could not be verified");
    }
    let team = switchboard::demo::DEMO_SLACK_TEAM;
    // The app's DM with the user, as the demo workspace names it.
    let dm = format!("D{}", &from[1..]);
    let now = chrono::Utc::now();
    let ts = format!("{}.{:06}", now.timestamp(), now.timestamp_subsec_micros());
    let event_id = format!("Ev{}", &uuid::Uuid::new_v4().simple().to_string()[..12]).to_uppercase();
    let event = switchboard_fakes::slack::dm_event(team, &event_id, from, &dm, text, &ts);
    let body = event.to_string();
    let timestamp = now.timestamp().to_string();
    let signature = switchboard_channels::slack::sign(
        settings.signing_secret.expose().as_bytes(),
        &timestamp,
        body.as_bytes(),
    );
    let base = config.gateway.public_url.trim_end_matches('/');
    let http = reqwest::Client::new();
    let outbox = DemoOutbox::of(config, &dm, Some(PROVIDER));
    let before = outbox.list().await.map(|l| l.len());
    let url = format!("{base}/webhooks/slack/events");
    let resp = http
        .post(&url)
        .header("content-type", "application/json")
        .header(TIMESTAMP_HEADER, &timestamp)
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
    let person = format!("slack:{team}:{from}");
    let Some(before) = before.filter(|_| wait > 0) else {
        bail!("no demo outbox to read the reply from: it went out through Slack");
    };
    let replies = outbox.wait_past(before, wait).await?;
    Ok((person, replies.into_iter().map(|m| m.body).collect()))
}
