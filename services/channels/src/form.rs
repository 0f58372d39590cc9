//! A strict `application/x-www-form-urlencoded` parser for provider webhooks.
//!
//! `form_urlencoded::parse` follows the WHATWG rules, which never fail: a broken escape such as
//! `%zz` is kept as it is and bytes that are not UTF-8 become U+FFFD. A webhook body is hostile
//! input, and a provider never sends either, so here both are errors. A well-formed body parses
//! to exactly what `form_urlencoded::parse` returns (the fuzz target `twilio_webhook` checks it).

/// Why a body is not an acceptable form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// A `%` not followed by two hex digits.
    #[error("malformed percent-escape in the form body")]
    BadEscape,
    /// A name or value that is not UTF-8 once decoded.
    #[error("a form field is not UTF-8 once decoded")]
    NotUtf8,
    /// A name or value containing U+0000, which no provider sends and Postgres cannot store.
    #[error("a form field contains a NUL character")]
    Nul,
    /// More than the allowed number of fields.
    #[error("too many form fields")]
    TooManyFields,
}

/// Most parameters a provider's webhook carries is ~40 (Twilio, more with media); anything far
/// beyond that is not a provider.
pub const MAX_FORM_FIELDS: usize = 200;

impl FormError {
    /// The answer to a request whose body is such a form: 400 with the reason.
    pub fn rejection(self) -> crate::ApiError {
        let code = match self {
            FormError::BadEscape => "malformed_form",
            FormError::NotUtf8 | FormError::Nul => "bad_encoding",
            FormError::TooManyFields => "too_many_fields",
        };
        crate::ApiError::bad_request(code, self.to_string())
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode(raw: &[u8]) -> Result<String, FormError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = raw.get(i + 1).copied().and_then(hex);
                let lo = raw.get(i + 2).copied().and_then(hex);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(FormError::BadEscape);
                };
                out.push((hi << 4) | lo);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    let s = String::from_utf8(out).map_err(|_| FormError::NotUtf8)?;
    if s.contains('\0') {
        return Err(FormError::Nul);
    }
    Ok(s)
}

/// Parse `body` into (name, value) pairs in order, refusing more than `max_fields` of them.
/// Empty segments (`a=1&&b=2`) are skipped and a segment without `=` is a name with an empty
/// value, as in the WHATWG rules.
pub fn parse_form(body: &[u8], max_fields: usize) -> Result<Vec<(String, String)>, FormError> {
    let mut fields = Vec::new();
    for segment in body.split(|b| *b == b'&').filter(|s| !s.is_empty()) {
        if fields.len() == max_fields {
            return Err(FormError::TooManyFields);
        }
        let (name, value) = match segment.iter().position(|b| *b == b'=') {
            Some(eq) => (&segment[..eq], &segment[eq + 1..]),
            None => (segment, &[][..]),
        };
        fields.push((decode(name)?, decode(value)?));
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn well_formed_bodies_parse_like_form_urlencoded() {
        for body in [
            &b"Body=hello+world&From=%2B14155550100"[..],
            b"a=1&&b=&c&=d&e=%C3%A9%e2%82%ac",
            b"",
            b"&&&",
            b"x==y",
        ] {
            let ours = parse_form(body, 100).unwrap();
            let theirs: Vec<(String, String)> = form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(
            parse_form(b"Body=hello+world&From=%2B1", 10).unwrap(),
            pairs(&[("Body", "hello world"), ("From", "+1")])
        );
    }

    #[test]
    fn hostile_bodies_are_refused() {
        assert_eq!(parse_form(b"Body=%zz", 10), Err(FormError::BadEscape));
        assert_eq!(parse_form(b"Body=%4", 10), Err(FormError::BadEscape));
        assert_eq!(parse_form(b"Body=100%", 10), Err(FormError::BadEscape));
        assert_eq!(parse_form(b"Body=%FF%FE", 10), Err(FormError::NotUtf8));
        assert_eq!(parse_form(b"Bo%00dy=x", 10), Err(FormError::Nul));
        assert_eq!(parse_form(b"Body=a%00b", 10), Err(FormError::Nul));
        assert_eq!(parse_form(b"a=1&b=2&c=3", 2), Err(FormError::TooManyFields));
        assert_eq!(parse_form(b"a=1&b=2&&", 2).unwrap().len(), 2);
    }
}
