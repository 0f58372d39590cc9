//! Files a person sent the bot: named `telegram-file:<file_id>` in the message, fetched when
//! the turn runs by asking `getFile` where the file is, then downloading
//! `{base}/file/bot<token>/<file_path>` (a URL that holds the token, so it is made here and
//! never stored). Bots may download files of up to 20 MB this way.
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;

use super::{FILE_SCHEME, TelegramSettings};
use crate::media::MediaAccess;

pub struct TelegramMedia {
    settings: Result<TelegramSettings, String>,
}

impl TelegramMedia {
    pub fn new(settings: Result<TelegramSettings, String>) -> Self {
        Self { settings }
    }
}

#[derive(Deserialize)]
struct Answer<T> {
    ok: bool,
    result: Option<T>,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct FileInfo {
    file_path: Option<String>,
}

/// The file id a message's media names, if it is one of ours.
fn file_id(url: &str) -> Result<&str, String> {
    url.strip_prefix(FILE_SCHEME)
        .filter(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .ok_or_else(|| "not a Telegram file id".to_string())
}

/// A file path as `getFile` gives it (`photos/file_3.jpg`): relative, no `..`, nothing that
/// would leave the bot's file area.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != ".."
                && segment != "."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
}

impl MediaAccess for TelegramMedia {
    fn request<'a>(
        &'a self,
        http: &'a reqwest::Client,
        url: &'a str,
    ) -> BoxFuture<'a, Result<reqwest::RequestBuilder, String>> {
        async move {
            let id = file_id(url)?;
            let settings = self.settings.as_ref().map_err(|e| e.clone())?;
            if settings.bot_id().is_none() {
                return Err("providers.telegram.bot_token is not set".into());
            }
            let resp = http
                .get(settings.method_url("getFile"))
                .query(&[("file_id", id)])
                .send()
                .await
                .map_err(|e| format!("getFile failed: {}", e.without_url()))?;
            let status = resp.status();
            let answer: Answer<FileInfo> = resp.json().await.map_err(|e| {
                format!("getFile answered {status} unreadably: {}", e.without_url())
            })?;
            let path = match answer {
                Answer {
                    ok: true,
                    result: Some(FileInfo { file_path: Some(p) }),
                    ..
                } => p,
                Answer { description, .. } => {
                    return Err(format!("getFile answered {status}: {description}"));
                }
            };
            if !safe_path(&path) {
                return Err("getFile gave an unexpected file path".into());
            }
            Ok(http.get(format!(
                "{}/file/bot{}/{path}",
                settings.base(),
                settings.bot_token.expose()
            )))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_file_ids_and_plain_relative_paths_are_fetched() {
        assert_eq!(file_id("telegram-file:AgAC-x_1"), Ok("AgAC-x_1"));
        for bad in [
            "telegram-file:",
            "telegram-file:a/b",
            "https://evil.example/x",
            "telegram-file:a?b",
        ] {
            assert!(file_id(bad).is_err(), "{bad}");
        }
        assert!(safe_path("photos/file_3.jpg"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a?b",
            "a b",
        ] {
            assert!(!safe_path(bad), "{bad}");
        }
    }
}
