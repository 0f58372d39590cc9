//! On a three-node NATS JetStream cluster (`make run CLUSTER=3`: the stack tool's cluster mode,
//! `runtime.stream_replicas = 3`) the product runs unchanged: its streams are replicated on all
//! three nodes, and a person texting while the node leading the work stream is SIGKILLed and
//! started again is answered every message, once each, in order.
//!
//! The cluster is a stack of its own (ports 26222-26224, routes 26232-26234, monitoring
//! 27222-27224, Postgres 26432), brought up here and destroyed at the end; the app's database is
//! the shared test stack's.
use std::process::Command;
use std::time::{Duration, Instant};

use switchboard_e2e::{spawn_app_configured, stack_bin};

const STACK: &str = "nats-cluster-test";
const WAIT: Duration = Duration::from_secs(60);
const PERSON: &str = "+14155550177";

/// `stack <args>` with a cluster of three for `up`; stdout.
fn stack(args: &[&str]) -> String {
    let out = Command::new(stack_bin().expect("the stack tool is built"))
        .args(args)
        .env("SB_STACK_FAST", "1")
        .env("SB_STACK_NATS_CLUSTER", "3")
        .env_remove("SB_NATS_MONITOR_PORT")
        .output()
        .expect("the stack tool runs");
    assert!(
        out.status.success(),
        "stack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Destroys the cluster's stack when the test ends, passed or failed.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(stack_bin().expect("the stack tool is built"))
            .args(["destroy", STACK])
            .output();
    }
}

fn exported(env: &str, key: &str) -> String {
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("export {key}=")))
        .unwrap_or_else(|| panic!("stack up printed no {key}:\n{env}"))
        .to_string()
}

async fn stream_info(
    js: &async_nats::jetstream::Context,
    name: &str,
) -> async_nats::jetstream::stream::Info {
    let mut stream = js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().clone()
}

/// Node i of the server name `switchboard-<stack>-<i>`.
fn node_of(server: &str) -> String {
    server
        .rsplit_once('-')
        .expect("a node's server name")
        .1
        .to_string()
}

#[tokio::test]
async fn on_a_three_node_cluster_a_person_is_answered_in_order_through_the_loss_of_the_work_streams_leader()
 {
    let _ = Command::new(stack_bin().unwrap())
        .args(["destroy", STACK])
        .output();
    let env = stack(&["up", STACK, "26222", "26432", "27222"]);
    let _cluster = Cluster;
    let nats_url = exported(&env, "SB_NATS_URL");
    assert_eq!(nats_url.split(',').count(), 3, "one URL per node");
    assert_eq!(exported(&env, "SB_RUNTIME__STREAM_REPLICAS"), "3");
    let app = spawn_app_configured(move |c| {
        c.nats_url = nats_url.into();
        c.runtime.stream_replicas = 3;
    })
    .await;

    // Every stream is kept by all three nodes.
    let stream = app.topology.work_stream();
    let info = stream_info(&app.js, &stream).await;
    assert_eq!(info.config.num_replicas, 3);
    let cluster = info
        .cluster
        .clone()
        .expect("a clustered stream says where it lives");
    assert_eq!(cluster.replicas.len(), 2, "{cluster:?}");
    for name in [app.topology.events_stream(), app.topology.dlq_stream()] {
        let info = stream_info(&app.js, &name).await;
        assert_eq!(info.config.num_replicas, 3, "{name}");
    }

    for text in ["one", "two"] {
        assert_eq!(app.send_sms(PERSON, text).await.status(), 200);
    }
    app.wait_for_sms(2, WAIT).await;

    // The work stream's leader is SIGKILLed and started again on its data while the person
    // goes on texting; each message is retried until the gateway takes it, as Twilio does.
    let leader = node_of(&cluster.leader.expect("the work stream has a leader"));
    let crash =
        tokio::task::spawn_blocking(move || stack(&["crash", STACK, &format!("nats-{leader}")]));
    for text in ["three", "four", "five"] {
        let deadline = Instant::now() + WAIT;
        let sid = format!("SM{}", uuid::Uuid::new_v4().simple());
        loop {
            let status = app.send_sms_with_sid(PERSON, text, &sid).await.status();
            if status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{text:?} never accepted (last {status})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    crash.await.unwrap();
    let sent = app.wait_for_sms(5, WAIT).await;
    let bodies: Vec<String> = sent.into_iter().map(|m| m.body).collect();
    assert_eq!(
        bodies,
        [
            "echo: one",
            "echo: two",
            "echo: three",
            "echo: four",
            "echo: five"
        ],
        "every message answered once, in order"
    );
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 5, "a reply was sent twice");
    let info = stream_info(&app.js, &stream).await;
    assert!(
        info.cluster.and_then(|c| c.leader).is_some(),
        "the work stream has a leader again"
    );
    app.shutdown().await;
}
