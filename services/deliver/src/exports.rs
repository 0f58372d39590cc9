//! The files a reply carries (`Reply.exports`, kept by dispatch from the session's
//! `exports/`), made ready for the reply's channel: each gets its signed link
//! ([`switchboard_kit::exports::ExportLinks`], working until the file's bytes are deleted),
//! and the channel's [`AttachmentStyle`] says where the links go.
use chrono::DateTime;
use sqlx::PgPool;
use switchboard_channels::{AttachmentStyle, Egress, with_links};
use switchboard_kit::config::Config;
use switchboard_kit::exports::{ExportLink, ExportLinkKeys};
use switchboard_kit::proto::Reply;
use uuid::Uuid;

/// A reply as its channel sends it: its parts, and the files that go with each (by part
/// index; a part with none may have no entry).
pub(crate) struct Outgoing {
    pub parts: Vec<String>,
    pub attachments: Vec<Vec<ExportLink>>,
}

/// Signs export links with the replicas' shared key.
#[derive(Clone)]
pub(crate) struct LinkSigner(ExportLinkKeys);

impl LinkSigner {
    pub fn new(db: PgPool, config: &Config) -> Self {
        Self(ExportLinkKeys::new(db, config))
    }

    /// `reply` split for `sender`, its files' links where the channel takes them: with the
    /// first part (media, a list), each in a part of its own after the text, or as lines
    /// ending the text. A reply of files alone has no part of text, unless the links are its
    /// text.
    pub async fn outgoing(
        &self,
        reply: &Reply,
        sender: &dyn Egress,
    ) -> Result<Outgoing, sqlx::Error> {
        if reply.exports.is_empty() {
            return Ok(Outgoing {
                parts: sender.split(&reply.text),
                attachments: Vec::new(),
            });
        }
        let links = self.0.get().await?;
        let attachments: Vec<ExportLink> = reply
            .exports
            .iter()
            .filter_map(|e| {
                let id: Uuid = e.id.parse().ok()?;
                let expires_at = DateTime::from_timestamp_millis(e.expires_at_ms)?;
                Some(links.link(id, &e.name, &e.content_type, e.size_bytes, expires_at))
            })
            .collect();
        Ok(match sender.attachments() {
            AttachmentStyle::LinksInText => Outgoing {
                parts: sender.split(&with_links(&reply.text, &attachments)),
                attachments: Vec::new(),
            },
            AttachmentStyle::Media | AttachmentStyle::Listed => {
                let mut parts = sender.split(&reply.text);
                if parts.is_empty() && !attachments.is_empty() {
                    parts.push(String::new());
                }
                Outgoing {
                    parts,
                    attachments: vec![attachments],
                }
            }
            AttachmentStyle::PartEach => {
                let mut parts = sender.split(&reply.text);
                let mut each = vec![Vec::new(); parts.len()];
                for file in attachments {
                    parts.push(String::new());
                    each.push(vec![file]);
                }
                Outgoing {
                    parts,
                    attachments: each,
                }
            }
        })
    }
}
