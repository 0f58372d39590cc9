use super::*;
use crate::stage::StageSpec;

#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
}

#[test]
fn a_busy_connection_pool_is_a_wait_and_other_database_errors_are_failures() {
    let busy = StageError::transient(StoreError::from(sqlx::Error::PoolTimedOut));
    match waits_for_capacity(busy, 0) {
        StageError::Defer(after, why) => {
            let first = Duration::from_millis(250);
            assert!(after <= first && after >= first / 2, "{after:?}");
            assert!(why.contains("database connection"), "{why}");
        }
        other => panic!("not a wait: {other:?}"),
    }
    let down = StageError::transient(StoreError::from(sqlx::Error::PoolClosed));
    assert!(matches!(
        waits_for_capacity(down, 0),
        StageError::Transient(_)
    ));
    let wrong = StageError::permanent(StoreError::from(sqlx::Error::PoolTimedOut));
    assert!(matches!(
        waits_for_capacity(wrong, 0),
        StageError::Permanent(_)
    ));
}

/// A batch stage that answers one outcome whatever it is given.
struct Miscounts;

impl BatchStage for Miscounts {
    type Input = DeadLetter;
    const SPEC: StageSpec = StageSpec::new("miscounts", crate::stage::Source::Work("reply"));

    async fn handle_batch(&self, _: Vec<DeadLetter>, _: &[Attempt]) -> Vec<Outcome> {
        vec![Ok(Vec::new())]
    }
}

#[tokio::test]
async fn a_batch_stage_that_miscounts_its_outcomes_settles_no_input_on_them() {
    let inputs = vec![DeadLetter::default(), DeadLetter::default()];
    let outcomes = handle(
        &Miscounts,
        inputs,
        &[Attempt::default(), Attempt::default()],
    )
    .await;
    assert_eq!(outcomes.len(), 2);
    for o in outcomes {
        match o {
            Err(StageError::Transient(e)) => {
                assert!(e.to_string().contains("1 outcomes for 2 inputs"), "{e}")
            }
            other => panic!("not a failure: {other:?}"),
        }
    }
    // One input, one outcome: taken as it is.
    let one = handle_one(&Miscounts, DeadLetter::default(), &Attempt::default()).await;
    assert!(one.is_ok());
}

#[test]
fn failed_messages_back_off_by_the_configured_policy() {
    let rt = RuntimeConfig {
        retry_base_ms: 100,
        retry_max_ms: 1000,
        ..Default::default()
    };
    let spec = StageSpec::new("s", crate::stage::Source::Work("reply"));
    let p = StageOptions::resolve(&spec, &rt, None).retry;
    assert_eq!(p.delay(1), Duration::from_millis(100));
    assert_eq!(p.delay(10), Duration::from_millis(1000));
}

#[test]
fn a_message_declaring_another_type_than_the_stage_reads_is_refused_with_the_cause() {
    use prost::Name as _;
    let mut headers = HeaderMap::new();
    headers.insert(
        HEADER_TYPE,
        crate::proto::MessageLogged::full_name().as_str(),
    );
    assert_eq!(
        type_mismatch::<DeadLetter>(Some(&headers), "sb.identified").as_deref(),
        Some(
            format!(
                "a {} message on sb.identified; this stage reads {}",
                crate::proto::MessageLogged::full_name(),
                DeadLetter::full_name()
            )
            .as_str()
        )
    );
    let mut own = HeaderMap::new();
    own.insert(HEADER_TYPE, DeadLetter::full_name().as_str());
    assert_eq!(type_mismatch::<DeadLetter>(Some(&own), "sb.reply"), None);
    // Published by hand without the header: decoded as before.
    assert_eq!(type_mismatch::<DeadLetter>(None, "sb.reply"), None);
    assert_eq!(
        type_mismatch::<DeadLetter>(Some(&HeaderMap::new()), "sb.reply"),
        None
    );
}
