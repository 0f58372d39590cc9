//! Media a person sent: `whatsapp-media:<id>` in the message; when the turn runs the Graph API
//! is asked for the id's short-lived URL, which is fetched with the access token. The token is
//! sent only to Meta's own hosts (or the configured API's origin, a fake in tests).
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::{MEDIA_SCHEME, WhatsAppSettings};
use crate::media::MediaAccess;

pub struct WhatsAppMedia {
    settings: Result<WhatsAppSettings, String>,
}

#[derive(Deserialize)]
struct MediaUrl {
    url: String,
}

impl WhatsAppMedia {
    pub fn new(settings: Result<WhatsAppSettings, String>) -> Self {
        Self { settings }
    }
}

/// Whether the token may go to `url`: Meta's media hosts over HTTPS, or the API's own origin.
fn trusted(url: &url::Url, api_base: &str) -> bool {
    let meta = url.scheme() == "https"
        && url.host_str().is_some_and(|h| {
            ["fbsbx.com", "facebook.com", "whatsapp.net", "fbcdn.net"]
                .iter()
                .any(|d| h == *d || h.ends_with(&format!(".{d}")))
        });
    let api = url::Url::parse(api_base).is_ok_and(|base| base.origin() == url.origin());
    meta || api
}

impl MediaAccess for WhatsAppMedia {
    fn request<'a>(
        &'a self,
        http: &'a reqwest::Client,
        url: &'a str,
    ) -> BoxFuture<'a, Result<reqwest::RequestBuilder, String>> {
        async move {
            let id = url
                .strip_prefix(MEDIA_SCHEME)
                .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()))
                .ok_or("not a WhatsApp media id")?;
            let settings = self.settings.as_ref().map_err(|e| e.clone())?;
            if settings.access_token.is_empty() {
                return Err("providers.whatsapp.access_token is not set".into());
            }
            let resp = http
                .get(settings.graph_url(id))
                .bearer_auth(settings.access_token.expose())
                .send()
                .await
                .map_err(|e| format!("asking for the media's URL failed: {e}"))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(format!("the Graph API answered {status} for the media id"));
            }
            let found: MediaUrl = resp
                .json()
                .await
                .map_err(|e| format!("unreadable media answer: {e}"))?;
            let parsed = url::Url::parse(&found.url).map_err(|_| "the media URL is not a URL")?;
            if !trusted(&parsed, settings.base()) {
                return Err("the media URL is not Meta's".into());
            }
            Ok(http.get(parsed).bearer_auth(settings.access_token.expose()))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_only_to_metas_hosts_or_the_apis_origin() {
        let base = "https://graph.facebook.com";
        let ok = |u: &str| trusted(&url::Url::parse(u).unwrap(), base);
        assert!(ok(
            "https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1"
        ));
        assert!(ok("https://graph.facebook.com/v21.0/1"));
        assert!(!ok("http://lookaside.fbsbx.com/x"));
        assert!(!ok("https://fbsbx.com.evil.example/x"));
        assert!(!ok("https://evil.example/x"));
        assert!(trusted(
            &url::Url::parse("http://127.0.0.1:9/whatsapp_business/attachments/?mid=1").unwrap(),
            "http://127.0.0.1:9"
        ));
    }
}
