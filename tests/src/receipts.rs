//! Delivery receipts in the tests: Twilio's status callbacks, posted as Twilio posts them to
//! the `StatusCallback` a send asked for (signed with the account's auth token). Meta's
//! statuses are notifications like its messages (`TestApp::post_whatsapp`).
use crate::TestApp;

impl TestApp {
    /// Post Twilio's status callback for message `sid` (`sent`, `delivered`, `undelivered`,
    /// …, with Twilio's `ErrorCode` when given) to the URL its send asked for, signed with
    /// `token`.
    pub async fn twilio_reports_signed(
        &self,
        sid: &str,
        status: &str,
        error_code: Option<&str>,
        token: &str,
    ) -> reqwest::Response {
        let url = self
            .twilio
            .status_callback_of(sid)
            .unwrap_or_else(|| panic!("the send of {sid} asked for no status callback"));
        let sent = self
            .twilio
            .sent()
            .into_iter()
            .find(|m| m.sid == sid)
            .expect("a message the fake took");
        let mut params: Vec<(String, String)> = vec![
            ("AccountSid".into(), self.twilio.account_sid.clone()),
            ("ApiVersion".into(), "2010-04-01".into()),
            ("From".into(), sent.from),
            ("MessageSid".into(), sid.into()),
            ("MessageStatus".into(), status.into()),
            ("SmsSid".into(), sid.into()),
            ("SmsStatus".into(), status.into()),
            ("To".into(), sent.to),
        ];
        if let Some(code) = error_code {
            params.push(("ErrorCode".into(), code.into()));
        }
        // The callback names the public URL; this app's gateway is where it points.
        let path = url
            .strip_prefix(self.config.gateway.public_url.trim_end_matches('/'))
            .expect("a callback to this gateway");
        self.post_twilio_form(path, &params, token).await
    }

    /// [`TestApp::twilio_reports_signed`] with the account's auth token, as Twilio signs.
    pub async fn twilio_reports(
        &self,
        sid: &str,
        status: &str,
        error_code: Option<&str>,
    ) -> reqwest::Response {
        let token = self.config.twilio.auth_token.expose().to_string();
        self.twilio_reports_signed(sid, status, error_code, &token)
            .await
    }
}
