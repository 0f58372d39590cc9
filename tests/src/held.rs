//! A person's SMS held on its way: numbered as the gateway numbers it, published to its inbound
//! subject at a moment of the test's choosing. It stands for a message accepted by the gateway
//! that a crashed or slow worker holds between the gateway and the session stage.
use switchboard_kit::arrival::{Admission, Arrival, ArrivalCounter};
use switchboard_kit::proto::InboundMessage;
use switchboard_kit::runtime::{Output, Runtime};

use crate::TestApp;

impl TestApp {
    /// Number the SMS `sid` from `from` the way the gateway does (same counter, same bucket).
    pub async fn number_sms(&self, from: &str, sid: &str) -> Arrival {
        let admission = ArrivalCounter::new(self.js.clone(), &self.topology)
            .admit("sms", from, sid, 0)
            .await
            .expect("arrival counter");
        let Admission::Accepted(arrival) = admission else {
            panic!("no limit was set, yet {admission:?}");
        };
        arrival
    }

    /// The numbered SMS `sid` from `from`, as the gateway makes it.
    pub fn numbered_sms(
        &self,
        from: &str,
        sid: &str,
        text: &str,
        arrival: Arrival,
    ) -> InboundMessage {
        let id = uuid::Uuid::now_v7().to_string();
        InboundMessage {
            id: id.clone(),
            channel: "sms".into(),
            provider: "twilio".into(),
            sender: from.into(),
            recipient: self.config.twilio.from_number.clone(),
            text: text.into(),
            provider_message_id: sid.into(),
            received_at_ms: switchboard_kit::now_ms(),
            correlation_id: id,
            arrival_seq: arrival.seq,
            arrival_epoch: arrival.epoch,
            ..Default::default()
        }
    }

    /// Publish `inbound` (an SMS made by [`TestApp::numbered_sms`]) to its sender's inbound
    /// subject under the gateway's dedupe id.
    pub async fn publish_numbered_sms(&self, inbound: &InboundMessage) {
        let rt = Runtime::new(
            self.js.clone(),
            self.topology.clone(),
            self.config.runtime.clone(),
        );
        let out = Output::new(
            self.topology.inbound_from("sms", &inbound.sender),
            format!(
                "twilio:{}:{}.{}",
                inbound.provider_message_id, inbound.arrival_epoch, inbound.arrival_seq
            ),
            inbound,
        );
        rt.publish("gateway", &out).await.expect("publish inbound");
    }
}
