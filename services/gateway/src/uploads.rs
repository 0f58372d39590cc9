//! `POST /chat/uploads`: a chat user's file, stored before it is acknowledged, so that a
//! message frame can name it (`"attachments": ["<upload id>"]`) and dispatch can copy it into
//! the session's `attachments/` when the message's turn runs (on whichever host dispatch runs:
//! the bytes live in Postgres, which every process reaches).
//!
//! The same token as the socket (`Authorization: Bearer` or `?token=`); the body is the file
//! itself, its type in `Content-Type`, its name in `?name=`. Each file is at most
//! `workspace.max_attachment_bytes` (413 beyond), each person's stored uploads at most
//! `chat.upload_quota_bytes` (429), and uploads are deleted `chat.upload_retention_s` after
//! they were made. An `Idempotency-Key` makes a retried upload the same upload.
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use sha2::Digest;
use sqlx::PgPool;
use switchboard_channels::ApiError;
use switchboard_channels::chat::{self, ChatUser};
use switchboard_channels::ingress::{check_client_id, media_type};
use uuid::Uuid;

use crate::{GatewayState, Refused, read_body, refused_on};
use switchboard_kit::file_names::safe_file_name;

pub fn routes() -> Router<GatewayState> {
    use axum::http::{HeaderName, Method};
    use tower_http::cors::{Any, CorsLayer};
    // The widget (`/widget.js`) uploads from whatever site embeds it. The bearer token is the
    // only credential (no cookies), so any origin may call with one.
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("idempotency-key"),
        ])
        .max_age(Duration::from_secs(600));
    Router::new()
        .route("/chat/uploads", post(upload))
        .layer(cors)
}

#[derive(Debug, Deserialize, Default)]
pub struct UploadParams {
    #[serde(default)]
    token: Option<String>,
    /// The file's name as the person's device knows it.
    #[serde(default)]
    name: Option<String>,
}

/// A file name safe to put in a folder and a prompt ([`safe_file_name`]).
pub fn safe_name(name: &str) -> String {
    safe_file_name(name, "upload")
}

/// The upload's media type, or `application/octet-stream` when none (or none readable) is
/// given.
fn content_type(headers: &HeaderMap) -> String {
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(media_type)
        .unwrap_or_default();
    let token = |s: &str| {
        !s.is_empty()
            && s.len() <= 60
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
    };
    match given.split_once('/') {
        Some((kind, sub)) if token(kind) && token(sub) => given,
        _ => "application/octet-stream".into(),
    }
}

/// What the client is answered: the id its message names.
#[derive(Debug, serde::Serialize)]
struct Stored {
    upload_id: Uuid,
    name: String,
    content_type: String,
    bytes: i64,
    sha256: String,
    expires_at: chrono::DateTime<chrono::Utc>,
}

async fn upload(
    State(state): State<GatewayState>,
    Query(params): Query<UploadParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Refused> {
    let refuse = |e| refused_on("chat", chat::PROVIDER, e);
    let user = crate::auth::chat_user(&state, &headers, params.token.as_deref())?;
    if state.config.workspace.root.is_empty() {
        return Err(refuse(ApiError::forbidden(
            "uploads_off",
            "uploads are not taken here: no workspace is configured (workspace.root)",
        )));
    }
    let key = crate::api::idempotency_header(&headers);
    if let Some(key) = key {
        check_client_id("Idempotency-Key", key).map_err(refuse)?;
    }
    let max = state.config.workspace.max_attachment_bytes;
    let data = read_body(&headers, body, usize::try_from(max).unwrap_or(usize::MAX))
        .await
        .map_err(|e| {
            refuse(if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "upload_too_large",
                    format!(
                        "the file is larger than {max} bytes, the most one upload may be \
                         (workspace.max_attachment_bytes)"
                    ),
                )
            } else {
                e
            })
        })?;
    if data.is_empty() {
        return Err(refuse(ApiError::bad_request(
            "empty_upload",
            "the request body is the file, and it is empty",
        )));
    }
    let upload = NewUpload {
        owner: &user,
        client_key: key,
        name: safe_name(params.name.as_deref().unwrap_or("")),
        content_type: content_type(&headers),
        data: &data,
    };
    let store = UploadStore::new(state.db.clone());
    match store
        .put(
            &upload,
            state.config.chat.upload_quota_bytes,
            Duration::from_secs(state.config.chat.upload_retention_s),
        )
        .await
    {
        Ok(Put::Stored(stored)) => {
            metrics::counter!("sb_gateway_chat_uploads_total").increment(1);
            tracing::info!(upload_id = %stored.upload_id, bytes = stored.bytes, "upload stored");
            Ok((StatusCode::CREATED, axum::Json(stored)).into_response())
        }
        Ok(Put::Again(stored)) => Ok((StatusCode::OK, axum::Json(stored)).into_response()),
        Ok(Put::KeyReused) => Err(refuse(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            "this Idempotency-Key was used for another file",
        ))),
        Ok(Put::OverQuota { stored }) => Err(refuse(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "upload_quota",
            format!(
                "your stored uploads ({stored} bytes) and this one would pass {} bytes \
                 (chat.upload_quota_bytes); uploads are kept {} s",
                state.config.chat.upload_quota_bytes, state.config.chat.upload_retention_s
            ),
        ))),
        Err(e) => {
            tracing::error!(error = %e, "could not store an upload");
            Err(Refused(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the upload could not be stored; retry",
            )))
        }
    }
}

struct NewUpload<'a> {
    owner: &'a ChatUser,
    client_key: Option<&'a str>,
    name: String,
    content_type: String,
    data: &'a [u8],
}

enum Put {
    Stored(Stored),
    /// The same Idempotency-Key and file as an earlier upload: that upload.
    Again(Stored),
    /// The same Idempotency-Key with another file.
    KeyReused,
    /// The person's stored uploads would pass the quota.
    OverQuota {
        stored: i64,
    },
}

/// The uploads table, as the gateway uses it.
pub struct UploadStore {
    db: PgPool,
}

impl UploadStore {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }

    async fn put(
        &self,
        upload: &NewUpload<'_>,
        quota: u64,
        retention: Duration,
    ) -> Result<Put, sqlx::Error> {
        let sha256 = hex::encode(sha2::Sha256::digest(upload.data));
        let bytes = upload.data.len() as i64;
        // The quota is checked in the statement that stores, so a burst of uploads cannot all
        // pass one check made before any of them was stored (up to concurrent commits).
        // `$6` and `$10` are bigints (the sum is numeric: Postgres would take them for that).
        let stored = sqlx::query_as!(
            Stored,
            "INSERT INTO switchboard.chat_uploads
                (id, owner, client_key, name, content_type, bytes, sha256, data, expires_at)
             SELECT $1, $2, $3, $4, $5, $6::bigint, $7, $8, now() + make_interval(secs => $9)
              WHERE (SELECT coalesce(sum(bytes), 0) FROM switchboard.chat_uploads
                      WHERE owner = $2 AND expires_at > now()) + $6::bigint <= $10::bigint
             ON CONFLICT (owner, client_key) WHERE client_key IS NOT NULL DO NOTHING
             RETURNING id AS upload_id, name, content_type, bytes, sha256, expires_at",
            Uuid::now_v7(),
            upload.owner.sub,
            upload.client_key,
            upload.name,
            upload.content_type,
            bytes,
            sha256,
            upload.data,
            retention.as_secs_f64(),
            i64::try_from(quota).unwrap_or(i64::MAX),
        )
        .fetch_optional(&self.db)
        .await?;
        if let Some(stored) = stored {
            return Ok(Put::Stored(stored));
        }
        if let Some(key) = upload.client_key {
            let earlier = sqlx::query_as!(
                Stored,
                "SELECT id AS upload_id, name, content_type, bytes, sha256, expires_at
                   FROM switchboard.chat_uploads WHERE owner = $1 AND client_key = $2",
                upload.owner.sub,
                key,
            )
            .fetch_optional(&self.db)
            .await?;
            if let Some(earlier) = earlier {
                return Ok(if earlier.sha256 == sha256 {
                    Put::Again(earlier)
                } else {
                    Put::KeyReused
                });
            }
        }
        let stored = sqlx::query_scalar!(
            r#"SELECT coalesce(sum(bytes), 0)::bigint AS "stored!" FROM switchboard.chat_uploads
                WHERE owner = $1 AND expires_at > now()"#,
            upload.owner.sub,
        )
        .fetch_one(&self.db)
        .await?;
        Ok(Put::OverQuota { stored })
    }

    /// Of `ids`, those that are not `owner`'s own upload still kept (someone else's, unknown,
    /// or expired): a message may name only its sender's.
    pub async fn not_owned(&self, owner: &str, ids: &[Uuid]) -> Result<Vec<Uuid>, sqlx::Error> {
        let found = sqlx::query_scalar!(
            "SELECT id FROM switchboard.chat_uploads
              WHERE id = ANY($1) AND owner = $2 AND expires_at > now()",
            ids,
            owner,
        )
        .fetch_all(&self.db)
        .await?;
        Ok(ids
            .iter()
            .filter(|id| !found.contains(id))
            .copied()
            .collect())
    }

    /// Delete uploads past their retention; how many.
    pub async fn prune(&self) -> Result<u64, sqlx::Error> {
        Ok(
            sqlx::query!("DELETE FROM switchboard.chat_uploads WHERE expires_at <= now()")
                .execute(&self.db)
                .await?
                .rows_affected(),
        )
    }
}

/// Delete expired uploads now and then (at least every hour, and every `retention` when
/// that is shorter), until shutdown.
pub async fn prune_expired(
    store: UploadStore,
    retention: Duration,
    shutdown: switchboard_kit::shutdown::Shutdown,
) {
    let every = retention.clamp(Duration::from_secs(1), Duration::from_secs(3_600));
    loop {
        match store.prune().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "expired chat uploads deleted"),
            Err(e) => tracing::warn!(error = %e, "could not delete expired chat uploads"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_keep_what_a_person_recognises_and_nothing_that_escapes_the_folder() {
        assert_eq!(safe_name("report.pdf"), "report.pdf");
        assert_eq!(safe_name("My Scan (2).JPG"), "My_Scan__2_.JPG");
        assert_eq!(safe_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_name("C:\\Users\\ana\\notes.txt"), "notes.txt");
        assert_eq!(safe_name(".bashrc"), "bashrc");
        assert_eq!(safe_name(""), "upload");
        assert_eq!(safe_name(".."), "upload");
        assert_eq!(
            safe_name(&"a".repeat(200)).len(),
            switchboard_kit::file_names::MAX_NAME_CHARS
        );
    }

    #[test]
    fn a_content_type_is_a_media_type_or_octet_stream() {
        let mut h = HeaderMap::new();
        assert_eq!(content_type(&h), "application/octet-stream");
        h.insert(
            header::CONTENT_TYPE,
            "Application/PDF; q=1".parse().unwrap(),
        );
        assert_eq!(content_type(&h), "application/pdf");
        h.insert(header::CONTENT_TYPE, "text/html\"<script>".parse().unwrap());
        assert_eq!(content_type(&h), "application/octet-stream");
    }
}
