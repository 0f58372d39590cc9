//! Twilio's MMS media: fetched only from the Twilio API's own origin (`twilio.api_base`), with
//! the account's credentials (its media URLs require them when "HTTP auth on media" is on).
use futures::FutureExt as _;
use futures::future::BoxFuture;
use switchboard_kit::config::{Secret, TwilioConfig};

use crate::media::MediaAccess;

pub struct TwilioMedia {
    /// `scheme://host:port` of the Twilio API: the only origin fetched from.
    origin: Option<url::Url>,
    account_sid: String,
    auth_token: Secret,
}

impl TwilioMedia {
    pub fn new(config: &TwilioConfig) -> Self {
        Self {
            origin: url::Url::parse(&config.api_base).ok(),
            account_sid: config.account_sid.clone(),
            auth_token: config.auth_token.clone(),
        }
    }
}

impl MediaAccess for TwilioMedia {
    fn request<'a>(
        &'a self,
        http: &'a reqwest::Client,
        url: &'a str,
    ) -> BoxFuture<'a, Result<reqwest::RequestBuilder, String>> {
        futures::future::ready(self.request_now(http, url)).boxed()
    }
}

impl TwilioMedia {
    /// Twilio names its media by URL: nothing to ask before fetching it.
    fn request_now(
        &self,
        http: &reqwest::Client,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, String> {
        let parsed = url::Url::parse(url).map_err(|_| "not a URL".to_string())?;
        let same_origin = self
            .origin
            .as_ref()
            .is_some_and(|o| o.origin() == parsed.origin());
        if !same_origin {
            return Err("not from the provider's media API".into());
        }
        let req = http.get(parsed);
        Ok(if self.account_sid.is_empty() {
            req
        } else {
            req.basic_auth(&self.account_sid, Some(self.auth_token.expose()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn media() -> TwilioMedia {
        TwilioMedia::new(&TwilioConfig {
            account_sid: "AC1".into(),
            auth_token: Secret::new("token"),
            api_base: "https://api.twilio.com".into(),
            ..Default::default()
        })
    }

    #[test]
    fn media_of_the_twilio_api_is_fetched_with_the_accounts_credentials() {
        let req = media()
            .request_now(
                &reqwest::Client::new(),
                "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1",
            )
            .expect("Twilio's own media")
            .build()
            .unwrap();
        let auth = req.headers()["authorization"].to_str().unwrap();
        assert_eq!(auth, "Basic QUMxOnRva2Vu", "AC1:token");
    }

    #[test]
    fn a_url_of_another_origin_is_never_fetched() {
        for url in [
            "https://evil.example/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1",
            "http://api.twilio.com/x",
            "https://api.twilio.com:8443/x",
            "not a url",
        ] {
            assert!(
                media().request_now(&reqwest::Client::new(), url).is_err(),
                "{url}"
            );
        }
    }
}
