//! Files out. Each file the agent leaves is a part of its own ([`AttachmentStyle::PartEach`]),
//! read from its signed link and uploaded by Slack's upload flow (`files.upload` is retired):
//!
//! 1. `files.getUploadURLExternal` (`filename`, `length` in bytes) announces the file and
//!    answers its id (`F…`) and the URL its bytes go to;
//! 2. the bytes are posted to that URL (`multipart/form-data`, the field `file`), answered 200;
//! 3. `files.completeUploadExternal` (`files=[{id, title}]`, `channel_id`, `thread_ts`, the
//!    part's text as `initial_comment`) shares it in the conversation, as a message of the
//!    bot's carrying the file.
//!
//! The file's id is the part's provider id. Slack's answers are read as `chat.postMessage`'s
//! are ([`read_ok`]): `ok: false` by its error, 429 waited out for its `Retry-After`.
//!
//! [`AttachmentStyle::PartEach`]: crate::egress::AttachmentStyle::PartEach
use std::time::Duration;

use serde::Deserialize;
use switchboard_kit::exports::ExportLink;

use super::send::{SlackSender, read_ok};
use crate::egress::SendError;

/// The largest file sent. Slack takes up to 1 GB, but the file is held in memory and each of
/// its requests must end within [`crate::REQUEST_TIMEOUT`]; the agent's exports are far
/// smaller (`workspace.max_export_bytes`, 5 MB by default).
pub const MAX_UPLOAD_BYTES: i64 = 100 * 1024 * 1024;

/// `files.getUploadURLExternal`'s answer.
#[derive(Deserialize)]
struct UploadTarget {
    upload_url: String,
    file_id: String,
}

/// `files.completeUploadExternal`'s answer.
#[derive(Deserialize)]
struct Completed {
    #[serde(default)]
    files: Vec<CompletedFile>,
}

#[derive(Deserialize)]
struct CompletedFile {
    id: String,
}

/// Whether a file is one Slack can take, before anything is read or sent.
fn check_size(file: &ExportLink) -> Result<(), SendError> {
    match file.size_bytes {
        0 => Err(SendError::Rejected(format!(
            "{} is empty: Slack takes no empty file",
            file.name
        ))),
        size if size > MAX_UPLOAD_BYTES => Err(SendError::Rejected(format!(
            "{} is {size} bytes; files of at most {MAX_UPLOAD_BYTES} are uploaded to Slack",
            file.name
        ))),
        _ => Ok(()),
    }
}

/// What the upload URL's answer means: 2xx took the bytes.
fn read_upload(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
    name: &str,
) -> Result<(), SendError> {
    let detail = || {
        format!(
            "Slack upload of {name}: HTTP {status} {}",
            body.chars().take(300).collect::<String>()
        )
    };
    match status {
        200..=299 => Ok(()),
        429 => Err(SendError::Throttled {
            retry_after,
            detail: detail(),
        }),
        413 => Err(SendError::Rejected(detail())),
        // Another attempt gets a new upload URL.
        _ => Err(SendError::Unavailable(detail())),
    }
}

impl SlackSender {
    /// Upload `file` and share it in `channel` (in `thread`, if given) with `comment` as its
    /// message's text; the file's id.
    pub(super) async fn send_file(
        &self,
        channel: &str,
        thread: Option<&str>,
        comment: &str,
        file: &ExportLink,
    ) -> Result<String, SendError> {
        let settings = self.settings()?;
        let token = settings.bot_token.expose();
        let bytes = self.read_export(file).await?;

        let length = bytes.len().to_string();
        let (status, retry_after, body) = self
            .call(
                self.http
                    .post(settings.method_url("files.getUploadURLExternal"))
                    .bearer_auth(token)
                    .form(&[("filename", file.name.as_str()), ("length", &length)]),
            )
            .await?;
        let target: UploadTarget = read_ok(status, retry_after, &body)?;

        let content = reqwest::multipart::Part::bytes(bytes)
            .file_name(file.name.clone())
            .mime_str(&file.content_type)
            .map_err(|e| SendError::Rejected(format!("{}: {e}", file.content_type)))?;
        // No token: the URL itself lets the bytes in (and it may be on another host).
        let resp = self
            .http
            .post(&target.upload_url)
            .multipart(reqwest::multipart::Form::new().part("file", content))
            .send()
            .await
            // Without the URL: it admits an upload until it expires.
            .map_err(|e| SendError::Unavailable(format!("Slack upload: {}", e.without_url())))?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
            .map(Duration::from_secs);
        let body = resp.text().await.unwrap_or_default();
        read_upload(status, retry_after, &body, &file.name)?;

        let mut share = serde_json::json!({
            "files": [{"id": target.file_id, "title": file.name}],
        });
        // A user's id (a DM known only by its person) goes in `channels`, which takes users.
        let key = if channel.starts_with('U') {
            "channels"
        } else {
            "channel_id"
        };
        share[key] = channel.into();
        if let Some(thread) = thread {
            share["thread_ts"] = thread.into();
        }
        if !comment.is_empty() {
            share["initial_comment"] = super::escape(comment).into();
        }
        let (status, retry_after, body) = self
            .call(
                self.http
                    .post(settings.method_url("files.completeUploadExternal"))
                    .bearer_auth(token)
                    .json(&share),
            )
            .await?;
        let completed: Completed = read_ok(status, retry_after, &body)?;
        Ok(completed
            .files
            .into_iter()
            .next()
            .map(|f| f.id)
            .unwrap_or(target.file_id))
    }

    /// The file's bytes, read from its signed link (served by the gateway).
    async fn read_export(&self, file: &ExportLink) -> Result<Vec<u8>, SendError> {
        check_size(file)?;
        // Errors never show the link: it carries its signature.
        let unreadable = |e: reqwest::Error| {
            SendError::Unavailable(format!("reading {}: {}", file.name, e.without_url()))
        };
        let resp = self.http.get(&file.url).send().await.map_err(unreadable)?;
        let status = resp.status().as_u16();
        match status {
            200..=299 => {}
            // Its bytes were deleted (or its time ran out): no later attempt finds them.
            404 | 410 => {
                return Err(SendError::Rejected(format!(
                    "{} is gone: its link answered {status}",
                    file.name
                )));
            }
            _ => {
                return Err(SendError::Unavailable(format!(
                    "reading {} from its link answered {status}",
                    file.name
                )));
            }
        }
        let bytes = resp.bytes().await.map_err(unreadable)?;
        // What the link served, which is what is announced and uploaded.
        check_size(&ExportLink {
            size_bytes: bytes.len() as i64,
            ..file.clone()
        })?;
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use switchboard_kit::config::Secret;
    use switchboard_kit::proto::Reply;

    use super::*;
    use crate::egress::{Egress, OutboundPart};
    use crate::slack::SlackSettings;

    fn link(name: &str, size_bytes: i64) -> ExportLink {
        ExportLink {
            name: name.into(),
            content_type: "text/csv".into(),
            size_bytes,
            // Nothing listens: a part refused before any request never gets here.
            url: "http://127.0.0.1:9/api/v1/exports/x".into(),
            expires_at: Utc::now(),
        }
    }

    fn sender() -> SlackSender {
        SlackSender::new(Ok(SlackSettings {
            bot_token: Secret::new("xoxb-test"),
            api_base: "http://127.0.0.1:9".into(),
            ..Default::default()
        }))
    }

    #[tokio::test]
    async fn a_part_of_two_files_or_an_empty_or_too_large_file_is_refused_before_any_request() {
        let reply = Reply {
            recipient: "T0TEAM:U0ANA".into(),
            reply_from: "C0SUPPORT:1700000000.000100".into(),
            ..Default::default()
        };
        let sender = sender();
        let two = [link("a.csv", 10), link("b.csv", 10)];
        let sent = sender
            .send(OutboundPart::new(&reply, 1, "").with_attachments(&two))
            .await;
        assert!(
            matches!(&sent, Err(SendError::Rejected(e)) if e.contains("one file, not 2")),
            "{sent:?}"
        );
        for (file, why) in [
            (link("empty.csv", 0), "empty"),
            (
                link("huge.bin", MAX_UPLOAD_BYTES + 1),
                "bytes; files of at most",
            ),
        ] {
            let files = [file];
            let sent = sender
                .send(OutboundPart::new(&reply, 1, "").with_attachments(&files))
                .await;
            assert!(
                matches!(&sent, Err(SendError::Rejected(e)) if e.contains(why)),
                "{sent:?}"
            );
        }
        // It never went out, so there is nothing to find.
        let found = sender
            .find_sent(
                OutboundPart::new(&reply, 1, "").with_attachments(&two),
                Utc::now(),
            )
            .await;
        assert_eq!(found, Ok(Vec::new()));
    }

    #[test]
    fn the_upload_urls_answer_says_whether_to_retry() {
        assert_eq!(read_upload(200, None, "OK - 12", "a.csv"), Ok(()));
        assert!(matches!(
            read_upload(429, Some(Duration::from_secs(4)), "", "a.csv"),
            Err(SendError::Throttled { retry_after: Some(d), .. }) if d == Duration::from_secs(4)
        ));
        assert!(matches!(
            read_upload(413, None, "too large", "a.csv"),
            Err(SendError::Rejected(e)) if e.contains("a.csv") && e.contains("413")
        ));
        for retried in [400, 403, 404, 500, 503] {
            assert!(
                matches!(
                    read_upload(retried, None, "", "a.csv"),
                    Err(SendError::Unavailable(_))
                ),
                "{retried}"
            );
        }
    }

    #[test]
    fn the_upload_methods_answers_read_as_chat_post_messages_do() {
        let target: UploadTarget = read_ok(
            200,
            None,
            r#"{"ok":true,"upload_url":"https://files.slack.com/upload/v1/abc","file_id":"F0AB"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (target.upload_url.as_str(), target.file_id.as_str()),
            ("https://files.slack.com/upload/v1/abc", "F0AB")
        );
        let completed: Completed = read_ok(
            200,
            None,
            r#"{"ok":true,"files":[{"id":"F0AB","title":"visits.csv"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(completed.files[0].id, "F0AB");
        assert!(matches!(
            read_ok::<Completed>(200, None, r#"{"ok":false,"error":"file_uploads_disabled"}"#),
            Err(SendError::Rejected(e)) if e.contains("file_uploads_disabled")
        ));
        assert_eq!(
            read_ok::<UploadTarget>(
                200,
                Some(Duration::from_secs(9)),
                r#"{"ok":false,"error":"ratelimited"}"#
            )
            .err(),
            Some(SendError::Throttled {
                retry_after: Some(Duration::from_secs(9)),
                detail: "Slack: ratelimited".into()
            })
        );
        assert_eq!(
            read_ok::<Completed>(
                429,
                Some(Duration::from_secs(30)),
                r#"{"ok":false,"error":"ratelimited"}"#
            )
            .err(),
            Some(SendError::Throttled {
                retry_after: Some(Duration::from_secs(30)),
                detail: "Slack HTTP 429: ratelimited".into()
            })
        );
        assert!(matches!(
            read_ok::<Completed>(200, None, r#"{"ok":false,"error":"file_not_found"}"#),
            Err(SendError::Unavailable(_))
        ));
    }
}
