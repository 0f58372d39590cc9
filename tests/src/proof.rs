//! A link proved by code, as a person on any channel does it: the code Switchboard texted to
//! the phone they named, read off the fake SMS provider.
use std::time::Duration;

use crate::TestApp;

impl TestApp {
    /// The six-digit code texted to `phone` (waits for it, 20 s at most).
    pub async fn code_texted_to(&self, phone: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let code = self
                .twilio
                .sent()
                .into_iter()
                .filter(|s| s.to == phone)
                .find_map(|s| {
                    s.body
                        .split(|c: char| !c.is_ascii_digit())
                        .find(|w| w.len() == 6)
                        .map(str::to_string)
                });
            if let Some(code) = code {
                return code;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no code was texted to {phone}: {:?}",
                self.twilio.sent()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
