//! Twilio's webhook signature (`X-Twilio-Signature`).
//!
//! base64(HMAC-SHA1(auth token, full URL + every POST parameter name and value, sorted by
//! name)), compared in constant time. A name sent several times contributes each distinct value
//! once, in sorted order, as Twilio's own validators do.
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use subtle::ConstantTimeEq;

/// The signature Twilio sends for a POST of `params` to `url`.
pub fn twilio_signature(auth_token: &str, url: &str, params: &[(String, String)]) -> String {
    let sorted: std::collections::BTreeSet<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut mac = Hmac::<Sha1>::new_from_slice(auth_token.as_bytes()).expect("any key length");
    mac.update(url.as_bytes());
    for (k, v) in sorted {
        mac.update(k.as_bytes());
        mac.update(v.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

pub fn verify_twilio_signature(
    auth_token: &str,
    url: &str,
    params: &[(String, String)],
    signature: &str,
) -> bool {
    let expected = twilio_signature(auth_token, url, params);
    expected
        .as_bytes()
        .ct_eq(signature.trim().as_bytes())
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(k: &str, v: &str) -> (String, String) {
        (k.into(), v.into())
    }

    /// The example from Twilio's security documentation.
    #[test]
    fn matches_twilios_documented_example() {
        let params = vec![
            p("CallSid", "CA1234567890ABCDE"),
            p("Caller", "+14158675309"),
            p("Digits", "1234"),
            p("From", "+14158675309"),
            p("To", "+18005551212"),
        ];
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        let sig = twilio_signature("12345", url, &params);
        assert_eq!(sig, "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
        assert!(verify_twilio_signature("12345", url, &params, &sig));
    }

    /// Twilio's vector for a parameter sent several times.
    #[test]
    fn repeated_parameters_match_twilios_validators() {
        let params = vec![
            p("Sid", "CA123"),
            p("SidAccount", "AC123"),
            p("Digits", "5678"),
            p("Digits", "1234"),
            p("Digits", "1234"),
        ];
        let url = "https://mycompany.com/myapp.php?foo=1&bar=2";
        assert_eq!(
            twilio_signature("12345", url, &params),
            "IK+Dwps556ElfBT0I3Rgjkr1wJU="
        );
    }

    #[test]
    fn any_change_breaks_the_signature() {
        let params = vec![p("Body", "hello"), p("From", "+15550001")];
        let sig = twilio_signature("secret", "https://x/webhooks/twilio/sms", &params);
        let tampered = vec![p("Body", "hellO"), p("From", "+15550001")];
        assert!(!verify_twilio_signature(
            "secret",
            "https://x/webhooks/twilio/sms",
            &tampered,
            &sig
        ));
        assert!(!verify_twilio_signature(
            "other",
            "https://x/webhooks/twilio/sms",
            &params,
            &sig
        ));
        assert!(!verify_twilio_signature(
            "secret",
            "https://y/webhooks/twilio/sms",
            &params,
            &sig
        ));
        assert!(!verify_twilio_signature(
            "secret",
            "https://x/webhooks/twilio/sms",
            &params,
            ""
        ));
    }
}
