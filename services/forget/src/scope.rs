//! What is the person's, read under the erasure lock: their ids (theirs and every id linked
//! into it), their sessions, messages and workspaces, and their contact points.
//!
//! An identity link (`identity_links`, from → to) says two ids are one human: messages from the
//! `from` id go to the `to` id's sessions from then on, and what was recorded under the `from`
//! id before the link stays there. So the person's history is what was recorded under their id
//! and under every id whose chain of links leads to it.
//!
//! An address means something only on its channel (a chat login `ops-bot` and an API key owner
//! `ops-bot` may be two people). The person's contact points are (kind, address) pairs: their
//! directory entries, the address their external ids stand for (`phone:+1…`), and the
//! (channel, sender) their messages came from, by the channel's kind. A row keyed by
//! (channel, address) is theirs only when that channel's kind and the address are one of them.
use std::collections::BTreeSet;

use sqlx::{Postgres, Transaction};
use switchboard_kit::config::ContactKind;
use uuid::Uuid;

/// How many links a chain into the person may have (as identify follows them).
const MAX_CHAIN: i32 = 16;

pub(crate) struct Found {
    /// The person's id and the ids linked into it, sorted, each once.
    pub ids: Vec<String>,
    /// The ids linked into the person (not the person's own).
    pub linked: Vec<String>,
    pub sessions: Vec<Uuid>,
    pub workspaces: BTreeSet<String>,
    pub messages: Vec<Uuid>,
    /// (channel, sender) of their inbound messages.
    pub senders: BTreeSet<(String, String)>,
    /// Their contact points: (kind, address) as `contact_points` keys them.
    pub points: BTreeSet<(String, String)>,
    /// Whether anything names them at all.
    pub seen: bool,
}

/// The ids whose chain of links leads to `person` (not `person` itself), sorted.
pub(crate) async fn linked_into(
    tx: &mut Transaction<'_, Postgres>,
    person: &str,
) -> sqlx::Result<Vec<String>> {
    let mut ids = sqlx::query_scalar!(
        r#"WITH RECURSIVE linked (id, depth) AS (
             SELECT from_person_id, 1 FROM switchboard.identity_links WHERE to_person_id = $1
           UNION
             SELECT l.from_person_id, k.depth + 1
               FROM switchboard.identity_links l JOIN linked k ON l.to_person_id = k.id
              WHERE k.depth < $2
         )
         SELECT DISTINCT id AS "id!" FROM linked WHERE id <> $1"#,
        person,
        MAX_CHAIN,
    )
    .fetch_all(&mut **tx)
    .await?;
    ids.sort();
    Ok(ids)
}

impl Found {
    /// What names `person` or one of `linked` (see the module doc).
    pub async fn load(
        tx: &mut Transaction<'_, Postgres>,
        person: &str,
        linked: Vec<String>,
    ) -> sqlx::Result<Self> {
        let mut ids = linked.clone();
        ids.push(person.to_string());
        ids.sort();
        ids.dedup();
        let sessions = sqlx::query!(
            "SELECT id, workspace_path FROM switchboard.sessions WHERE person_id = ANY($1)",
            &ids,
        )
        .fetch_all(&mut **tx)
        .await?;
        let session_ids: Vec<Uuid> = sessions.iter().map(|s| s.id).collect();
        let messages = sqlx::query_scalar!(
            "SELECT id FROM switchboard.messages WHERE person_id = ANY($1) OR session_id = ANY($2)",
            &ids,
            &session_ids,
        )
        .fetch_all(&mut **tx)
        .await?;
        let senders: BTreeSet<(String, String)> = sqlx::query!(
            r#"SELECT DISTINCT channel, metadata->>'sender' AS "sender!" FROM switchboard.messages
                WHERE id = ANY($1) AND direction = 'inbound' AND metadata->>'sender' <> ''"#,
            &messages,
        )
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|s| (s.channel, s.sender))
        .collect();
        let mut points: BTreeSet<(String, String)> = sqlx::query!(
            "SELECT kind, address FROM switchboard.contact_points WHERE person_id = ANY($1)",
            &ids,
        )
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|p| (p.kind, p.address))
        .collect();
        points.extend(
            ids.iter()
                .filter_map(|id| switchboard_identify::contact_of(id))
                .map(|(kind, address)| (kind.as_str().to_string(), address)),
        );
        points.extend(
            senders
                .iter()
                .map(|(channel, sender)| (kind_of(channel), sender.clone())),
        );
        let named_elsewhere = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM switchboard.people WHERE person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.identity_links
                             WHERE from_person_id = ANY($1) OR to_person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.identity_link_audit
                             WHERE from_person_id = ANY($1) OR to_person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.summaries WHERE person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.memories WHERE person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.message_vectors WHERE person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.handed_vectors WHERE person_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.link_claims WHERE claimant_id = ANY($1))
                 OR EXISTS (SELECT 1 FROM switchboard.contact_points WHERE person_id = ANY($1))
                 AS "named!""#,
            &ids,
        )
        .fetch_one(&mut **tx)
        .await?;
        Ok(Self {
            seen: named_elsewhere || !sessions.is_empty() || !messages.is_empty(),
            workspaces: sessions
                .iter()
                .filter_map(|s| s.workspace_path.clone())
                .collect(),
            ids,
            linked,
            sessions: session_ids,
            messages,
            senders,
            points,
        })
    }

    /// Every address of theirs, of whatever kind: to narrow a query down before
    /// [`Found::theirs_on_channels`] keeps the (channel, address) pairs that are theirs.
    pub fn addresses(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.points.iter().map(|(_, a)| a).collect();
        all.into_iter().cloned().collect()
    }

    /// Their addresses of `kind`.
    pub fn addresses_of(&self, kind: ContactKind) -> Vec<String> {
        self.points
            .iter()
            .filter(|(k, _)| k == kind.as_str())
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Of `pairs` ((channel, address) as a table keys them), those that are theirs: the
    /// channel's kind of address and the address are one of their contact points.
    pub fn theirs_on_channels(&self, pairs: Vec<(String, String)>) -> (Vec<String>, Vec<String>) {
        pairs
            .into_iter()
            .filter(|(channel, address)| self.points.contains(&(kind_of(channel), address.clone())))
            .unzip()
    }
}

/// The kind of the addresses of `channel`, as `contact_points.kind` stores it.
fn kind_of(channel: &str) -> String {
    ContactKind::of_channel(channel).as_str().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(points: &[(&str, &str)]) -> Found {
        Found {
            ids: vec!["staff:17".into()],
            linked: Vec::new(),
            sessions: Vec::new(),
            workspaces: BTreeSet::new(),
            messages: Vec::new(),
            senders: BTreeSet::new(),
            points: points
                .iter()
                .map(|(k, a)| (k.to_string(), a.to_string()))
                .collect(),
            seen: true,
        }
    }

    #[test]
    fn an_address_is_theirs_only_on_the_channels_of_its_kind() {
        let f = found(&[("chat_user", "ops-bot"), ("phone", "+61400000017")]);
        let pairs = vec![
            ("admin_chat".to_string(), "ops-bot".to_string()),
            ("header_widget".to_string(), "ops-bot".to_string()),
            // An API key owner of the same name is someone else's.
            ("api".to_string(), "ops-bot".to_string()),
            ("sms".to_string(), "+61400000017".to_string()),
        ];
        let (channels, addresses) = f.theirs_on_channels(pairs);
        assert_eq!(channels, ["admin_chat", "header_widget", "sms"]);
        assert_eq!(addresses, ["ops-bot", "ops-bot", "+61400000017"]);
        assert_eq!(
            f.addresses_of(ContactKind::ApiKeyOwner),
            Vec::<String>::new()
        );
        assert_eq!(f.addresses_of(ContactKind::ChatUser), ["ops-bot"]);
    }
}
