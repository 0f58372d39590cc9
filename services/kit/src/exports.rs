//! Files an agent leaves in its session's `exports/` for the person (seed 000 §12: "reports,
//! CSVs, generated documents"), and the links that reach them.
//!
//! After each answered runner call, dispatch reads the regular files of `exports/` that were
//! not sent before (by name and content: a file the agent changes is sent again), through
//! [`crate::workspace_fs`] (no links, no hard links, no FIFOs, capped), and keeps their bytes
//! in Postgres (`switchboard.exports`) with the turn's reply. The deliverer sends each as the
//! channel can: MMS media on Twilio, a link in the text on TextMagic, an `attachments` list
//! on chat, the API and generic webhooks.
//!
//! A link is the file's capability: `{public_url}/api/v1/exports/<id>/<name>?exp=<unix
//! seconds>&sig=<hex>`, where `sig` is an HMAC-SHA256 of the id and expiry under a key
//! derived from the turn-token secret ([`crate::turn_token::shared_secret`]), so every replica
//! signs and checks alike without configuration. It expires with the file
//! (`workspace.export_ttl_s`); a forged or altered link is refused, an expired one is gone.
//! Twilio fetches MMS media without credentials, so nothing but the signature guards it.
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

use crate::workspace_fs::{WorkspaceDir, WorkspaceFileError};

/// The folder of the workspace whose files go to the person.
pub const EXPORTS_DIR: &str = "exports";

/// The route a link names (`/api/v1/exports/<id>/<name>`).
pub const ROUTE_PREFIX: &str = "/api/v1/exports";

/// One sent file as a reply carries it to the channel: what the person sees and the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportLink {
    pub name: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub url: String,
    pub expires_at: DateTime<Utc>,
}

/// One file read from `exports/`, ready to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFile {
    /// Its name in `exports/` (what "sent before" is remembered by).
    pub file: String,
    /// The name the person sees: [`display_name`] of it.
    pub name: String,
    pub content_type: &'static str,
    pub sha256: String,
    pub data: Vec<u8>,
}

/// A file of `exports/` that was not read, and why (the reply tells the person).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotExported {
    pub file: String,
    pub bytes: u64,
    /// What it is remembered by, in place of its content's SHA-256 ([`unread_key`]).
    pub key: String,
    pub why: String,
}

/// What [`read_exports`] found.
#[derive(Debug, Default)]
pub struct ReadExports {
    pub files: Vec<ExportFile>,
    pub refused: Vec<NotExported>,
}

/// Which files of `exports/` to read.
#[derive(Debug, Clone)]
pub struct ExportScan {
    pub max_files: usize,
    pub max_bytes: u64,
    /// Only files changed at or after this (a session shared by several people sends only
    /// what the agent wrote while this turn ran); `None`: any.
    pub changed_since: Option<SystemTime>,
}

/// The files of `folder/exports/` not in `sent` (names with their SHA-256, as sent before),
/// by name, at most `scan.max_files`; names starting with `.` (an editor's temporary file)
/// are not the agent's output. A file over the cap or refused by [`WorkspaceDir::read`] is
/// listed in `refused` once per content, like a sent one.
pub fn read_exports(
    folder: &std::path::Path,
    scan: &ExportScan,
    sent: &dyn Fn(&str, &str) -> bool,
) -> Result<ReadExports, WorkspaceFileError> {
    use sha2::Digest as _;
    let dir = match WorkspaceDir::open(folder)?.dir(EXPORTS_DIR, false) {
        Ok(dir) => dir,
        Err(WorkspaceFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(ReadExports::default());
        }
        Err(e) => return Err(e),
    };
    let mut out = ReadExports::default();
    for listed in dir.listed_files()? {
        if out.files.len() >= scan.max_files {
            break;
        }
        if listed.name.starts_with('.') {
            continue;
        }
        if scan.changed_since.is_some_and(|t| listed.modified < t) {
            continue;
        }
        // A file over the cap is refused once per size and time: its content is never read.
        let unread_key = unread_key(listed.bytes, listed.modified);
        if listed.bytes > scan.max_bytes {
            if !sent(&listed.name, &unread_key) {
                out.refused.push(NotExported {
                    file: listed.name,
                    bytes: listed.bytes,
                    key: unread_key,
                    why: format!("larger than {}", human_size(scan.max_bytes)),
                });
            }
            continue;
        }
        match dir.read(&listed.name, scan.max_bytes) {
            Ok(Some(data)) => {
                let sha256 = hex::encode(sha2::Sha256::digest(&data));
                if sent(&listed.name, &sha256) {
                    continue;
                }
                out.files.push(ExportFile {
                    name: display_name(&listed.name),
                    content_type: content_type_for(&listed.name),
                    file: listed.name,
                    sha256,
                    data,
                });
            }
            // Gone since it was listed.
            Ok(None) => {}
            Err(e) if e.is_refusal() => {
                if !sent(&listed.name, &unread_key) {
                    out.refused.push(NotExported {
                        file: listed.name,
                        bytes: listed.bytes,
                        key: unread_key,
                        why: refusal_words(&e),
                    });
                }
            }
            Err(e) => return Err(e),
        }
    }
    // A link, a FIFO or a device is not the agent's file to send: named to the person once
    // (by what it is), never opened.
    for (name, kind) in dir.listed_others()? {
        if name.starts_with('.') || out.refused.len() + out.files.len() >= scan.max_files {
            continue;
        }
        let key = format!("not-a-file:{kind}");
        if !sent(&name, &key) {
            out.refused.push(NotExported {
                file: name,
                bytes: 0,
                key,
                why: match kind {
                    "link" => "a link, not a file".into(),
                    other => format!("a {other}, not a file"),
                },
            });
        }
    }
    Ok(out)
}

/// The names of the files in `folder/exports/`, and of the links and the like there (none: it
/// has no such folder).
pub fn export_names(folder: &std::path::Path) -> Result<Vec<String>, WorkspaceFileError> {
    match WorkspaceDir::open(folder)?.dir(EXPORTS_DIR, false) {
        // Links and FIFOs too: they are named to the person once, which is remembered by name.
        Ok(dir) => Ok(dir
            .listed_files()?
            .into_iter()
            .map(|f| f.name)
            .chain(dir.listed_others()?.into_iter().map(|(name, _)| name))
            .filter(|n| !n.starts_with('.'))
            .collect()),
        Err(WorkspaceFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(Vec::new())
        }
        Err(e) => Err(e),
    }
}

/// Why a file was not sent, in the words the person reads ("Not sent: x (…)").
fn refusal_words(e: &WorkspaceFileError) -> String {
    match e {
        WorkspaceFileError::Link(_) => "a link, not a file".into(),
        WorkspaceFileError::HardLinked { .. } => "a hard link, not a file of its own".into(),
        WorkspaceFileError::NotRegular { kind, .. } => format!("a {kind}, not a file"),
        WorkspaceFileError::TooLarge { cap, .. } => format!("larger than {}", human_size(*cap)),
        other => other.reason().replace('_', " "),
    }
}

/// A size as the person and the agent read it (`900 B`, `12 KB`, `5.0 MB`).
pub fn human_size(bytes: u64) -> String {
    match bytes {
        0..1_024 => format!("{bytes} B"),
        1_024..1_048_576 => format!("{} KB", bytes / 1_024),
        _ => format!("{:.1} MB", bytes as f64 / 1_048_576.0),
    }
}

/// What [`read_exports`] remembers a refused file by, in place of its content's SHA-256.
pub fn unread_key(bytes: u64, modified: SystemTime) -> String {
    format!("unread:{bytes}:{modified:?}")
}

/// A file name safe in a URL path, a header and a message ([`crate::file_names::safe_file_name`]).
pub fn display_name(file: &str) -> String {
    crate::file_names::safe_file_name(file, "file")
}

/// The content type a file is served with, by its extension. Only types a browser shows
/// without running anything are named; everything else (HTML, SVG, scripts) is
/// `application/octet-stream`, served as a download: the agent's files are untrusted, and
/// the link is on the gateway's origin.
pub fn content_type_for(file: &str) -> &'static str {
    let ext = file
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "md" | "log" => "text/plain",
        "csv" => "text/csv",
        "json" => "application/json",
        "ics" => "text/calendar",
        "vcf" => "text/vcard",
        "mp3" => "audio/mpeg",
        "ogg" => "audio/ogg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        "zip" => "application/zip",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        _ => "application/octet-stream",
    }
}

/// Whether a browser may show a file of this type in place (else it is a download).
pub fn shown_inline(content_type: &str) -> bool {
    content_type.starts_with("image/")
        || content_type.starts_with("audio/")
        || content_type.starts_with("video/")
        || matches!(content_type, "application/pdf" | "text/plain" | "text/csv")
}

/// Why a link was not honoured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefused {
    #[error("the link's signature does not verify (altered, or not made by this Switchboard)")]
    Forged,
    #[error("the link has expired")]
    Expired,
}

/// Signs and checks export links with one key.
#[derive(Clone)]
pub struct ExportLinks {
    key: [u8; 32],
    /// `gateway.public_url` without its trailing `/`.
    base: String,
}

impl std::fmt::Debug for ExportLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportLinks")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

type HmacSha256 = Hmac<Sha256>;

impl ExportLinks {
    /// Links under `public_url`, signed with a key derived from `secret` (a link key is never
    /// the turn tokens' key itself).
    pub fn from_secret(secret: &[u8], public_url: &str) -> Self {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"switchboard export links v1");
        Self {
            key: mac.finalize().into_bytes().into(),
            base: public_url.trim_end_matches('/').to_string(),
        }
    }

    fn signature(&self, id: Uuid, exp: i64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(format!("{id}\n{exp}").as_bytes());
        mac
    }

    /// The link to export `id` (named `name`), working until `expires_at`.
    pub fn link(
        &self,
        id: Uuid,
        name: &str,
        content_type: &str,
        size_bytes: i64,
        expires_at: DateTime<Utc>,
    ) -> ExportLink {
        let exp = expires_at.timestamp();
        let sig = hex::encode(self.signature(id, exp).finalize().into_bytes());
        ExportLink {
            name: name.to_string(),
            content_type: content_type.to_string(),
            size_bytes,
            url: format!(
                "{}{ROUTE_PREFIX}/{id}/{}?exp={exp}&sig={sig}",
                self.base,
                display_name(name)
            ),
            expires_at,
        }
    }

    /// Whether `sig` is this Switchboard's signature of (`id`, `exp`), and `exp` is not past.
    /// The signature is compared in constant time and checked first: an altered expiry is
    /// forged, not expired.
    pub fn verify(
        &self,
        id: Uuid,
        exp: i64,
        sig: &str,
        now: DateTime<Utc>,
    ) -> Result<(), LinkRefused> {
        let sig = hex::decode(sig).map_err(|_| LinkRefused::Forged)?;
        self.signature(id, exp)
            .verify_slice(&sig)
            .map_err(|_| LinkRefused::Forged)?;
        if now.timestamp() >= exp {
            return Err(LinkRefused::Expired);
        }
        Ok(())
    }
}

/// [`ExportLinks`] loaded on first use (the key may live in Postgres), shared by clones.
#[derive(Clone)]
pub struct ExportLinkKeys {
    db: sqlx::PgPool,
    configured: crate::config::Secret,
    public_url: String,
    loaded: std::sync::Arc<tokio::sync::OnceCell<ExportLinks>>,
}

impl ExportLinkKeys {
    /// As `config` says: `gateway.public_url`, and `gateway.turn_token_secret` or the secret
    /// kept in Postgres.
    pub fn new(db: sqlx::PgPool, config: &crate::config::Config) -> Self {
        Self {
            db,
            configured: config.gateway.turn_token_secret.clone(),
            public_url: config.gateway.public_url.clone(),
            loaded: Default::default(),
        }
    }

    pub async fn get(&self) -> Result<&ExportLinks, sqlx::Error> {
        self.loaded
            .get_or_try_init(|| async {
                let secret = crate::turn_token::shared_secret(&self.db, &self.configured).await?;
                Ok(ExportLinks::from_secret(&secret, &self.public_url))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> ExportLinks {
        ExportLinks::from_secret(b"a secret of thirty-two bytes....", "https://sb.example/")
    }

    fn query(url: &str) -> (Uuid, String, i64, String) {
        let url = url::Url::parse(url).unwrap();
        let mut path = url.path_segments().unwrap().skip(3);
        let id = path.next().unwrap().parse().unwrap();
        let name = path.next().unwrap().to_string();
        let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        (id, name, q["exp"].parse().unwrap(), q["sig"].clone())
    }

    #[test]
    fn a_link_verifies_until_it_expires_and_not_once_altered() {
        let (links, id) = (links(), Uuid::now_v7());
        let now = Utc::now();
        let link = links.link(
            id,
            "Q3 report.pdf",
            "application/pdf",
            10,
            now + chrono::Duration::hours(1),
        );
        assert!(
            link.url.starts_with("https://sb.example/api/v1/exports/"),
            "{}",
            link.url
        );
        let (got, name, exp, sig) = query(&link.url);
        assert_eq!((got, name.as_str()), (id, "Q3_report.pdf"));
        assert_eq!(links.verify(id, exp, &sig, now), Ok(()));
        assert_eq!(
            links.verify(id, exp, &sig, now + chrono::Duration::hours(2)),
            Err(LinkRefused::Expired)
        );
        // Extending the expiry, naming another file, or another Switchboard's key: forged.
        assert_eq!(
            links.verify(id, exp + 3_600, &sig, now),
            Err(LinkRefused::Forged)
        );
        assert_eq!(
            links.verify(Uuid::now_v7(), exp, &sig, now),
            Err(LinkRefused::Forged)
        );
        let other = ExportLinks::from_secret(b"another secret of 32 bytes......", "https://x/");
        assert_eq!(other.verify(id, exp, &sig, now), Err(LinkRefused::Forged));
        assert_eq!(links.verify(id, exp, "zz", now), Err(LinkRefused::Forged));
        // The turn tokens' secret is not the links' key.
        let raw = ExportLinks {
            key: *b"a secret of thirty-two bytes....",
            base: String::new(),
        };
        assert_eq!(raw.verify(id, exp, &sig, now), Err(LinkRefused::Forged));
    }

    #[test]
    fn only_types_a_browser_shows_without_running_anything_are_served_as_such() {
        assert_eq!(content_type_for("photo.JPG"), "image/jpeg");
        assert_eq!(content_type_for("rota.csv"), "text/csv");
        assert_eq!(content_type_for("page.html"), "application/octet-stream");
        assert_eq!(content_type_for("logo.svg"), "application/octet-stream");
        assert_eq!(content_type_for("noextension"), "application/octet-stream");
        assert!(shown_inline("image/png") && !shown_inline("application/octet-stream"));
        // A path is never a name: only its last part is kept.
        assert_eq!(display_name("../../etc/passwd"), "passwd");
        assert_eq!(display_name("...."), "file");
        assert_eq!(display_name("шифр.txt"), "____.txt");
    }

    #[test]
    fn new_and_changed_files_are_read_once_and_links_or_huge_files_never() {
        let root = scratch();
        let exports = root.join(EXPORTS_DIR);
        std::fs::create_dir(&exports).unwrap();
        std::fs::write(exports.join("a.csv"), "x,y\n").unwrap();
        std::fs::write(exports.join("big.bin"), vec![0u8; 64]).unwrap();
        std::fs::write(exports.join(".draft.swp"), "tmp").unwrap();
        std::fs::write(root.join("secret.txt"), "not for export").unwrap();
        std::os::unix::fs::symlink(root.join("secret.txt"), exports.join("link.txt")).unwrap();
        std::fs::hard_link(root.join("secret.txt"), exports.join("hard.txt")).unwrap();
        let scan = ExportScan {
            max_files: 10,
            max_bytes: 32,
            changed_since: None,
        };
        let read = read_exports(&root, &scan, &|_, _| false).unwrap();
        let names: Vec<_> = read.files.iter().map(|f| f.file.as_str()).collect();
        assert_eq!(
            names,
            ["a.csv"],
            "the link and the dot-file are not the agent's output"
        );
        assert_eq!(read.files[0].data, b"x,y\n");
        let refused: Vec<_> = read.refused.iter().map(|f| f.file.as_str()).collect();
        assert_eq!(refused, ["big.bin", "hard.txt", "link.txt"]);
        assert_eq!(read.refused[2].why, "a link, not a file");
        // Sent before, with that content: not again; changed: again.
        let sha = read.files[0].sha256.clone();
        let again = read_exports(&root, &scan, &|f, s| f == "a.csv" && s == sha).unwrap();
        assert!(again.files.is_empty());
        std::fs::write(exports.join("a.csv"), "x,y\n1,2\n").unwrap();
        let changed = read_exports(&root, &scan, &|f, s| f == "a.csv" && s == sha).unwrap();
        assert_eq!(changed.files.len(), 1);
        // A workspace without exports/ has nothing to send.
        let bare = scratch();
        assert!(
            read_exports(&bare, &scan, &|_, _| false)
                .unwrap()
                .files
                .is_empty()
        );
        let _ = std::fs::remove_dir_all(root);
        let _ = std::fs::remove_dir_all(bare);
    }

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sb-exports-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
