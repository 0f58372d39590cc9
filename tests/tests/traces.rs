//! One trace per turn: with `[telemetry] otlp_endpoint` set, an SMS turn is one OpenTelemetry
//! trace from the gateway's request to Twilio's send, across NATS and the runner's HTTP call,
//! received by an OTLP collector started here. (One test in this file: the exporter is the
//! test process's, installed before the app starts.)
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use switchboard_e2e::fakes::{CollectedSpan, FakeCollector};
use switchboard_e2e::runner_host::{agent_host, serve_runner};
use switchboard_e2e::{AppOptions, spawn_app_with};
use switchboard_kit::config::{LogFormat, Secret};
use switchboard_kit::stage::StageOverrides;
use switchboard_kit::trace::TelemetryConfig;

const PERSON: &str = "+14155550142";
const OTHERS: [&str; 2] = ["+14155550143", "+14155550144"];
const WAIT: Duration = Duration::from_secs(30);

const ENGINE: &str = r#"#!/bin/sh
printf '{"payloads":[{"text":"traced"}],"meta":{"agentMeta":{"sessionId":"%s"}}}\n' "$1""#;

/// The one span of the turn named `name`.
fn one<'a>(spans: &'a [&'a CollectedSpan], name: &str) -> &'a CollectedSpan {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(
        found.len(),
        1,
        "one {name:?} span in the turn's trace, found {}: {:#?}",
        found.len(),
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

#[tokio::test]
async fn an_sms_turn_is_one_trace_from_the_gateways_request_to_the_providers_send() {
    let collector = FakeCollector::start().await;
    let traces = switchboard_kit::telemetry::init(
        LogFormat::Text,
        &TelemetryConfig {
            otlp_endpoint: Some(collector.url.clone()),
            ..Default::default()
        },
        "switchboard-tests",
    )
    .expect("the exporter starts");
    assert!(
        switchboard_kit::trace::enabled(),
        "this test's process exports spans"
    );

    let host = agent_host(ENGINE);
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let _runner = serve_runner(&host, addr).await;
    let url = format!("http://{addr}");
    let app = spawn_app_with(AppOptions {
        tweak: Box::new(move |c| {
            c.agents[0].runner_url = url;
            c.agents[0].token = Secret::new("runner-token");
            // log-inbound waits up to 2 s to fill a batch (the runtime caps it at half of
            // ack_wait, 1 s here): two people's messages sent together are logged in one.
            c.stages.insert(
                "log-inbound".into(),
                StageOverrides {
                    linger_ms: Some(2_000),
                    ..Default::default()
                },
            );
        }),
        ..Default::default()
    })
    .await;

    // The caller sends a trace context of its own, sampled: the public gateway does not let an
    // anonymous caller decide (it links to it and starts the turn's own trace).
    const FORGED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let params = app.sms_params(
        PERSON,
        "where does this go?",
        "SMtraced0000000000000000000000001",
    );
    let signature = app.sign(&params);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();
    let resp = reqwest::Client::new()
        .post(format!("{}/webhooks/twilio/sms", app.gateway_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("X-Twilio-Signature", signature)
        .header("traceparent", FORGED)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sent[0].body, "traced");
    app.settle().await;
    let rows = app.log_rows().await;
    let inbound = rows.iter().find(|r| r.direction == "inbound").unwrap();
    let correlation = inbound.correlation_id.clone();
    let session = inbound.session_id.to_string();

    // Every stage has finished its span once the reply is sent and the stages are settled.
    traces.flush();
    let spans = collector
        .wait_for(WAIT, |spans| {
            spans.iter().any(|s| s.name == "send twilio")
                && spans.iter().any(|s| s.name == "log-outbound")
        })
        .await;

    // The turn's trace is the one its gateway request began.
    let request = spans
        .iter()
        .find(|s| {
            s.attribute("correlation_id") == Some(correlation.as_str())
                && s.name.starts_with("POST /webhooks")
        })
        .unwrap_or_else(|| {
            panic!("the gateway's request span, with the correlation id: {spans:#?}")
        });
    assert!(
        request.parent_span_id.is_empty(),
        "the gateway's request is the root, whatever the caller sent"
    );
    assert_ne!(request.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(
        request.links,
        vec![(
            "0af7651916cd43dd8448eb211c80319c".to_string(),
            "b7ad6b7169203331".to_string()
        )],
        "the caller's context is linked"
    );
    let turn: Vec<&CollectedSpan> = spans
        .iter()
        .filter(|s| s.trace_id == request.trace_id)
        .collect();

    // Nothing about this message went into another trace.
    for s in &spans {
        if s.attribute("correlation_id") == Some(correlation.as_str()) {
            assert_eq!(
                s.trace_id, request.trace_id,
                "{} is in a trace of its own",
                s.name
            );
        }
    }

    // Every stage's span, each the child of the one that handed it the work.
    let identify = one(&turn, "identify");
    let session_span = one(&turn, "session");
    let dispatch = one(&turn, "dispatch");
    let runner_call = turn
        .iter()
        .find(|s| s.name == "POST /run" && s.parent_span_id == dispatch.span_id)
        .unwrap_or_else(|| panic!("dispatch's runner call: {turn:#?}"));
    let runner_served = turn
        .iter()
        .find(|s| s.name == "POST /run" && s.parent_span_id == runner_call.span_id)
        .unwrap_or_else(|| panic!("the runner continued the call's trace: {turn:#?}"));
    let engine = one(&turn, "run script");
    let deliver = one(&turn, "deliver");
    let send = one(&turn, "send twilio");
    let log_inbound = one(&turn, "log-inbound");
    let log_outbound = one(&turn, "log-outbound");
    let parent_of = |child: &CollectedSpan, parent: &CollectedSpan, what: &str| {
        assert_eq!(child.parent_span_id, parent.span_id, "{what}");
    };
    parent_of(
        identify,
        request,
        "identify read what the gateway published",
    );
    parent_of(session_span, identify, "session read identify's output");
    parent_of(dispatch, session_span, "dispatch read session's turn");
    parent_of(
        engine,
        runner_served,
        "the engine ran within the runner's call",
    );
    parent_of(deliver, dispatch, "deliver read dispatch's reply");
    parent_of(send, deliver, "the provider's send is deliver's");
    assert_eq!(log_inbound.trace_id, request.trace_id);
    assert_eq!(log_outbound.trace_id, request.trace_id);

    // No span of the turn points at a parent the trace does not hold.
    let ids: HashMap<&str, &str> = turn
        .iter()
        .map(|s| (s.span_id.as_str(), s.name.as_str()))
        .collect();
    for s in &turn {
        assert!(
            s.parent_span_id.is_empty() || ids.contains_key(s.parent_span_id.as_str()),
            "{} has a parent outside the trace",
            s.name
        );
    }
    assert_eq!(
        turn.iter().filter(|s| s.parent_span_id.is_empty()).count(),
        1,
        "one root"
    );

    // Who did what, as an operator reads it.
    for s in [identify, session_span, dispatch, deliver] {
        assert_eq!(
            s.attribute("correlation_id"),
            Some(correlation.as_str()),
            "{}",
            s.name
        );
    }
    for s in [session_span, dispatch, deliver] {
        assert_eq!(
            s.attribute("session_id"),
            Some(session.as_str()),
            "{}",
            s.name
        );
    }
    assert_eq!(
        runner_call.kind,
        switchboard_e2e::fakes::collector::SpanKind::Client
    );
    assert_eq!(
        runner_served.kind,
        switchboard_e2e::fakes::collector::SpanKind::Server
    );
    assert_eq!(request.service, "switchboard-tests");

    // A batch stage: two people's messages logged in one batch. Each message's span stays in
    // its own turn's trace; the batch's span links to both.
    let (a, b) = tokio::join!(
        app.send_sms(OTHERS[0], "one of two"),
        app.send_sms(OTHERS[1], "two of two")
    );
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    app.wait_for_sms(3, WAIT).await;
    app.settle().await;
    traces.flush();
    let spans = collector
        .wait_for(WAIT, |spans| {
            spans.iter().any(|s| s.name == "log-inbound batch")
                && spans.iter().filter(|s| s.name == "send twilio").count() == 3
        })
        .await;
    let batches: Vec<&CollectedSpan> = spans
        .iter()
        .filter(|s| s.name == "log-inbound batch")
        .collect();
    assert_eq!(batches.len(), 1, "one batch of two: {batches:#?}");
    assert_eq!(batches[0].links.len(), 2, "{:#?}", batches[0]);
    let mut linked_traces = HashSet::new();
    for (trace, span) in &batches[0].links {
        assert!(
            spans
                .iter()
                .any(|s| &s.trace_id == trace && &s.span_id == span && s.name == "log-inbound"),
            "the batch links to each message's own log-inbound span"
        );
        assert!(
            spans.iter().any(|s| &s.trace_id == trace
                && s.name.starts_with("POST /webhooks")
                && s.parent_span_id.is_empty()),
            "in the trace the message's gateway request began"
        );
        linked_traces.insert(trace.clone());
    }
    assert_eq!(linked_traces.len(), 2, "each message keeps its own trace");
    assert!(!linked_traces.contains(&request.trace_id));
    app.shutdown().await;
}
