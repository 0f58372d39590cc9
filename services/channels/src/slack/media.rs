//! Files a person shared with the app: their `url_private_download`, fetched only from Slack's
//! file origin (`files_base`) and with the bot's token (Slack answers a login page without it).
use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::SlackSettings;
use crate::media::MediaAccess;

pub struct SlackMedia {
    settings: Result<SlackSettings, String>,
}

impl SlackMedia {
    pub fn new(settings: Result<SlackSettings, String>) -> Self {
        Self { settings }
    }

    fn request_now(
        &self,
        http: &reqwest::Client,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, String> {
        let settings = self.settings.as_ref().map_err(|e| e.clone())?;
        let parsed = url::Url::parse(url).map_err(|_| "not a URL".to_string())?;
        let origin = url::Url::parse(settings.files()).map_err(|_| "files_base is not a URL")?;
        if origin.origin() != parsed.origin() {
            return Err("not from Slack's file origin".into());
        }
        if settings.bot_token.is_empty() {
            return Err("providers.slack.bot_token is not set".into());
        }
        Ok(http.get(parsed).bearer_auth(settings.bot_token.expose()))
    }
}

impl MediaAccess for SlackMedia {
    fn request<'a>(
        &'a self,
        http: &'a reqwest::Client,
        url: &'a str,
    ) -> BoxFuture<'a, Result<reqwest::RequestBuilder, String>> {
        futures::future::ready(self.request_now(http, url)).boxed()
    }
}

#[cfg(test)]
mod tests {
    use switchboard_kit::config::Secret;

    use super::*;

    #[test]
    fn only_slacks_own_files_are_fetched_and_with_the_bots_token() {
        let media = SlackMedia::new(Ok(SlackSettings {
            bot_token: Secret::new("xoxb-1"),
            ..Default::default()
        }));
        let http = reqwest::Client::new();
        let req = media
            .request_now(
                &http,
                "https://files.slack.com/files-pri/T1-F1/download/a.png",
            )
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(req.headers()["authorization"], "Bearer xoxb-1");
        for url in [
            "https://evil.example/files-pri/T1-F1/a.png",
            "http://files.slack.com/x",
            "https://files.slack.com.evil.example/x",
            "nope",
        ] {
            assert!(media.request_now(&http, url).is_err(), "{url}");
        }
    }
}
