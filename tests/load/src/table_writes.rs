//! Rows written per table (`pg_stat_user_tables`): where a turn's writes go, so that a change
//! to the data path is measured table by table (issue 24: "count rows before and after"). An
//! update that is not HOT (it changed an indexed column, or a partial index's predicate, or
//! found no room on its page) writes a new tuple and an entry in every index of the table:
//! the share of HOT updates says how dear a table's updates are.
use std::collections::BTreeMap;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use sqlx::Connection as _;

/// One table's write counters (or their growth over a span).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableWrites {
    pub inserted: u64,
    pub updated: u64,
    /// Of `updated`, the HOT ones (no index touched).
    pub hot_updated: u64,
    pub deleted: u64,
}

impl TableWrites {
    pub fn total(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }

    fn since(&self, before: &TableWrites) -> TableWrites {
        TableWrites {
            inserted: self.inserted.saturating_sub(before.inserted),
            updated: self.updated.saturating_sub(before.updated),
            hot_updated: self.hot_updated.saturating_sub(before.hot_updated),
            deleted: self.deleted.saturating_sub(before.deleted),
        }
    }
}

/// `url` with its database replaced by `database` (the same server and credentials).
pub fn url_of_database(url: &str, database: &str) -> anyhow::Result<String> {
    let mut u = reqwest::Url::parse(url).context("a Postgres URL")?;
    u.set_path(&format!("/{database}"));
    Ok(u.to_string())
}

/// The write counters of every table of the database at `database_url` that has any, by
/// `schema.table`. Like `pg_stat_database`, the view shows what backends have flushed (read
/// after they are gone for exact numbers); reading it writes nothing.
pub async fn read(database_url: &str) -> anyhow::Result<BTreeMap<String, TableWrites>> {
    let mut conn = sqlx::PgConnection::connect(database_url).await?;
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
           FROM pg_stat_user_tables",
    )
    .fetch_all(&mut conn)
    .await
    .context("pg_stat_user_tables")?;
    let _ = conn.close().await;
    let u = |v: i64| v.max(0) as u64;
    Ok(rows
        .into_iter()
        .map(|(table, ins, upd, hot, del)| {
            (
                table,
                TableWrites {
                    inserted: u(ins),
                    updated: u(upd),
                    hot_updated: u(hot),
                    deleted: u(del),
                },
            )
        })
        .collect())
}

/// What each table gained from `before` to `after` (tables with no writes left out).
pub fn growth(
    before: &BTreeMap<String, TableWrites>,
    after: &BTreeMap<String, TableWrites>,
) -> BTreeMap<String, TableWrites> {
    after
        .iter()
        .map(|(t, a)| {
            (
                t.clone(),
                a.since(&before.get(t).copied().unwrap_or_default()),
            )
        })
        .filter(|(_, w)| w.total() > 0)
        .collect()
}

/// One line: rows written per turn by table, the most written first (`messages 2.00 ins +
/// 6.00 upd (29% HOT)`).
pub fn per_turn(tables: &BTreeMap<String, TableWrites>, turns: u64) -> String {
    let per = |n: u64| n as f64 / turns.max(1) as f64;
    let mut by_size: Vec<(&String, &TableWrites)> = tables.iter().collect();
    by_size.sort_by_key(|(t, w)| (std::cmp::Reverse(w.total()), t.as_str()));
    by_size
        .into_iter()
        .map(|(table, w)| {
            let name = table.strip_prefix("switchboard.").unwrap_or(table);
            let mut parts = Vec::new();
            if w.inserted > 0 {
                parts.push(format!("{:.2} ins", per(w.inserted)));
            }
            if w.updated > 0 {
                parts.push(format!(
                    "{:.2} upd ({:.0}% HOT)",
                    per(w.updated),
                    100.0 * w.hot_updated as f64 / w.updated as f64
                ));
            }
            if w.deleted > 0 {
                parts.push(format!("{:.2} del", per(w.deleted)));
            }
            format!("{name} {}", parts.join(" + "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(inserted: u64, updated: u64, hot_updated: u64) -> TableWrites {
        TableWrites {
            inserted,
            updated,
            hot_updated,
            deleted: 0,
        }
    }

    #[test]
    fn the_growth_per_turn_names_the_most_written_table_first_with_its_hot_share() {
        let before = BTreeMap::from([
            ("switchboard.messages".to_string(), w(10, 10, 0)),
            ("switchboard.turns".to_string(), w(5, 0, 0)),
            ("switchboard.idle".to_string(), w(3, 0, 0)),
        ]);
        let after = BTreeMap::from([
            ("switchboard.messages".to_string(), w(30, 70, 15)),
            ("switchboard.turns".to_string(), w(15, 20, 20)),
            ("switchboard.idle".to_string(), w(3, 0, 0)),
            ("switchboard.new".to_string(), w(10, 0, 0)),
        ]);
        let grown = growth(&before, &after);
        assert!(
            !grown.contains_key("switchboard.idle"),
            "unwritten tables left out"
        );
        assert_eq!(grown["switchboard.messages"], w(20, 60, 15));
        assert_eq!(
            per_turn(&grown, 10),
            "messages 2.00 ins + 6.00 upd (25% HOT), turns 1.00 ins + 2.00 upd (100% HOT), \
             new 1.00 ins"
        );
    }

    #[test]
    fn a_database_url_names_the_run_database_on_the_same_server() {
        assert_eq!(
            url_of_database("postgres://u:p@127.0.0.1:17432/switchboard", "bench1x").unwrap(),
            "postgres://u:p@127.0.0.1:17432/bench1x"
        );
    }
}
