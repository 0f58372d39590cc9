//! Channel addresses.
use std::str::FromStr;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0:?} is not a phone number")]
pub struct InvalidPhone(pub String);

/// Normalise a phone number to E.164 (`+15551234567`). Numbers without a country code are read
/// in `default_region` (ISO 3166 code, e.g. `US`); a number written with `+` means the same
/// everywhere, so the region is not used for it.
pub fn normalize_phone(raw: &str, default_region: &str) -> Result<String, InvalidPhone> {
    let trimmed = raw.trim();
    let region = if trimmed.starts_with('+') {
        None
    } else {
        phonenumber::country::Id::from_str(default_region).ok()
    };
    let parsed = phonenumber::parse(region, trimmed).map_err(|_| InvalidPhone(raw.into()))?;
    if !phonenumber::is_viable(trimmed) {
        return Err(InvalidPhone(raw.into()));
    }
    let e164 = parsed.format().mode(phonenumber::Mode::E164).to_string();
    // E.164 allows at most 15 digits; phonenumber 0.3 formats longer input without complaint.
    if e164.len() > 16 {
        return Err(InvalidPhone(raw.into()));
    }
    // The result must read back as itself, or the directory (which stores what an operator
    // typed, normalised) and the gateway (which normalises the E.164 `From` Twilio sends) could
    // disagree about a number, and a reply could go to another number. Found by the fuzz target
    // `phone_normalize`: with region US, phonenumber 0.3 reads "+80012345678" as "+8002345678".
    match phonenumber::parse(None, &e164) {
        Ok(again) if again.format().mode(phonenumber::Mode::E164).to_string() == e164 => Ok(e164),
        _ => Err(InvalidPhone(raw.into())),
    }
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
        // A number written with + is read the same in every region.
        for region in ["US", "GB", "IN"] {
            assert_eq!(
                normalize_phone("+800 1234 5678", region).unwrap(),
                "+80012345678"
            );
        }
        // Longer than E.164 allows (15 digits).
        assert!(normalize_phone("(615) 555-0 7946 0958", "GB").is_err());
    }
}
