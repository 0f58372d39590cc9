//! Files the agent left in `exports/` during a turn, kept for the person with the turn's reply
//! ([`switchboard_kit::exports`] says what is read and how it reaches them).
//!
//! Read after the runner's answer and staged in `switchboard.exports` under this call's reply
//! id; the turn's commit marks them committed in the same statement ([`crate::settler`]). So a
//! call whose answer does not stand (it lost its slot, the dispatcher died before the commit)
//! leaves rows nobody serves, and the call that does answer reads the files again: nothing is
//! lost and nothing sent twice. What a committed row names (workspace, file, content) is not
//! sent again.
//!
//! In a session everyone shares (scope `main`) only files changed since this call began are
//! read: a file left there by another person's call (one that failed) is never theirs to get.
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use switchboard_kit::exports::{self, ExportScan, NotExported, ReadExports};
use switchboard_kit::proto::Export;
use switchboard_kit::retry::{self, Backoff};
use switchboard_kit::workspace::blocking;
use switchboard_kit::workspace_fs::WorkspaceFileError;
use uuid::Uuid;

use crate::{DispatchError, TurnDispatcher};

/// A kept file as the turn's stored reply names it (`turns.exports`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptExport {
    pub id: Uuid,
    pub name: String,
    pub content_type: String,
    pub size_bytes: i64,
    pub expires_at_ms: i64,
}

impl From<&KeptExport> for Export {
    fn from(k: &KeptExport) -> Self {
        Export {
            id: k.id.to_string(),
            name: k.name.clone(),
            content_type: k.content_type.clone(),
            size_bytes: k.size_bytes,
            expires_at_ms: k.expires_at_ms,
        }
    }
}

/// What a turn's call left for the person.
#[derive(Debug, Default)]
pub(crate) struct KeptExports {
    pub kept: Vec<KeptExport>,
    /// Files not sent, and why (the reply says so).
    pub refused: Vec<NotExported>,
}

impl KeptExports {
    /// The reply's text with a line naming the files that were not sent.
    pub fn told(&self, text: String) -> String {
        if self.refused.is_empty() {
            return text;
        }
        let list: Vec<String> = self
            .refused
            .iter()
            .map(|r| format!("{} ({})", exports::display_name(&r.file), r.why))
            .collect();
        let note = format!("(Not sent: {}.)", list.join("; "));
        if text.trim().is_empty() {
            note
        } else {
            format!("{text}\n\n{note}")
        }
    }
}

/// Where and what a call's exports are read for.
pub(crate) struct ExportsOfCall<'a> {
    pub session: Uuid,
    pub seq: i64,
    pub reply_id: Uuid,
    pub person_id: &'a str,
    pub workspace: &'a str,
    /// When the call began (wall clock), for a shared session.
    pub shared_since: Option<SystemTime>,
}

/// The longest a staged write of exports is tried again: the agent has answered, a database
/// hiccup must not make it answer again.
const STAGE_RETRY_FOR: Duration = Duration::from_secs(30);

impl TurnDispatcher {
    /// Read what the call left in `exports/` and stage it under the call's reply id. A
    /// workspace that cannot be read gives nothing (logged): the answer still goes out.
    pub(crate) async fn keep_exports(
        &self,
        call: ExportsOfCall<'_>,
    ) -> Result<KeptExports, DispatchError> {
        let folder = PathBuf::from(call.workspace);
        let names = match list_names(folder.clone()).await {
            Ok(names) if names.is_empty() => return Ok(KeptExports::default()),
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(session = %call.session, error = %e, "exports/ could not be read");
                return Ok(KeptExports::default());
            }
        };
        let sent: HashSet<(String, String)> = sqlx::query!(
            "SELECT file, sha256 FROM switchboard.exports
              WHERE workspace = $1 AND file = ANY($2) AND committed",
            call.workspace,
            &names,
        )
        .fetch_all(&self.db)
        .await?
        .into_iter()
        .map(|r| (r.file, r.sha256))
        .collect();
        let scan = ExportScan {
            max_files: self.config_exports.max_exports_per_reply,
            max_bytes: self.config_exports.max_export_bytes,
            changed_since: call.shared_since,
        };
        let read = match read(folder, scan, sent).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(session = %call.session, error = %e, "exports/ could not be read");
                return Ok(KeptExports::default());
            }
        };
        for r in &read.refused {
            tracing::warn!(session = %call.session, file = %r.file, why = %r.why, "a file of exports/ not sent");
            metrics::counter!("sb_workspace_refused_total", "file" => "export", "reason" => "refused")
                .increment(1);
        }
        if read.files.is_empty() && read.refused.is_empty() {
            return Ok(KeptExports::default());
        }
        let expires_at = Utc::now()
            + chrono::Duration::seconds(
                self.config_exports.export_ttl_s.min(i64::MAX as u64) as i64
            );
        let rows = Staged::of(&read);
        retry::until(
            Instant::now() + STAGE_RETRY_FOR,
            Backoff::new(Duration::from_millis(50), Duration::from_secs(2)),
            "keeping the agent's exports",
            || self.stage(&call, &rows, expires_at),
        )
        .await?;
        metrics::counter!("sb_exports_kept_total").increment(read.files.len() as u64);
        Ok(KeptExports {
            kept: rows.kept(expires_at),
            refused: read.refused,
        })
    }

    async fn stage(
        &self,
        call: &ExportsOfCall<'_>,
        rows: &Staged,
        expires_at: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "INSERT INTO switchboard.exports
                 (id, session_id, seq, reply_id, person_id, workspace, file, name, content_type,
                  bytes, sha256, data, refused, expires_at)
             SELECT r.id, $1, $2, $3, $4, $5, r.file, r.name, r.content_type, r.bytes, r.sha256,
                    r.data, r.refused, $6
               FROM unnest($7::uuid[], $8::text[], $9::text[], $10::text[], $11::bigint[],
                           $12::text[], $13::bytea[], $14::text[])
                    AS r(id, file, name, content_type, bytes, sha256, data, refused)
             ON CONFLICT (id) DO NOTHING",
            call.session,
            call.seq,
            call.reply_id,
            call.person_id,
            call.workspace,
            expires_at,
            &rows.ids,
            &rows.files,
            &rows.names,
            &rows.content_types,
            &rows.bytes,
            &rows.sha256,
            &rows.data as &[Option<Vec<u8>>],
            &rows.refused as &[Option<String>],
        )
        .execute(&self.db)
        .await?;
        Ok(())
    }
}

/// The rows of one call's exports, as columns.
struct Staged {
    ids: Vec<Uuid>,
    files: Vec<String>,
    names: Vec<String>,
    content_types: Vec<String>,
    bytes: Vec<i64>,
    sha256: Vec<String>,
    data: Vec<Option<Vec<u8>>>,
    refused: Vec<Option<String>>,
}

impl Staged {
    fn of(read: &ReadExports) -> Self {
        let mut s = Staged {
            ids: Vec::new(),
            files: Vec::new(),
            names: Vec::new(),
            content_types: Vec::new(),
            bytes: Vec::new(),
            sha256: Vec::new(),
            data: Vec::new(),
            refused: Vec::new(),
        };
        for f in &read.files {
            s.ids.push(Uuid::now_v7());
            s.files.push(f.file.clone());
            s.names.push(f.name.clone());
            s.content_types.push(f.content_type.to_string());
            s.bytes.push(f.data.len() as i64);
            s.sha256.push(f.sha256.clone());
            s.data.push(Some(f.data.clone()));
            s.refused.push(None);
        }
        for r in &read.refused {
            s.ids.push(Uuid::now_v7());
            s.files.push(r.file.clone());
            s.names.push(exports::display_name(&r.file));
            s.content_types
                .push(exports::content_type_for(&r.file).to_string());
            s.bytes.push(r.bytes as i64);
            s.sha256.push(r.key.clone());
            s.data.push(None);
            s.refused.push(Some(r.why.clone()));
        }
        s
    }

    /// The kept files (not the refused), as the reply names them.
    fn kept(&self, expires_at: DateTime<Utc>) -> Vec<KeptExport> {
        (0..self.ids.len())
            .filter(|&i| self.refused[i].is_none())
            .map(|i| KeptExport {
                id: self.ids[i],
                name: self.names[i].clone(),
                content_type: self.content_types[i].clone(),
                size_bytes: self.bytes[i],
                expires_at_ms: expires_at.timestamp_millis(),
            })
            .collect()
    }
}

async fn list_names(folder: PathBuf) -> Result<Vec<String>, WorkspaceFileError> {
    blocking(move || exports::export_names(&folder)).await
}

async fn read(
    folder: PathBuf,
    scan: ExportScan,
    sent: HashSet<(String, String)>,
) -> Result<ReadExports, WorkspaceFileError> {
    blocking(move || {
        exports::read_exports(&folder, &scan, &|file: &str, key: &str| {
            sent.contains(&(file.to_string(), key.to_string()))
        })
    })
    .await
}
