//! Channel addresses.
use std::str::FromStr;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0:?} is not a phone number")]
pub struct InvalidPhone(pub String);

/// Normalise a phone number to E.164 (`+15551234567`). Numbers without a country code are read
/// in `default_region` (ISO 3166 code, e.g. `US`).
pub fn normalize_phone(raw: &str, default_region: &str) -> Result<String, InvalidPhone> {
    let trimmed = raw.trim();
    let region = phonenumber::country::Id::from_str(default_region).ok();
    let parsed = phonenumber::parse(region, trimmed).map_err(|_| InvalidPhone(raw.into()))?;
    if !phonenumber::is_viable(trimmed) {
        return Err(InvalidPhone(raw.into()));
    }
    Ok(parsed.format().mode(phonenumber::Mode::E164).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phone_numbers_are_normalised_to_e164() {
        assert_eq!(
            normalize_phone("+1 (415) 555-0100", "US").unwrap(),
            "+14155550100"
        );
        assert_eq!(
            normalize_phone("415-555-0100", "US").unwrap(),
            "+14155550100"
        );
        assert_eq!(
            normalize_phone("+44 20 7946 0958", "US").unwrap(),
            "+442079460958"
        );
        assert!(normalize_phone("not a number", "US").is_err());
        assert!(normalize_phone("", "US").is_err());
    }
}
