//! Media a person sent (Twilio MMS `MediaUrlN`, chat uploads) kept in the session's
//! workspace (`attachments/`), so the agent can open them, and listed in the prompt.
//!
//! Fetched as the message's provider says (its channel adapter's `MediaAccess`: Twilio's
//! credentials, and only from the Twilio API's own origin): a URL in a message is never
//! fetched blindly, and a provider without media access has none fetched. Each file is capped (`workspace.max_attachment_bytes`);
//! one over the cap is not kept and the prompt says so. Fetched at the turn's first run; a
//! file already there (a retried turn) is not fetched again.
//!
//! The workspace is the agent's: `attachments/` is opened without following links (a link in
//! its place is refused), only regular files count as kept, and each file is written through a
//! temporary file of its own, created exclusively under a random name (`switchboard_kit::
//! workspace_fs`), so nothing planted there is written through.
use std::path::{Path, PathBuf};
use std::time::Duration;

use switchboard_channels::MediaSources;
use switchboard_kit::workspace_fs::{WorkspaceDir, WorkspaceFileError};

/// What became of one media URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// Kept as `file` (a name in `attachments/`).
    Kept {
        file: String,
        content_type: String,
        bytes: u64,
    },
    /// Larger than the cap: not kept.
    TooLarge { limit: u64 },
    /// Not from the provider's API, or it could not be fetched.
    NotKept { why: String },
}

impl Fetched {
    /// The prompt's line for it.
    pub fn describe(&self) -> String {
        match self {
            Fetched::Kept {
                file,
                content_type,
                bytes,
            } => format!("attachments/{file} ({content_type}, {})", size(*bytes)),
            Fetched::TooLarge { limit } => {
                format!("an attachment larger than {} (not kept)", size(*limit))
            }
            Fetched::NotKept { why } => format!("an attachment that could not be kept ({why})"),
        }
    }
}

fn size(bytes: u64) -> String {
    match bytes {
        0..1_024 => format!("{bytes} B"),
        1_024..1_048_576 => format!("{} KB", bytes / 1_024),
        _ => format!("{:.1} MB", bytes as f64 / 1_048_576.0),
    }
}

/// A file extension for a content type (what an agent's tools go by).
fn extension(content_type: &str) -> &'static str {
    match content_type.split(';').next().unwrap_or("").trim() {
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/heic" => "heic",
        "video/mp4" => "mp4",
        "video/3gpp" => "3gp",
        "audio/mpeg" => "mp3",
        "audio/ogg" => "ogg",
        "audio/amr" => "amr",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "text/vcard" | "text/x-vcard" => "vcf",
        _ => "bin",
    }
}

pub struct MediaFetcher {
    http: reqwest::Client,
    /// Each provider's media access (the channel adapters').
    sources: MediaSources,
    max_bytes: u64,
}

impl MediaFetcher {
    pub fn new(sources: MediaSources, max_bytes: u64) -> Self {
        Self {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(60))
                .build()
                .expect("HTTP client"),
            sources,
            max_bytes,
        }
    }

    /// The same fetcher over `sources`.
    pub fn with_sources(self, sources: MediaSources) -> Self {
        Self { sources, ..self }
    }

    /// Keep each of `urls` (media of a message `provider` took) in `folder/attachments/` as
    /// `<message id>-<n>.<ext>`.
    pub async fn keep(
        &self,
        folder: &Path,
        provider: &str,
        message_id: &str,
        urls: &[String],
    ) -> Vec<Fetched> {
        let mut out = Vec::with_capacity(urls.len());
        for (n, url) in urls.iter().enumerate() {
            let stem = format!("{message_id}-{n}");
            out.push(match self.keep_one(folder, provider, &stem, url).await {
                Ok(f) => f,
                Err(why) => {
                    tracing::warn!(%message_id, n, %why, "attachment not kept");
                    Fetched::NotKept { why }
                }
            });
        }
        out
    }

    async fn keep_one(
        &self,
        folder: &Path,
        provider: &str,
        stem: &str,
        url: &str,
    ) -> Result<Fetched, String> {
        if let Some(kept) = already_kept(folder, stem).await {
            return Ok(kept);
        }
        let access = self
            .sources
            .get(provider)
            .ok_or_else(|| format!("{provider} messages carry no media this product fetches"))?;
        let req = access.request(&self.http, url).await?;
        let mut resp = req.send().await.map_err(|e| format!("fetch failed: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("the provider answered {}", resp.status().as_u16()));
        }
        if resp.content_length().is_some_and(|n| n > self.max_bytes) {
            return Ok(Fetched::TooLarge {
                limit: self.max_bytes,
            });
        }
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_string();
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("fetch failed: {e}"))?
        {
            if (body.len() + chunk.len()) as u64 > self.max_bytes {
                return Ok(Fetched::TooLarge {
                    limit: self.max_bytes,
                });
            }
            body.extend_from_slice(&chunk);
        }
        let file = format!("{stem}.{}", extension(&content_type));
        let bytes = body.len() as u64;
        write_atomically(folder, &file, body)
            .await
            .map_err(|e| format!("could not write it: {e}"))?;
        Ok(Fetched::Kept {
            file,
            content_type,
            bytes,
        })
    }
}

/// Files chat users uploaded (`POST /chat/uploads`, stored by the gateway in
/// `switchboard.chat_uploads`), copied into `attachments/` as `<message id>-<n>-<name>` when
/// their message's turn runs. Only the sender's own uploads are copied (the gateway checked
/// that already; this holds even for a message that reached the pipeline another way), the
/// same cap as media applies, and a file already there (a retried turn) is not read again.
pub struct Uploads {
    db: sqlx::PgPool,
    max_bytes: u64,
}

struct UploadRow {
    id: uuid::Uuid,
    name: String,
    content_type: String,
    bytes: i64,
}

impl Uploads {
    pub fn new(db: sqlx::PgPool, max_bytes: u64) -> Self {
        Self { db, max_bytes }
    }

    /// Keep each of `ids` (uploads of `owner`) in `folder/attachments/`, numbered from
    /// `first`. A database error is returned (the turn is tried again), not swallowed: the
    /// file would otherwise be missing from a turn that could have had it.
    pub async fn keep(
        &self,
        folder: &Path,
        message_id: &str,
        owner: &str,
        ids: &[String],
        first: usize,
    ) -> Result<Vec<Fetched>, sqlx::Error> {
        let parsed: Vec<Option<uuid::Uuid>> = ids.iter().map(|i| i.parse().ok()).collect();
        let wanted: Vec<uuid::Uuid> = parsed.iter().flatten().copied().collect();
        let rows = sqlx::query_as!(
            UploadRow,
            "SELECT id, name, content_type, bytes FROM switchboard.chat_uploads
              WHERE id = ANY($1) AND owner = $2",
            &wanted,
            owner,
        )
        .fetch_all(&self.db)
        .await?;
        let mut out = Vec::with_capacity(ids.len());
        for (n, id) in parsed.iter().enumerate() {
            let row = id.and_then(|id| rows.iter().find(|r| r.id == id));
            let stem = format!("{message_id}-{}-", first + n);
            // Kept by an earlier run of this turn: not read again (the upload may be gone by
            // now, its retention over).
            if let Some((file, bytes)) = kept_with_prefix(folder, &stem).await {
                let content_type =
                    row.map_or_else(|| type_of(&file).to_string(), |r| r.content_type.clone());
                out.push(Fetched::Kept {
                    file,
                    content_type,
                    bytes,
                });
                continue;
            }
            let Some(row) = row else {
                out.push(Fetched::NotKept {
                    why: "not an upload of this person's, or deleted after its retention".into(),
                });
                continue;
            };
            let bytes = row.bytes.max(0) as u64;
            if bytes > self.max_bytes {
                out.push(Fetched::TooLarge {
                    limit: self.max_bytes,
                });
                continue;
            }
            let data = sqlx::query_scalar!(
                "SELECT data FROM switchboard.chat_uploads WHERE id = $1 AND owner = $2",
                row.id,
                owner,
            )
            .fetch_optional(&self.db)
            .await?;
            let Some(data) = data else {
                out.push(Fetched::NotKept {
                    why: "deleted after its retention".into(),
                });
                continue;
            };
            let file = format!("{stem}{}", row.name);
            if let Err(e) = write_atomically(folder, &file, data).await {
                tracing::warn!(%message_id, n, error = %e, "upload not kept");
                out.push(Fetched::NotKept {
                    why: format!("could not write it: {e}"),
                });
                continue;
            }
            out.push(Fetched::Kept {
                file,
                content_type: row.content_type.clone(),
                bytes,
            });
        }
        Ok(out)
    }
}

/// The regular files in the workspace's `attachments/` (none when it is missing, or when
/// something other than a folder is in its place), with their sizes.
async fn kept_files(folder: &Path) -> Vec<(String, u64)> {
    let folder = folder.to_path_buf();
    let listed = tokio::task::spawn_blocking(move || {
        WorkspaceDir::open(&folder)?
            .dir("attachments", false)?
            .regular_files()
    })
    .await;
    match listed {
        Ok(Ok(files)) => files,
        Ok(Err(e)) => {
            if e.is_refusal() {
                tracing::warn!(error = %e, "attachments/ refused");
            }
            Vec::new()
        }
        Err(_) => Vec::new(),
    }
}

/// A file in `attachments/` whose name starts with `prefix`: its name and size.
async fn kept_with_prefix(folder: &Path, prefix: &str) -> Option<(String, u64)> {
    kept_files(folder)
        .await
        .into_iter()
        .find(|(name, _)| name.starts_with(prefix))
}

/// A media type for a kept file, by its extension.
fn type_of(file: &str) -> &'static str {
    match file.rsplit('.').next() {
        Some("jpg") => "image/jpeg",
        Some("png") => "image/png",
        Some("gif") => "image/gif",
        Some("pdf") => "application/pdf",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    }
}

/// A file kept by an earlier run of the same turn.
async fn already_kept(folder: &Path, stem: &str) -> Option<Fetched> {
    let (file, bytes) = kept_files(folder).await.into_iter().find(|(name, _)| {
        name.strip_prefix(stem)
            .is_some_and(|rest| rest.starts_with('.'))
    })?;
    let content_type = type_of(&file);
    Some(Fetched::Kept {
        file,
        content_type: content_type.into(),
        bytes,
    })
}

/// Put `body` in `attachments/` as `file` (the folder made if missing).
async fn write_atomically(
    folder: &Path,
    file: &str,
    body: Vec<u8>,
) -> Result<(), WorkspaceFileError> {
    let (folder, file) = (folder.to_path_buf(), file.to_string());
    tokio::task::spawn_blocking(move || {
        WorkspaceDir::open(&folder)?
            .dir("attachments", true)?
            .write(&file, &body)
    })
    .await
    .unwrap_or_else(|e| {
        Err(WorkspaceFileError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })
}

impl crate::TurnDispatcher {
    /// Keep what the messages carry besides text in the session's workspace; the prompt's
    /// lines for it.
    pub(crate) async fn keep_attachments(
        &self,
        group: &[switchboard_kit::proto::Turn],
        workspace: Option<&str>,
    ) -> Result<Vec<String>, crate::DispatchError> {
        let mut lines = Vec::new();
        for turn in group {
            let Some(inbound) = turn.message.as_ref().and_then(|m| m.inbound.as_ref()) else {
                continue;
            };
            let count = inbound.media_urls.len() + inbound.uploads.len();
            if count == 0 {
                continue;
            }
            let Some(folder) = workspace.map(Path::new) else {
                lines.push(format!(
                    "{count} attachment(s) not kept: no workspace is configured"
                ));
                continue;
            };
            if !inbound.media_urls.is_empty() {
                let kept = self
                    .media
                    .keep(folder, &inbound.provider, &inbound.id, &inbound.media_urls)
                    .await;
                lines.extend(kept.iter().map(Fetched::describe));
            }
            if !inbound.uploads.is_empty() {
                let kept = self
                    .uploads
                    .keep(
                        folder,
                        &inbound.id,
                        &inbound.sender,
                        &inbound.uploads,
                        inbound.media_urls.len(),
                    )
                    .await?;
                lines.extend(kept.iter().map(Fetched::describe));
            }
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_types_read_the_way_a_person_would_say_them() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(20_480), "20 KB");
        assert_eq!(size(3 * 1_048_576 + 524_288), "3.5 MB");
        assert_eq!(extension("image/jpeg"), "jpg");
        assert_eq!(extension("text/plain; charset=utf-8"), "txt");
        assert_eq!(extension("application/x-unknown"), "bin");
    }

    fn fetcher() -> MediaFetcher {
        let mut config = switchboard_kit::config::Config::default();
        config.twilio.api_base = "https://api.twilio.com".into();
        config.twilio.account_sid = "AC1".into();
        MediaFetcher::new(
            switchboard_channels::Channels::product().media(&config),
            1_000,
        )
    }

    #[tokio::test]
    async fn a_url_from_anywhere_but_the_providers_api_is_not_fetched() {
        let dir = std::env::temp_dir().join(format!("sb-att-{}", uuid::Uuid::new_v4()));
        let metadata = ["http://169.254.169.254/latest/meta-data".to_string()];
        let got = fetcher().keep(&dir, "twilio", "m", &metadata).await;
        assert_eq!(
            got,
            [Fetched::NotKept {
                why: "not from the provider's media API".into()
            }]
        );
        // A provider without media access has nothing fetched, whatever the URL.
        let twilios =
            ["https://api.twilio.com/2010-04-01/Accounts/AC1/Messages/MM1/Media/ME1".to_string()];
        let got = fetcher().keep(&dir, "textmagic", "m", &twilios).await;
        assert!(
            matches!(&got[..], [Fetched::NotKept { why }] if why.contains("textmagic")),
            "{got:?}"
        );
    }
}
