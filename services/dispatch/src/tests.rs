//! The dispatcher's decisions that need no database.
use super::*;

#[test]
fn a_turn_given_up_for_an_error_reading_expired_is_not_told_its_message_expired() {
    // A runner (or a library) whose error reads "expired token": the turn failed, the message
    // did not expire.
    let token = GiveUp::Rejected(anyhow::anyhow!("expired token: the runner's credentials"));
    assert!(token.to_string().starts_with(EXPIRED), "the case in point");
    assert!(!expired(&token));
    let budget = GiveUp::OutOfDeliveries {
        deliveries: 5,
        error: anyhow::anyhow!("expired token"),
    };
    assert!(!expired(&budget));
    // The turn that was too old when it could first run is.
    let old = GiveUp::Rejected(
        DispatchError::Expired {
            waited: chrono::Duration::hours(2),
            max_s: 3600,
        }
        .into(),
    );
    assert!(expired(&old));
}
