//! What the categorisation worker's labels add up to: exchanges per label per day, each
//! person's most frequent labels, and the volume per channel. An exchange counts on the day (UTC)
//! its reply was logged.
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// A person's labels listed at most.
pub const TOP_LABELS_PER_PERSON: i64 = 3;
/// People listed at most (the most active first).
pub const MAX_PEOPLE: i64 = 100;

/// Which exchanges to count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnalyticsQuery {
    /// Exchanges at or after this time.
    pub from: Option<DateTime<Utc>>,
    /// Exchanges before this time.
    pub to: Option<DateTime<Utc>>,
    /// The agent (engine variant) name that answered.
    pub agent: Option<String>,
    pub person: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AnalyticsError {
    #[error("{0}")]
    Invalid(String),
    #[error("analytics: {0}")]
    Database(#[from] sqlx::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DayCount {
    pub day: NaiveDate,
    pub label: String,
    pub exchanges: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LabelCount {
    pub label: String,
    pub exchanges: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PersonLabels {
    pub person_id: String,
    /// Every exchange of the person in the range.
    pub exchanges: i64,
    /// The most frequent first (at most [`TOP_LABELS_PER_PERSON`]).
    pub top_labels: Vec<LabelCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelVolume {
    pub channel: String,
    pub exchanges: i64,
}

/// Category analytics over a range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryAnalytics {
    /// Per day (oldest first), per label (alphabetical).
    pub per_day: Vec<DayCount>,
    /// Per person, the most active first.
    pub per_person: Vec<PersonLabels>,
    /// Per channel, the busiest first.
    pub per_channel: Vec<ChannelVolume>,
}

/// One of a person's top labels, with the person's total (a row of the per-person count).
struct PersonLabelRow {
    person_id: String,
    total: i64,
    label: String,
    n: i64,
}

/// A statement over the exchanges `q` selects into `$record`: `$select`, then the exchanges
/// counted (`c` the category row, `m` the reply it labels; filters `$1` to `$4`, bound from
/// `q`), then `$rest`, which may bind more from `$5`. A macro so that each statement is one
/// literal, checked at compile time.
macro_rules! counted {
    ($record:path, $q:expr, $select:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            $record,
            $select
                + " FROM switchboard.exchange_categories c
                    JOIN switchboard.messages m ON m.id = c.outbound_id
                   WHERE ($1::timestamptz IS NULL OR m.created_at >= $1)
                     AND ($2::timestamptz IS NULL OR m.created_at < $2)
                     AND ($3::text IS NULL OR m.agent_name = $3)
                     AND ($4::text IS NULL OR c.person_id = $4) "
                + $rest,
            $q.from,
            $q.to,
            $q.agent.as_deref(),
            $q.person.as_deref(),
            $($arg),*
        )
    };
}

/// Count the categorised exchanges `q` selects.
pub async fn categories(
    db: &PgPool,
    q: &AnalyticsQuery,
) -> Result<CategoryAnalytics, AnalyticsError> {
    if let (Some(from), Some(to)) = (q.from, q.to)
        && from >= to
    {
        return Err(AnalyticsError::Invalid("from must be before to".into()));
    }
    let per_day = counted!(
        DayCount,
        q,
        r#"SELECT (m.created_at AT TIME ZONE 'UTC')::date AS "day!", c.label,
                  count(*) AS "exchanges!""#,
        "GROUP BY 1, 2 ORDER BY 1, 2"
    )
    .fetch_all(db)
    .await?;
    let per_channel = counted!(
        ChannelVolume,
        q,
        r#"SELECT c.channel, count(*) AS "exchanges!""#,
        "GROUP BY 1 ORDER BY 2 DESC, 1"
    )
    .fetch_all(db)
    .await?;
    let rows = counted!(
        PersonLabelRow,
        q,
        "WITH counts AS (SELECT c.person_id, c.label, count(*) AS n",
        r#"GROUP BY 1, 2),
         people AS (
            SELECT person_id, sum(n)::bigint AS total FROM counts GROUP BY 1
             ORDER BY 2 DESC, 1 LIMIT $5),
         ranked AS (
            SELECT person_id, label, n,
                   row_number() OVER (PARTITION BY person_id ORDER BY n DESC, label) AS r
              FROM counts)
         SELECT p.person_id AS "person_id!", p.total AS "total!", r.label AS "label!",
                r.n AS "n!"
           FROM people p JOIN ranked r ON r.person_id = p.person_id
          WHERE r.r <= $6
          ORDER BY p.total DESC, p.person_id, r.r"#,
        MAX_PEOPLE,
        TOP_LABELS_PER_PERSON,
    )
    .fetch_all(db)
    .await?;
    let mut per_person: Vec<PersonLabels> = Vec::new();
    for PersonLabelRow {
        person_id,
        total,
        label,
        n,
    } in rows
    {
        if per_person.last().is_none_or(|p| p.person_id != person_id) {
            per_person.push(PersonLabels {
                person_id,
                exchanges: total,
                top_labels: Vec::new(),
            });
        }
        let person = per_person.last_mut().expect("pushed above");
        person.top_labels.push(LabelCount {
            label,
            exchanges: n,
        });
    }
    Ok(CategoryAnalytics {
        per_day,
        per_person,
        per_channel,
    })
}
