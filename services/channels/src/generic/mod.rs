//! Signed generic webhooks: any system posts JSON to `POST /webhooks/generic/<source>` signed
//! with the source's secret, and gets the replies POSTed to its `callback_url`, signed the same
//! way (`docs/webhooks.md`).
//!
//! Both directions carry `X-Switchboard-Timestamp: <unix seconds>` and
//! `X-Switchboard-Signature: sha256=<hex>`, the lowercase hex of HMAC-SHA256 keyed by the secret
//! over `<timestamp>.<raw body>`. Signing the timestamp with the body is what lets a receiver
//! refuse an old request replayed as it was.
pub mod send;
pub mod webhook;

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub use send::GenericWebhookSender;
pub use webhook::{GenericEvent, GenericWebhook, parse_generic_event};

use crate::Adapter;

/// The provider name messages and replies carry.
pub const PROVIDER: &str = "generic";
/// The logical channel (`[channels.webhook]`, contact kind `webhook_sender`).
pub const CHANNEL: &str = "webhook";
pub const TIMESTAMP_HEADER: &str = "x-switchboard-timestamp";
pub const SIGNATURE_HEADER: &str = "x-switchboard-signature";
/// On callbacks: `<reply id>:<part>`, the same for every attempt of one part, so a receiver
/// can drop a redelivery.
pub const DELIVERY_HEADER: &str = "x-switchboard-delivery";

pub const ADAPTER: Adapter = Adapter {
    provider: PROVIDER,
    webhook: Some(|config| Arc::new(GenericWebhook::new(config))),
    egress: Some(|config| Arc::new(GenericWebhookSender::new(config.webhooks.clone()))),
    media: None,
};

/// The signature header's value for `body` sent at `timestamp`:
/// `sha256=<lowercase hex of HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Whether `signature` (a header value) is the signature of `body` at `timestamp`, compared in
/// constant time. Upper-case hex is accepted; anything but `sha256=<64 hex digits>` is not.
pub fn verify(secret: &[u8], timestamp: &str, body: &[u8], signature: &str) -> bool {
    let Some(hex) = signature.trim().strip_prefix("sha256=") else {
        return false;
    };
    // Strict: hex digits only (`u8::from_str_radix` would also take a `+`).
    let Ok(given) = hex::decode(hex) else {
        return false;
    };
    let expected = mac(secret, timestamp, body).finalize().into_bytes();
    given.len() == expected.len() && bool::from(given.as_slice().ct_eq(expected.as_slice()))
}

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed independently with Python's `hmac` module:
    /// `hmac.new(b"demo-webhook-secret", b'1700000000.{"id":"evt-1","user":{"id":"u-42"},
    /// "text":"hello"}', hashlib.sha256).hexdigest()`.
    const KNOWN: &str = "sha256=01fbad297e9a68cddf8f71ddc1ebd97b8cd88644cb8afca88a12d5991dc56e2e";
    const BODY: &[u8] = br#"{"id":"evt-1","user":{"id":"u-42"},"text":"hello"}"#;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body_in_lowercase_hex() {
        assert_eq!(sign(b"demo-webhook-secret", "1700000000", BODY), KNOWN);
        // More vectors from the same Python: an empty body, a UTF-8 key and body (bytes, not
        // characters, are signed).
        assert_eq!(
            sign(b"s", "0", b""),
            "sha256=2572e102ebbc88d57bc0ef48471ee28bb7fc8c6e9c0558b3c8e5d276f84ac9c3"
        );
        assert_eq!(
            sign(
                "clé".as_bytes(),
                "1800000000",
                "{\"text\":\"héllo ✓\"}".as_bytes()
            ),
            "sha256=6cfc184fa188253328a3f2313cac6018a6ae4f9459c6871f64cd59dceade2b19"
        );
    }

    #[test]
    fn only_the_exact_signature_of_this_timestamp_and_body_verifies() {
        let secret = b"demo-webhook-secret";
        assert!(verify(secret, "1700000000", BODY, KNOWN));
        assert!(verify(
            secret,
            "1700000000",
            BODY,
            &KNOWN.to_uppercase().replace("SHA256=", "sha256=")
        ));
        assert!(!verify(b"another-secret", "1700000000", BODY, KNOWN));
        assert!(
            !verify(secret, "1700000001", BODY, KNOWN),
            "timestamp is signed"
        );
        let changed = br#"{"id":"evt-1","user":{"id":"u-43"},"text":"hello"}"#;
        assert!(
            !verify(secret, "1700000000", changed, KNOWN),
            "body is signed"
        );
        for malformed in [
            "",
            "sha256=",
            &KNOWN[7..],
            &KNOWN[..70],
            &format!("{KNOWN}00"),
            "sha1=01fbad297e9a68cddf8f71ddc1ebd97b8cd88644cb8afca88a12d5991dc56e2e",
            "sha256=zzfbad297e9a68cddf8f71ddc1ebd97b8cd88644cb8afca88a12d5991dc56e2e",
            "sha256=é1fbad297e9a68cddf8f71ddc1ebd97b8cd88644cb8afca88a12d5991dc56e2",
            // A sign where the leading zero digit is: integer parsing would read it as 0x1.
            "sha256=+1fbad297e9a68cddf8f71ddc1ebd97b8cd88644cb8afca88a12d5991dc56e2e",
        ] {
            assert!(
                !verify(secret, "1700000000", BODY, malformed),
                "{malformed:?}"
            );
        }
    }
}
