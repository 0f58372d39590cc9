//! Identify's two reads a message (who a contact point is; where a person's identity links
//! lead), asked by many messages at once and answered by one statement each per batch. The
//! answers are the same as one message's own queries would give; a batch whose statement
//! fails is asked again message by message, so each gets its own answer or error.
use std::collections::HashMap;

use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;
use switchboard_kit::db::answer_group;

use crate::links::{self, MAX_CHAIN};

/// A known person, as the contact point lookup reads them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct PersonRow {
    pub person_id: String,
    pub person_type: String,
    pub name: String,
    pub role: String,
}

/// Most questions answered by one statement.
const MAX_BATCH: usize = 256;
/// Statements of each kind in flight at once.
const LANES: usize = 2;

pub(crate) struct DirectoryReads {
    /// (contact kind, normalized address) → the directory's person.
    contacts: Coalescer<(String, String), sqlx::Result<Option<PersonRow>>>,
    /// person id → their canonical id, the links followed.
    canonical: Coalescer<String, sqlx::Result<String>>,
}

impl DirectoryReads {
    pub fn new(db: PgPool, links: links::IdentityLinks) -> Self {
        let contacts_db = db.clone();
        let contacts = Coalescer::new(MAX_BATCH, LANES, move |asked: Vec<(String, String)>| {
            let db = contacts_db.clone();
            async move {
                let together = contacts_all(&db, &asked)
                    .await
                    .map(|found| asked.iter().map(|a| found.get(a).cloned()).collect());
                answer_group(&asked, together, |i| contact(&db, &asked[i].0, &asked[i].1)).await
            }
        });
        let links = std::sync::Arc::new(links);
        let canonical = Coalescer::new(MAX_BATCH, LANES, move |asked: Vec<String>| {
            let (db, links) = (db.clone(), links.clone());
            async move {
                let together = chains_all(&db, &asked)
                    .await
                    .map(|edges| asked.iter().map(|id| follow(edges.get(id), id)).collect());
                answer_group(&asked, together, |i| links.canonical(&asked[i])).await
            }
        });
        Self {
            contacts,
            canonical,
        }
    }

    /// The person the directory holds for contact point (`kind`, `address`).
    pub async fn contact(&self, kind: &str, address: &str) -> sqlx::Result<Option<PersonRow>> {
        self.contacts
            .call((kind.to_string(), address.to_string()))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }

    /// `person_id`'s canonical person ([`links::IdentityLinks::canonical`]).
    pub async fn canonical(&self, person_id: &str) -> sqlx::Result<String> {
        self.canonical
            .call(person_id.to_string())
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
    }
}

async fn contact(db: &PgPool, kind: &str, address: &str) -> sqlx::Result<Option<PersonRow>> {
    sqlx::query_as(
        "SELECT p.person_id, p.person_type, p.name, p.role
           FROM switchboard.contact_points c
           JOIN switchboard.people p USING (person_id)
          WHERE c.kind = $1 AND c.address = $2",
    )
    .bind(kind)
    .bind(address)
    .fetch_optional(db)
    .await
}

/// [`contact`] for each of `asked`. Each address is looked up by key inside a lateral (kept
/// apart by `OFFSET 0`), as are the links in [`chains_all`]: as a plain join, the plan Postgres
/// caches while the directory is nearly empty (a fresh deployment, before its import and its
/// first analyze) reads every contact point for each batch from then on.
async fn contacts_all(
    db: &PgPool,
    asked: &[(String, String)],
) -> sqlx::Result<HashMap<(String, String), PersonRow>> {
    #[derive(sqlx::FromRow)]
    struct Found {
        kind: String,
        address: String,
        #[sqlx(flatten)]
        person: PersonRow,
    }
    let (kinds, addresses): (Vec<&str>, Vec<&str>) =
        asked.iter().map(|(k, a)| (k.as_str(), a.as_str())).unzip();
    let found: Vec<Found> = sqlx::query_as(
        "SELECT u.kind, u.address, f.person_id, f.person_type, f.name, f.role
           FROM unnest($1::text[], $2::text[]) AS u(kind, address)
           CROSS JOIN LATERAL (
                SELECT p.person_id, p.person_type, p.name, p.role
                  FROM switchboard.contact_points c
                  JOIN switchboard.people p ON p.person_id = c.person_id
                 WHERE c.kind = u.kind AND c.address = u.address
                OFFSET 0) f",
    )
    .bind(&kinds)
    .bind(&addresses)
    .fetch_all(db)
    .await?;
    Ok(found
        .into_iter()
        .map(|f| ((f.kind, f.address), f.person))
        .collect())
}

/// The links out of each of `roots`' chains (one hop more than may be followed, as
/// [`links::IdentityLinks::canonical`] reads them), by root.
async fn chains_all(
    db: &PgPool,
    roots: &[String],
) -> sqlx::Result<HashMap<String, HashMap<String, String>>> {
    let edges: Vec<(String, String, String)> = sqlx::query_as(
        "WITH RECURSIVE chain (root, from_id, to_id, depth) AS (
             SELECT r.root, l.from_person_id, l.to_person_id, 1
               FROM unnest($1::text[]) AS r(root)
               CROSS JOIN LATERAL (
                    SELECT from_person_id, to_person_id FROM switchboard.identity_links
                     WHERE from_person_id = r.root OFFSET 0) l
           UNION ALL
             SELECT c.root, l.from_person_id, l.to_person_id, c.depth + 1
               FROM chain c
               CROSS JOIN LATERAL (
                    SELECT from_person_id, to_person_id FROM switchboard.identity_links
                     WHERE from_person_id = c.to_id OFFSET 0) l
              WHERE c.depth <= $2
         )
         SELECT root, from_id, to_id FROM chain",
    )
    .bind(roots)
    .bind(MAX_CHAIN as i32)
    .fetch_all(db)
    .await?;
    let mut by_root: HashMap<String, HashMap<String, String>> = HashMap::new();
    for (root, from, to) in edges {
        by_root.entry(root).or_default().insert(from, to);
    }
    Ok(by_root)
}

/// Where `id`'s links lead; a cycle or overlong chain (only a hand edit of the table makes
/// one) leaves the message its sender's own rather than going to a guess.
fn follow(links: Option<&HashMap<String, String>>, id: &str) -> String {
    let Some(links) = links else {
        return id.to_string();
    };
    match links::follow(links, id) {
        Ok(canonical) => canonical.to_string(),
        Err(e) => {
            tracing::error!(person_id = id, error = %e, "identity links not followed");
            id.to_string()
        }
    }
}
