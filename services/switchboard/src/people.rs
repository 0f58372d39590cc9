//! `switchboard people import people.csv`: the directory from a CSV file, with a report of the
//! rows added, updated, unchanged and refused (with the reason).
//!
//! Columns (a header row names them, in any order): `person_id` (required), `person_type`
//! (default `participant`), `name`, `role`, `phone`, `email`. Unknown columns stop the import
//! before anything is written. A row is refused, and the others still imported, when its
//! `person_id` is missing or listed twice, its phone is not a phone number, its email has no
//! `@`, or its phone or email already belongs to another person: an import never moves a
//! contact point from one person to another (that would hand one person's conversations to
//! another); `switchboard directory add` does that on purpose.
use std::collections::HashMap;
use std::io::Read;

use sqlx::PgPool;

const COLUMNS: &[&str] = &["person_id", "person_type", "name", "role", "phone", "email"];

/// One directory entry, read and normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonRow {
    /// The CSV line it came from (the header is line 1).
    pub line: u64,
    pub person_id: String,
    pub person_type: String,
    pub name: String,
    pub role: String,
    /// E.164.
    pub phone: Option<String>,
    pub email: Option<String>,
}

/// A row that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refused {
    pub line: u64,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("reading the CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("unknown column {0:?} (known: {known})", known = COLUMNS.join(", "))]
    UnknownColumn(String),
    #[error("the CSV needs a person_id column")]
    NoPersonId,
    #[error("directory: {0}")]
    Database(#[from] sqlx::Error),
}

/// What an import did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ImportReport {
    pub added: usize,
    pub updated: usize,
    pub unchanged: usize,
    pub refused: Vec<Refused>,
}

/// Read and check every row of `input` (numbers without a country code read in
/// `default_region`). Rows come back in file order; a refused row carries its reason.
pub fn read_rows(
    input: impl Read,
    default_region: &str,
) -> Result<Vec<Result<PersonRow, Refused>>, ImportError> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(input);
    let headers: Vec<String> = reader
        .headers()?
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    if let Some(unknown) = headers.iter().find(|h| !COLUMNS.contains(&h.as_str())) {
        return Err(ImportError::UnknownColumn(unknown.clone()));
    }
    if !headers.iter().any(|h| h == "person_id") {
        return Err(ImportError::NoPersonId);
    }
    let mut seen_ids: HashMap<String, u64> = HashMap::new();
    let mut seen_contacts: HashMap<String, String> = HashMap::new();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                rows.push(Err(Refused {
                    line,
                    reason: e.to_string(),
                }));
                continue;
            }
        };
        let line = record.position().map_or(0, |p| p.line());
        let field = |name: &str| {
            headers
                .iter()
                .position(|h| h == name)
                .and_then(|i| record.get(i))
                .unwrap_or("")
                .to_string()
        };
        rows.push(check_row(
            line,
            &field,
            default_region,
            &mut seen_ids,
            &mut seen_contacts,
        ));
    }
    Ok(rows)
}

fn check_row(
    line: u64,
    field: &dyn Fn(&str) -> String,
    default_region: &str,
    seen_ids: &mut HashMap<String, u64>,
    seen_contacts: &mut HashMap<String, String>,
) -> Result<PersonRow, Refused> {
    let refuse = |reason: String| Refused { line, reason };
    let person_id = field("person_id");
    if person_id.is_empty() {
        return Err(refuse("person_id is empty".into()));
    }
    if let Some(first) = seen_ids.get(&person_id) {
        return Err(refuse(format!(
            "person_id {person_id} is listed twice (first on line {first})"
        )));
    }
    let phone = match field("phone") {
        p if p.is_empty() => None,
        p => Some(
            switchboard_kit::address::normalize_phone(&p, default_region)
                .map_err(|e| refuse(format!("phone: {e}")))?,
        ),
    };
    let email = match field("email").to_ascii_lowercase() {
        e if e.is_empty() => None,
        e if e.contains('@') && !e.starts_with('@') && !e.ends_with('@') => Some(e),
        e => return Err(refuse(format!("email {e:?} is not an email address"))),
    };
    for contact in phone.iter().chain(email.iter()) {
        if let Some(owner) = seen_contacts.get(contact) {
            return Err(refuse(format!(
                "{contact} is also given to {owner} in this file"
            )));
        }
    }
    seen_ids.insert(person_id.clone(), line);
    for contact in phone.iter().chain(email.iter()) {
        seen_contacts.insert(contact.clone(), person_id.clone());
    }
    let person_type = match field("person_type") {
        t if t.is_empty() => "participant".to_string(),
        t => t,
    };
    Ok(PersonRow {
        line,
        person_id,
        person_type,
        name: field("name"),
        role: field("role"),
        phone,
        email,
    })
}

enum Written {
    Added,
    Updated,
    Unchanged,
}

/// Write the rows, each in its own transaction; `progress` is called after each.
pub async fn import(
    db: &PgPool,
    rows: Vec<Result<PersonRow, Refused>>,
    mut progress: impl FnMut(),
) -> Result<ImportReport, ImportError> {
    let mut report = ImportReport::default();
    for row in rows {
        match row {
            Err(refused) => report.refused.push(refused),
            Ok(row) => match write_row(db, &row).await? {
                Ok(Written::Added) => report.added += 1,
                Ok(Written::Updated) => report.updated += 1,
                Ok(Written::Unchanged) => report.unchanged += 1,
                Err(reason) => report.refused.push(Refused {
                    line: row.line,
                    reason,
                }),
            },
        }
        progress();
    }
    Ok(report)
}

async fn write_row(db: &PgPool, row: &PersonRow) -> Result<Result<Written, String>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let mut contacts = Vec::new();
    if let Some(phone) = &row.phone {
        contacts.push(("phone", phone.as_str()));
    }
    if let Some(email) = &row.email {
        contacts.push(("email", email.as_str()));
    }
    for (kind, address) in &contacts {
        let owner = sqlx::query_scalar!(
            "SELECT person_id FROM switchboard.contact_points WHERE kind = $1 AND address = $2",
            kind,
            address,
        )
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(owner) = owner.filter(|o| *o != row.person_id) {
            return Ok(Err(format!("{kind} {address} already belongs to {owner}")));
        }
    }
    let before = sqlx::query!(
        "SELECT person_type, name, role FROM switchboard.people WHERE person_id = $1 FOR UPDATE",
        row.person_id,
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|p| (p.person_type, p.name, p.role));
    sqlx::query!(
        "INSERT INTO switchboard.people (person_id, person_type, name, role)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (person_id) DO UPDATE
           SET person_type = EXCLUDED.person_type, name = EXCLUDED.name, role = EXCLUDED.role",
        row.person_id,
        row.person_type,
        row.name,
        row.role,
    )
    .execute(&mut *tx)
    .await?;
    let mut contacts_added = 0;
    for (kind, address) in &contacts {
        contacts_added += sqlx::query!(
            "INSERT INTO switchboard.contact_points (kind, address, person_id)
             VALUES ($1, $2, $3) ON CONFLICT (kind, address) DO NOTHING",
            kind,
            address,
            row.person_id,
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
    }
    tx.commit().await?;
    Ok(Ok(match before {
        None => Written::Added,
        Some((t, n, r))
            if t == row.person_type && n == row.name && r == row.role && contacts_added == 0 =>
        {
            Written::Unchanged
        }
        Some(_) => Written::Updated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(csv: &str) -> Vec<Result<PersonRow, Refused>> {
        read_rows(csv.as_bytes(), "US").expect("a readable CSV")
    }

    #[test]
    fn rows_are_normalised_and_bad_ones_refused_with_their_line() {
        let rows = read(
            "person_id,person_type,name,role,phone,email\n\
             staff-7,staff,Dana,admin,(415) 555-0123,Dana@Example.com\n\
             p-1,,Sam,,+44 20 7946 0958,\n\
             ,staff,Nobody,,,\n\
             staff-7,staff,Dana again,,,\n\
             p-2,,Lee,,not a number,\n\
             p-3,,Kim,,+1 415 555 0123,\n\
             p-4,,Ash,,,ash.example.com\n",
        );
        let ok: Vec<_> = rows.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].phone.as_deref(), Some("+14155550123"));
        assert_eq!(ok[0].email.as_deref(), Some("dana@example.com"));
        assert_eq!(ok[1].person_type, "participant");
        let refused: Vec<_> = rows.iter().filter_map(|r| r.as_ref().err()).collect();
        let lines: Vec<_> = refused.iter().map(|r| r.line).collect();
        assert_eq!(lines, [4, 5, 6, 7, 8]);
        assert!(refused[0].reason.contains("person_id is empty"));
        assert!(refused[1].reason.contains("listed twice (first on line 2)"));
        assert!(refused[2].reason.contains("phone"));
        assert!(refused[3].reason.contains("also given to staff-7"));
        assert!(refused[4].reason.contains("not an email address"));
    }

    #[test]
    fn unknown_columns_and_a_missing_id_column_stop_the_import() {
        assert!(matches!(
            read_rows("person_id,nickname\nx,y\n".as_bytes(), "US"),
            Err(ImportError::UnknownColumn(c)) if c == "nickname"
        ));
        assert!(matches!(
            read_rows("name\nx\n".as_bytes(), "US"),
            Err(ImportError::NoPersonId)
        ));
        // A row with the wrong number of fields is refused, not the file.
        let rows = read("person_id,name\na,A\nb\nc,C\n");
        assert_eq!(rows.iter().filter(|r| r.is_ok()).count(), 2);
    }
}
