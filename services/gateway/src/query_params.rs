//! Reading an API request's query string, the same way on every route: unknown or repeated
//! parameters refused, empty values the same as none, times and limits checked, each refusal a
//! 400 with a code saying which rule it broke.
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use chrono::{DateTime, NaiveDate, Utc};
use switchboard_channels::ApiError;

use crate::Refused;
use crate::refusal::refuse;

/// 400 with `code` and `message`.
pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> Refused {
    refuse(ApiError::bad_request(code, message))
}

/// The query string, or 400 `invalid_query` (an unknown parameter, a repeated one).
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, Refused> {
    query
        .map(|Query(q)| q)
        .map_err(|e| bad("invalid_query", e.body_text()))
}

/// A query parameter's value; an empty one is the same as none.
pub(crate) fn given(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `from` / `to`: an RFC 3339 time, or a day (`2026-11-30`, its midnight UTC).
pub(crate) fn time(name: &str, value: Option<String>) -> Result<Option<DateTime<Utc>>, Refused> {
    let Some(v) = given(value) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(&v) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    if let Ok(day) = NaiveDate::parse_from_str(&v, "%Y-%m-%d") {
        return Ok(Some(day.and_time(chrono::NaiveTime::MIN).and_utc()));
    }
    let shown: String = v.chars().filter(|c| !c.is_control()).take(60).collect();
    Err(bad(
        "invalid_time",
        format!("{name} must be an RFC 3339 time or a YYYY-MM-DD day, not {shown:?}"),
    ))
}

/// `limit`: a whole number from 1 to `max`; `default` when not given; else 400 `invalid_limit`.
pub(crate) fn query_limit(value: Option<String>, default: i64, max: i64) -> Result<i64, Refused> {
    let Some(value) = given(value) else {
        return Ok(default);
    };
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            bad(
                "invalid_limit",
                format!("limit must be a whole number from 1 to {max}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<i64, Refused>) -> &'static str {
        r.unwrap_err().0.code()
    }

    #[test]
    fn a_limit_is_a_whole_number_within_its_bounds_or_refused_with_its_rule() {
        assert_eq!(query_limit(None, 50, 500).unwrap(), 50);
        assert_eq!(query_limit(Some(" ".into()), 50, 500).unwrap(), 50);
        assert_eq!(query_limit(Some("500".into()), 50, 500).unwrap(), 500);
        for wrong in ["0", "501", "ten", "-3", "2.5"] {
            assert_eq!(
                code(query_limit(Some(wrong.into()), 50, 500)),
                "invalid_limit"
            );
        }
    }

    #[test]
    fn a_time_is_rfc_3339_or_a_day() {
        let t = time("from", Some("2026-11-30".into())).unwrap().unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-30T00:00:00+00:00");
        assert!(
            time("from", Some("2026-11-30T08:00:00+01:00".into()))
                .unwrap()
                .is_some()
        );
        assert!(time("from", None).unwrap().is_none());
        assert!(time("from", Some("yesterday".into())).is_err());
    }
}
