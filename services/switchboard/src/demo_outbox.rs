//! The demo outbox (`GET /demo/outbox`) as `switchboard send` reads it: what the demo's
//! providers took for one recipient, and the wait for a reply to land there.
use std::time::{Duration, Instant};

use anyhow::bail;
use switchboard_kit::Config;

use crate::sms_cli::OutboxSms;

pub struct DemoOutbox {
    http: reqwest::Client,
    url: String,
    to: String,
    /// Only what this provider took (`None`: every provider's).
    provider: Option<&'static str>,
}

impl DemoOutbox {
    /// The outbox of `to` at the configured gateway.
    pub fn of(config: &Config, to: &str, provider: Option<&'static str>) -> Self {
        Self {
            http: reqwest::Client::new(),
            url: format!(
                "{}/demo/outbox",
                config.gateway.public_url.trim_end_matches('/')
            ),
            to: to.to_string(),
            provider,
        }
    }

    /// What it holds now; `None` when there is no demo outbox.
    pub async fn list(&self) -> Option<Vec<OutboxSms>> {
        let resp = self
            .http
            .get(&self.url)
            .query(&[("to", self.to.as_str())])
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let all: Vec<OutboxSms> = resp.json().await.ok()?;
        Some(
            all.into_iter()
                .filter(|m| self.provider.is_none_or(|p| m.provider == p))
                .collect(),
        )
    }

    /// What arrived after the first `before` entries, once something did, within `wait`
    /// seconds.
    pub async fn wait_past(&self, before: usize, wait: u64) -> anyhow::Result<Vec<OutboxSms>> {
        let deadline = Instant::now() + Duration::from_secs(wait);
        while Instant::now() < deadline {
            if let Some(list) = self.list().await
                && list.len() > before
            {
                return Ok(list[before..].to_vec());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("no reply within {wait} s (see `switchboard dlq list`)")
    }
}
