//! Identity links as data: an operator says that two person ids are one person.
//!
//! A link `from → to` means a message resolved to `from` is treated as `to`'s (the canonical
//! person) from then on; identify follows links after resolving, chains included (at most
//! [`MAX_CHAIN`] links). An id has at most one canonical person, and a link that would close a
//! cycle or make a longer chain is refused when it is made, so following never has to guess.
//!
//! Unlink removes a link: new messages from `from` are `from`'s again (in `from`'s own session).
//! Merge is a link that also moves `from`'s contact points (and the phone, chat login or API
//! owner its id names) to `to`, and copies the name and role `to` lacks: after a merge the
//! directory itself resolves `from`'s addresses to `to`, so unlinking a merge removes the link
//! but does not move the contact points back (that would need a record of which were whose).
//!
//! Every action runs in one transaction with its audit row (who, when, why). Doing again what
//! is already done (linking what is linked, merging what is merged) changes nothing and records
//! nothing. Writers take one advisory lock, so two operators linking at once cannot make a
//! cycle between them.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};
use switchboard_kit::config::IdentityConfig;
use uuid::Uuid;

use crate::{IdentityError, contact_of, id_type};

/// The longest chain of links identify follows (and a new link may make).
pub const MAX_CHAIN: usize = 8;

/// Serialises every writer of links (any constant, held to the end of the transaction).
const WRITE_LOCK: i64 = 0x5342_4c49_4e4b; // "SBLINK"

/// What an audit row records (`identity_links.action`, `identity_link_audit.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(type_name = "text", rename_all = "lowercase")]
pub enum LinkAction {
    Link,
    Unlink,
    Merge,
}

impl LinkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkAction::Link => "link",
            LinkAction::Unlink => "unlink",
            LinkAction::Merge => "merge",
        }
    }
}

/// A link in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    #[serde(rename = "from")]
    pub from_person_id: String,
    #[serde(rename = "to")]
    pub to_person_id: String,
    /// `link` or `merge`.
    pub action: LinkAction,
    #[serde(rename = "by")]
    pub linked_by: String,
    pub reason: String,
    #[serde(rename = "at")]
    pub created_at: DateTime<Utc>,
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    pub id: Uuid,
    pub action: LinkAction,
    #[serde(rename = "from")]
    pub from_person_id: String,
    #[serde(rename = "to")]
    pub to_person_id: String,
    pub actor: String,
    pub reason: String,
    /// For a merge: the contact points moved (`kind:address`).
    pub moved: Vec<String>,
    pub at: DateTime<Utc>,
}

/// What an action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It changed something, recorded so.
    Recorded(AuditEntry),
    /// It was already so: nothing changed, nothing recorded.
    Unchanged,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{0} cannot be linked to itself")]
    SelfLink(String),
    #[error("linking {from} to {to} would make a cycle: {to} already resolves to {from}")]
    Cycle { from: String, to: String },
    #[error("{from} is already linked to {to}; unlink it first")]
    AlreadyLinked { from: String, to: String },
    #[error("linking {from} to {to} would make a chain of more than {MAX_CHAIN} links")]
    ChainTooLong { from: String, to: String },
    #[error("{from} is not linked to {to}")]
    NotLinked { from: String, to: String },
    #[error(
        "{0:?} is no person: not in the directory, and not an id identify gives \
         (user:…, api:…, phone:+…, or a configured lookup's type)"
    )]
    UnknownPerson(String),
    #[error("a reason is required")]
    NoReason,
    #[error("an actor (who does it) is required")]
    NoActor,
    #[error("{0}")]
    InvalidId(#[from] IdentityError),
    #[error("identity links: {0}")]
    Database(#[from] sqlx::Error),
}

/// Why a chain of links could not be followed to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("identity links make a cycle: {}", .0.join(" → "))]
    Cycle(Vec<String>),
    #[error("identity links from {0} make a chain of more than {MAX_CHAIN} links")]
    TooLong(String),
}

/// The ids `start` leads to through `next`, `start` first, canonical last.
pub fn chain<'a>(
    start: &'a str,
    next: impl Fn(&str) -> Option<&'a str>,
) -> Result<Vec<&'a str>, ChainError> {
    let mut ids = vec![start];
    while let Some(to) = next(ids[ids.len() - 1]) {
        if ids.contains(&to) {
            ids.push(to);
            return Err(ChainError::Cycle(
                ids.iter().map(|s| s.to_string()).collect(),
            ));
        }
        if ids.len() > MAX_CHAIN {
            return Err(ChainError::TooLong(start.to_string()));
        }
        ids.push(to);
    }
    Ok(ids)
}

/// The canonical id of `start` under `links` (from → to).
pub fn follow<'a>(
    links: &'a HashMap<String, String>,
    start: &'a str,
) -> Result<&'a str, ChainError> {
    let ids = chain(start, |id| links.get(id).map(String::as_str))?;
    Ok(ids[ids.len() - 1])
}

/// Whether `from → to` may be added to `links`: `Ok(true)` when it is new, `Ok(false)` when it
/// is there already.
pub fn check_link(
    links: &HashMap<String, String>,
    from: &str,
    to: &str,
) -> Result<bool, LinkError> {
    if from == to {
        return Err(LinkError::SelfLink(from.into()));
    }
    match links.get(from) {
        Some(existing) if existing == to => return Ok(false),
        Some(existing) => {
            return Err(LinkError::AlreadyLinked {
                from: from.into(),
                to: existing.clone(),
            });
        }
        None => {}
    }
    let next = |id: &str| links.get(id).map(String::as_str);
    let too_long = || LinkError::ChainTooLong {
        from: from.into(),
        to: to.into(),
    };
    let downstream = match chain(to, next) {
        Ok(ids) => ids,
        // The table holds no cycle (every link was checked), but refuse rather than add to one.
        Err(ChainError::Cycle(_)) | Err(ChainError::TooLong(_)) => return Err(too_long()),
    };
    if downstream.contains(&from) {
        return Err(LinkError::Cycle {
            from: from.into(),
            to: to.into(),
        });
    }
    // The longest chain that reaches `from` gets `to`'s chain appended.
    let upstream = links
        .keys()
        .filter_map(|start| chain(start, next).ok())
        .filter_map(|ids| ids.iter().position(|id| *id == from))
        .max()
        .unwrap_or(0);
    if upstream + downstream.len() > MAX_CHAIN {
        return Err(too_long());
    }
    Ok(true)
}

/// One action as asked: the two ids (as typed), who and why.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub actor: &'a str,
    pub reason: &'a str,
}

/// The link store (used by the CLI, the API and the resolver).
#[derive(Clone)]
pub struct IdentityLinks {
    db: PgPool,
    config: IdentityConfig,
}

impl IdentityLinks {
    pub fn new(db: PgPool, config: IdentityConfig) -> Self {
        Self { db, config }
    }

    /// An id as stored: `phone:` and `whatsapp:` ids carry the number in E.164, whatever way
    /// it was typed.
    pub fn person_id(&self, raw: &str) -> Result<String, IdentityError> {
        let raw = raw.trim();
        for prefix in ["phone:", "whatsapp:"] {
            if let Some(number) = raw.strip_prefix(prefix) {
                return Ok(format!(
                    "{prefix}{}",
                    crate::normalize_phone(number, &self.config.default_region)?
                ));
            }
        }
        Ok(raw.to_string())
    }

    /// Do `action` (one entry point for the CLI and the API).
    pub async fn apply(
        &self,
        action: LinkAction,
        request: Request<'_>,
    ) -> Result<Outcome, LinkError> {
        match action {
            LinkAction::Link => self.link(request).await,
            LinkAction::Unlink => self.unlink(request).await,
            LinkAction::Merge => self.merge(request).await,
        }
    }

    /// Link `from` to `to`.
    pub async fn link(&self, request: Request<'_>) -> Result<Outcome, LinkError> {
        let mut tx = self.begin().await?;
        let outcome = self.link_in(&mut tx, request).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    /// [`Self::link`] within `tx`, which [`Self::begin`] opened (for a writer that records
    /// more in the same transaction).
    pub(crate) async fn link_in(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        request: Request<'_>,
    ) -> Result<Outcome, LinkError> {
        let (from, to) = self.ids(&request)?;
        self.check_person(tx, &from).await?;
        self.check_person(tx, &to).await?;
        if !check_link(&all_links(tx).await?, &from, &to)? {
            return Ok(Outcome::Unchanged);
        }
        insert_link(tx, &request, &from, &to, LinkAction::Link).await?;
        let entry = audit(tx, LinkAction::Link, &from, &to, &request, &[]).await?;
        Ok(Outcome::Recorded(entry))
    }

    /// Remove the link `from → to` (a merge's moved contact points stay where they are).
    pub async fn unlink(&self, request: Request<'_>) -> Result<Outcome, LinkError> {
        let (from, to) = self.ids(&request)?;
        let mut tx = self.begin().await?;
        let removed = sqlx::query!(
            "DELETE FROM switchboard.identity_links
              WHERE from_person_id = $1 AND to_person_id = $2",
            from,
            to,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if removed == 0 {
            return Err(LinkError::NotLinked { from, to });
        }
        let entry = audit(&mut tx, LinkAction::Unlink, &from, &to, &request, &[]).await?;
        tx.commit().await?;
        Ok(Outcome::Recorded(entry))
    }

    /// Link `from` to `to`, move `from`'s contact points to `to` and give `to` the name and
    /// role it lacks.
    pub async fn merge(&self, request: Request<'_>) -> Result<Outcome, LinkError> {
        let (from, to) = self.ids(&request)?;
        let mut tx = self.begin().await?;
        self.check_person(&mut tx, &from).await?;
        let to_type = self.check_person(&mut tx, &to).await?;
        let new_link = check_link(&all_links(&mut tx).await?, &from, &to)?;

        let (name, role) = sqlx::query!(
            "SELECT name, role FROM switchboard.people WHERE person_id = $1",
            from,
        )
        .fetch_optional(&mut *tx)
        .await?
        .map(|p| (p.name, p.role))
        .unwrap_or_default();
        // Contact points need `to` in the directory.
        let added = sqlx::query!(
            "INSERT INTO switchboard.people (person_id, person_type, name, role)
             VALUES ($1, $2, $3, $4) ON CONFLICT (person_id) DO NOTHING",
            to,
            to_type,
            name,
            role,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let copied = sqlx::query!(
            "UPDATE switchboard.people
                SET name = CASE WHEN name = '' THEN $2 ELSE name END,
                    role = CASE WHEN role = '' THEN $3 ELSE role END
              WHERE person_id = $1 AND ((name = '' AND $2 <> '') OR (role = '' AND $3 <> ''))",
            to,
            name,
            role,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let mut moved: Vec<String> = sqlx::query_scalar!(
            r#"UPDATE switchboard.contact_points SET person_id = $2
              WHERE person_id = $1 RETURNING kind || ':' || address AS "moved!""#,
            from,
            to,
        )
        .fetch_all(&mut *tx)
        .await?;
        // An id identify made from an address (`phone:+1…`) has no contact point yet: the
        // address becomes `to`'s, unless the directory already gives it to someone.
        if let Some((kind, address)) = contact_of(&from) {
            let inserted = sqlx::query!(
                "INSERT INTO switchboard.contact_points (kind, address, person_id)
                 VALUES ($1, $2, $3) ON CONFLICT (kind, address) DO NOTHING",
                kind.as_str(),
                address,
                to,
            )
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted > 0 {
                moved.push(format!("{}:{address}", kind.as_str()));
            }
        }
        let relabelled = if new_link {
            insert_link(&mut tx, &request, &from, &to, LinkAction::Merge).await?;
            0
        } else {
            // A link made earlier becomes this merge's.
            sqlx::query!(
                "UPDATE switchboard.identity_links SET action = $3
                  WHERE from_person_id = $1 AND to_person_id = $2 AND action <> $3",
                from,
                to,
                LinkAction::Merge.as_str(),
            )
            .execute(&mut *tx)
            .await?
            .rows_affected()
        };
        if !new_link && moved.is_empty() && added + copied + relabelled == 0 {
            return Ok(Outcome::Unchanged);
        }
        let entry = audit(&mut tx, LinkAction::Merge, &from, &to, &request, &moved).await?;
        tx.commit().await?;
        Ok(Outcome::Recorded(entry))
    }

    /// The links in force (those from or to `person`, if given), newest first.
    pub async fn links(&self, person: Option<&str>) -> Result<Vec<Link>, LinkError> {
        let person = person.map(|p| self.person_id(p)).transpose()?;
        Ok(sqlx::query_as!(
            Link,
            r#"SELECT from_person_id, to_person_id, action AS "action: LinkAction", linked_by,
                      reason, created_at
                 FROM switchboard.identity_links
                WHERE $1::text IS NULL OR from_person_id = $1 OR to_person_id = $1
                ORDER BY created_at DESC, id DESC"#,
            person,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The audit trail (of `person`, if given), newest first.
    pub async fn audit(
        &self,
        person: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, LinkError> {
        let person = person.map(|p| self.person_id(p)).transpose()?;
        Ok(sqlx::query_as!(
            AuditEntry,
            r#"SELECT id, action AS "action: LinkAction", from_person_id, to_person_id, actor,
                      reason, moved, at
                 FROM switchboard.identity_link_audit
                WHERE $1::text IS NULL OR from_person_id = $1 OR to_person_id = $1
                ORDER BY at DESC, id DESC
                LIMIT $2"#,
            person,
            limit,
        )
        .fetch_all(&self.db)
        .await?)
    }

    /// The canonical id `person_id` resolves to through the links (itself when unlinked).
    pub async fn canonical(&self, person_id: &str) -> Result<String, sqlx::Error> {
        // Only the chain from `person_id`, one hop more than may be followed so a (hand-made)
        // cycle or overlong chain shows as one.
        let edges = sqlx::query!(
            r#"WITH RECURSIVE chain (from_id, to_id, depth) AS (
                 SELECT from_person_id, to_person_id, 1
                   FROM switchboard.identity_links WHERE from_person_id = $1
               UNION ALL
                 SELECT l.from_person_id, l.to_person_id, c.depth + 1
                   FROM switchboard.identity_links l JOIN chain c ON l.from_person_id = c.to_id
                  WHERE c.depth <= $2
             )
             SELECT from_id AS "from_id!", to_id AS "to_id!" FROM chain"#,
            person_id,
            MAX_CHAIN as i32,
        )
        .fetch_all(&self.db)
        .await?;
        if edges.is_empty() {
            return Ok(person_id.to_string());
        }
        let links: HashMap<String, String> =
            edges.into_iter().map(|e| (e.from_id, e.to_id)).collect();
        match follow(&links, person_id) {
            Ok(id) => Ok(id.to_string()),
            // Only a hand edit of the table gets here: the message stays its sender's own
            // rather than going to a guess.
            Err(e) => {
                tracing::error!(person_id, error = %e, "identity links not followed");
                Ok(person_id.to_string())
            }
        }
    }

    fn ids(&self, request: &Request<'_>) -> Result<(String, String), LinkError> {
        if request.reason.trim().is_empty() {
            return Err(LinkError::NoReason);
        }
        if request.actor.trim().is_empty() {
            return Err(LinkError::NoActor);
        }
        Ok((self.person_id(request.from)?, self.person_id(request.to)?))
    }

    /// A transaction holding the one lock every writer of links takes.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        sqlx::query!("SELECT pg_advisory_xact_lock($1)", WRITE_LOCK)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// The person type of `id`: the directory's, else the one its shape says; else refused
    /// (a mistyped id would otherwise take someone's messages to no one).
    async fn check_person(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        id: &str,
    ) -> Result<String, LinkError> {
        let known = sqlx::query_scalar!(
            "SELECT person_type FROM switchboard.people WHERE person_id = $1",
            id,
        )
        .fetch_optional(&mut **tx)
        .await?;
        known
            .or_else(|| id_type(id, &self.config).map(str::to_string))
            .ok_or_else(|| LinkError::UnknownPerson(id.into()))
    }
}

async fn all_links(
    tx: &mut Transaction<'static, Postgres>,
) -> Result<HashMap<String, String>, sqlx::Error> {
    let rows = sqlx::query!("SELECT from_person_id, to_person_id FROM switchboard.identity_links")
        .fetch_all(&mut **tx)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.from_person_id, r.to_person_id))
        .collect())
}

async fn insert_link(
    tx: &mut Transaction<'static, Postgres>,
    request: &Request<'_>,
    from: &str,
    to: &str,
    action: LinkAction,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO switchboard.identity_links
             (id, from_person_id, to_person_id, linked_by, reason, action)
         VALUES ($1, $2, $3, $4, $5, $6)",
        Uuid::now_v7(),
        from,
        to,
        request.actor.trim(),
        request.reason.trim(),
        action.as_str(),
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn audit(
    tx: &mut Transaction<'static, Postgres>,
    action: LinkAction,
    from: &str,
    to: &str,
    request: &Request<'_>,
    moved: &[String],
) -> Result<AuditEntry, sqlx::Error> {
    sqlx::query_as!(
        AuditEntry,
        r#"INSERT INTO switchboard.identity_link_audit
               (id, action, from_person_id, to_person_id, actor, reason, moved)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           RETURNING id, action AS "action: LinkAction", from_person_id, to_person_id, actor,
                     reason, moved, at"#,
        Uuid::now_v7(),
        action.as_str(),
        from,
        to,
        request.actor.trim(),
        request.reason.trim(),
        moved,
    )
    .fetch_one(&mut **tx)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn chains_are_followed_to_the_canonical_person() {
        let l = links(&[("phone:+1", "user:ana"), ("user:ana", "staff-7")]);
        assert_eq!(follow(&l, "phone:+1"), Ok("staff-7"));
        assert_eq!(follow(&l, "user:ana"), Ok("staff-7"));
        assert_eq!(follow(&l, "staff-7"), Ok("staff-7"));
        assert_eq!(follow(&l, "someone-else"), Ok("someone-else"));
    }

    #[test]
    fn a_cycle_or_an_overlong_chain_in_the_table_is_not_followed() {
        let l = links(&[("a", "b"), ("b", "c"), ("c", "a")]);
        assert_eq!(
            follow(&l, "a"),
            Err(ChainError::Cycle(vec![
                "a".into(),
                "b".into(),
                "c".into(),
                "a".into()
            ]))
        );
        let ids: Vec<String> = (0..=MAX_CHAIN + 1).map(|i| format!("p{i}")).collect();
        let long: HashMap<_, _> = ids
            .windows(2)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        assert_eq!(follow(&long, "p0"), Err(ChainError::TooLong("p0".into())));
        // Exactly MAX_CHAIN links are followed.
        assert_eq!(follow(&long, "p1"), Ok(ids[MAX_CHAIN + 1].as_str()));
    }

    #[test]
    fn a_link_that_would_close_a_cycle_is_refused() {
        let l = links(&[("a", "b"), ("b", "c")]);
        assert!(matches!(
            check_link(&l, "c", "a"),
            Err(LinkError::Cycle { .. })
        ));
        assert!(matches!(
            check_link(&l, "c", "b"),
            Err(LinkError::Cycle { .. })
        ));
        assert!(matches!(
            check_link(&l, "a", "a"),
            Err(LinkError::SelfLink(_))
        ));
        // `a` already has a canonical person: one at a time.
        assert!(matches!(
            check_link(&l, "a", "d"),
            Err(LinkError::AlreadyLinked { to, .. }) if to == "b"
        ));
        // Linking again is no change; extending a chain is allowed.
        assert!(!check_link(&l, "a", "b").unwrap());
        assert!(check_link(&l, "c", "d").unwrap());
        assert!(check_link(&l, "z", "a").unwrap());
    }

    #[test]
    fn a_link_that_would_make_too_long_a_chain_is_refused() {
        let ids: Vec<String> = (0..MAX_CHAIN).map(|i| format!("p{i}")).collect();
        let l: HashMap<_, _> = ids
            .windows(2)
            .map(|w| (w[0].clone(), w[1].clone()))
            .collect();
        // p0 → … → p{MAX-1} is MAX-1 links: one more at either end fits, a second does not.
        assert!(check_link(&l, &ids[MAX_CHAIN - 1], "end").unwrap());
        assert!(check_link(&l, "start", "p0").unwrap());
        let mut longer = l.clone();
        longer.insert(ids[MAX_CHAIN - 1].clone(), "end".into());
        assert!(matches!(
            check_link(&longer, "end", "after"),
            Err(LinkError::ChainTooLong { .. })
        ));
        assert!(matches!(
            check_link(&longer, "start", "p0"),
            Err(LinkError::ChainTooLong { .. })
        ));
    }
}
