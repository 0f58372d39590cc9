//! The product under load: its configuration (one TOML file per worker process), the worker
//! processes, and a client that posts Twilio-signed SMS to its gateway.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use async_nats::jetstream;
use switchboard::stages;
use switchboard_kit::Topology;
use switchboard_kit::config::{AgentConfig, Config, Secret};
use switchboard_kit::startup::App;

use super::observers::LoadTwilio;
use super::procs::Workers;

pub const ACCOUNT_SID: &str = "ACload00000000000000000000000000";
pub const AUTH_TOKEN: &str = "load-auth-token";
pub const TWILIO_NUMBER: &str = "+15555550199";
/// The number the chaos run's `collect` people text by Twilio
/// (`[channels.sms.recipients]` gives it to [`COLLECT_AGENT`]).
pub const TWILIO_COLLECT_NUMBER: &str = "+15555550197";
/// The agent load runs talk to (`followup`).
pub const AGENT: &str = "reggie_oc";
/// The second agent of a chaos run: the same runner, `queue_mode = "collect"`.
pub const COLLECT_AGENT: &str = "reggie_collect";
/// The third agent of a chaos run: a front desk everyone talks to in one session (its own
/// `scope = "main"`, an identity of its own), on the same runner.
pub const SHARED_AGENT: &str = "front_desk";
/// The number the chaos run's front-desk people text by Twilio.
pub const TWILIO_SHARED_NUMBER: &str = "+15555550195";

/// The knobs a run may turn (all of them are ordinary configuration keys).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Knobs {
    /// `runtime.batch`
    pub batch: usize,
    /// `runtime.concurrency`
    pub concurrency: usize,
    /// `agents[].concurrency` (runner calls at once per dispatcher)
    pub agent_concurrency: usize,
    /// `dispatch.concurrency` (turns one dispatcher runs at once)
    pub dispatch_concurrency: usize,
    /// `runtime.max_ack_pending` (unacked messages per stage consumer)
    pub max_ack_pending: i64,
    /// `runtime.ack_wait_ms`
    pub ack_wait_ms: u64,
    /// `runtime.turn_partitions`
    pub partitions: u32,
    /// `agents[].timeout_s`
    pub runner_timeout_s: u64,
    /// `runtime.retry_base_ms` / `retry_max_ms`
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// `runtime.max_deliver`
    pub max_deliver: u64,
    /// `dispatch.hold_timeout_ms`
    pub hold_timeout_ms: u64,
    /// `runtime.shutdown_grace_ms`
    pub shutdown_grace_ms: u64,
    /// `runtime.db_pool_size` (0: derived from `concurrency`)
    pub db_pool_size: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        let d = Config::default();
        Self {
            batch: d.runtime.batch,
            concurrency: d.runtime.concurrency,
            agent_concurrency: 16,
            dispatch_concurrency: switchboard_dispatch::STAGE.spec.concurrency.unwrap_or(256),
            max_ack_pending: d.runtime.max_ack_pending,
            ack_wait_ms: d.runtime.ack_wait_ms,
            partitions: d.runtime.turn_partitions,
            runner_timeout_s: 30,
            retry_base_ms: d.runtime.retry_base_ms,
            retry_max_ms: d.runtime.retry_max_ms,
            max_deliver: d.runtime.max_deliver,
            hold_timeout_ms: d.dispatch.hold_timeout_ms,
            shutdown_grace_ms: d.runtime.shutdown_grace_ms,
            db_pool_size: d.runtime.db_pool_size,
        }
    }
}

/// Ports the load runs' processes take: a killed gateway is started again on its port, so it
/// must not be where every test's "any free port" probes (`net::FREE_PORTS`); a test binding
/// there during the restart once took the chaos run's gateway port.
pub const LOAD_PORTS: std::ops::Range<u16> = 30000..32000;

/// A free loopback port of [`LOAD_PORTS`] (bound, read, released).
pub fn free_port() -> u16 {
    switchboard_kit::net::free_port_in("127.0.0.1", LOAD_PORTS).expect("a free port")
}

/// The configuration of one run on `stack`: a fresh database and a subject prefix of its own
/// (named after `run`), the given runner and Twilio fakes, and `knobs`.
pub async fn config_for_run(
    stack: &super::stack::Stack,
    run: &str,
    runner_url: &str,
    twilio: &LoadTwilio,
    knobs: &Knobs,
) -> anyhow::Result<Config> {
    let database_url = stack.fresh_database(run).await?;
    let prefix = format!("{run}{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    Ok(config(&Setup {
        nats_url: &stack.nats_url,
        database_url: &database_url,
        prefix: &prefix,
        runner_url,
        twilio,
        knobs,
    }))
}

pub struct Setup<'a> {
    pub nats_url: &'a str,
    pub database_url: &'a str,
    pub prefix: &'a str,
    pub runner_url: &'a str,
    pub twilio: &'a LoadTwilio,
    pub knobs: &'a Knobs,
}

/// The configuration every worker of a run shares.
pub fn config(s: &Setup<'_>) -> Config {
    let gateway = format!("127.0.0.1:{}", free_port());
    let k = s.knobs;
    let mut c = Config {
        nats_url: s.nats_url.into(),
        database_url: s.database_url.into(),
        subject_prefix: s.prefix.into(),
        ..Config::default()
    };
    c.gateway.http_addr = gateway.clone();
    c.gateway.public_url = format!("http://{gateway}");
    c.twilio.account_sid = s.twilio.account_sid.clone();
    c.twilio.auth_token = Secret::new(s.twilio.auth_token.clone());
    c.twilio.from_number = TWILIO_NUMBER.into();
    c.twilio.api_base = s.twilio.url.clone();
    switchboard_e2e::local_embedder_from_stack(&mut c.embedding);
    c.agents = vec![AgentConfig {
        name: AGENT.into(),
        identity: "reggie".into(),
        engine: "openclaw".into(),
        runner_url: s.runner_url.into(),
        token: Secret::new("runner-token"),
        timeout_s: k.runner_timeout_s,
        concurrency: k.agent_concurrency,
        ..Default::default()
    }];
    c.runtime.batch = k.batch;
    c.runtime.concurrency = k.concurrency;
    c.runtime.ack_wait_ms = k.ack_wait_ms;
    c.runtime.turn_partitions = k.partitions;
    c.runtime.retry_base_ms = k.retry_base_ms;
    c.runtime.retry_max_ms = k.retry_max_ms;
    c.runtime.max_deliver = k.max_deliver;
    c.runtime.shutdown_grace_ms = k.shutdown_grace_ms;
    c.runtime.max_ack_pending = k.max_ack_pending;
    c.runtime.db_pool_size = k.db_pool_size;
    c.dispatch.hold_timeout_ms = k.hold_timeout_ms;
    c.stages.insert(
        "dispatch".into(),
        switchboard_kit::stage::StageOverrides {
            concurrency: Some(k.dispatch_concurrency),
            ..Default::default()
        },
    );
    c
}

/// The product: its worker processes on one configuration.
pub struct Pipeline {
    pub config: Config,
    pub workers: Workers,
    pub gateway: GatewayClient,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub db: sqlx::PgPool,
    config_dir: PathBuf,
    /// The stages the started workers run (a run may leave some out, e.g. the memory workers).
    running: Vec<&'static switchboard_kit::Registration>,
}

/// Worker binaries in start order, with how many replicas of each.
pub fn layout(replicas: &[(&'static str, usize)]) -> Vec<&'static str> {
    replicas
        .iter()
        .flat_map(|(n, r)| std::iter::repeat_n(*n, *r))
        .collect()
}

impl Pipeline {
    /// Apply migrations and the topology, write one config file per worker (`per_worker` may
    /// change a worker's copy), start the workers in `order`, and wait until all of them pull.
    pub async fn start(
        dir: &Path,
        config: Config,
        order: &[&str],
        per_worker: impl Fn(&str, &mut Config),
    ) -> anyhow::Result<Pipeline> {
        let config_dir = dir.join("config");
        std::fs::create_dir_all(&config_dir)?;
        let app = App::connect(config.clone(), "load-harness")
            .await
            .context("connecting the harness to the stack")?;
        app.prepare(stages::ALL).await?;
        let mut workers = Workers::new(&dir.join("logs"))?;
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        for name in order {
            let n = counts.entry(name).or_default();
            let mut c = config.clone();
            per_worker(name, &mut c);
            let path = config_dir.join(format!("{name}-{n}.toml"));
            *n += 1;
            switchboard_e2e::write_private(&path, &toml::to_string(&c).context("config as TOML")?)?;
            workers.spawn(name, &path)?;
        }
        let pipeline = Pipeline {
            gateway: GatewayClient::new(&config),
            js: app.js.clone(),
            topology: app.topology.clone(),
            db: app.db.clone(),
            config,
            workers,
            config_dir,
            running: stages::select(
                &order
                    .iter()
                    .filter(|n| **n != "gateway")
                    .collect::<Vec<_>>(),
            )?,
        };
        pipeline.wait_ready(Duration::from_secs(60)).await?;
        Ok(pipeline)
    }

    pub fn config_dir(&self) -> &Path {
        &self.config_dir
    }

    /// The gateway answers `/readyz` and the consumer of every stage the run started has a pull
    /// waiting.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::new();
        loop {
            let gateway_ok = http
                .get(format!("{}/readyz", self.gateway.base))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            let mut pulling = 0;
            for stage in &self.running {
                let stream = self.topology.stream_of(stage.spec.reads);
                if let Ok(stream) = self.js.get_stream(stream).await
                    && let Ok(mut c) = stream
                        .get_consumer::<jetstream::consumer::pull::Config>(stage.spec.name)
                        .await
                    && c.info().await.is_ok_and(|i| i.num_waiting > 0)
                {
                    pulling += 1;
                }
            }
            if gateway_ok && pulling == self.running.len() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let dead = self.workers_dead_hint();
                bail!(
                    "the pipeline was not ready within {timeout:?} (gateway ready: {gateway_ok}, stages pulling: {pulling}/{}){dead}",
                    self.running.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn workers_dead_hint(&self) -> String {
        format!(
            "; worker logs in {}",
            self.config_dir
                .parent()
                .unwrap_or(&self.config_dir)
                .join("logs")
                .display()
        )
    }

    /// Messages not yet acked, summed over the stages: (pending, ack pending).
    pub async fn backlog(&self) -> anyhow::Result<(u64, u64)> {
        let by_stage = self.backlog_by_stage().await?;
        Ok(by_stage
            .iter()
            .fold((0, 0), |(p, a), (_, sp, sa)| (p + sp, a + sa)))
    }

    /// Messages not yet acked, per stage: (stage, pending, ack pending).
    pub async fn backlog_by_stage(&self) -> anyhow::Result<Vec<(&'static str, u64, u64)>> {
        let stream = self.js.get_stream(self.topology.work_stream()).await?;
        let mut by_stage = Vec::new();
        // The reply path's stages: the memory workers follow the events stream on their own
        // and are not part of a bench or chaos run's pipeline.
        let reply_path = stages::ALL
            .iter()
            .filter(|r| matches!(r.spec.reads, switchboard_kit::Source::Work(_)))
            .map(|r| r.spec.name);
        for stage in reply_path {
            let mut c: jetstream::consumer::PullConsumer = stream
                .get_consumer(stage)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = c.info().await?;
            by_stage.push((stage, info.num_pending, info.num_ack_pending as u64));
        }
        Ok(by_stage)
    }

    /// Wait until every stage has consumed and acked everything, three checks in a row.
    pub async fn settle(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        let deadline = started + timeout;
        let mut quiet = 0;
        let mut told = Duration::ZERO;
        while quiet < 3 {
            if Instant::now() >= deadline {
                return false;
            }
            let backlog = self.backlog_by_stage().await;
            quiet = match &backlog {
                Ok(b) if b.iter().all(|(_, p, a)| p + a == 0) => quiet + 1,
                _ => 0,
            };
            // A slow settle says what it waits for, every 5 s.
            if quiet == 0 && started.elapsed() >= told + Duration::from_secs(5) {
                told = started.elapsed();
                if let Ok(b) = &backlog {
                    let left: Vec<String> = b
                        .iter()
                        .filter(|(_, p, a)| p + a > 0)
                        .map(|(s, p, a)| format!("{s} {p} pending, {a} unacked"))
                        .collect();
                    eprintln!(
                        "settling for {:.0} s: {}",
                        told.as_secs_f64(),
                        left.join("; ")
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        true
    }

    /// Stop the workers and delete this run's streams (the stack stays up).
    pub async fn stop(mut self) {
        self.workers.stop_all().await;
        for s in [
            self.topology.work_stream(),
            self.topology.events_stream(),
            self.topology.dlq_stream(),
        ] {
            let _ = self.js.delete_stream(&s).await;
        }
        self.db.close().await;
    }
}

/// Posts SMS to the gateway as Twilio does: form fields signed with `X-Twilio-Signature`.
#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    pub base: String,
    sign_url: String,
    auth_token: String,
    account_sid: String,
}

impl GatewayClient {
    pub fn new(c: &Config) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(4096)
                .timeout(Duration::from_secs(20))
                .build()
                .expect("HTTP client"),
            base: format!("http://{}", c.gateway.http_addr),
            sign_url: format!(
                "{}/webhooks/twilio/sms",
                c.gateway.public_url.trim_end_matches('/')
            ),
            auth_token: c.twilio.auth_token.expose().to_string(),
            account_sid: c.twilio.account_sid.clone(),
        }
    }

    /// Post one inbound SMS; returns the gateway's status.
    pub async fn post_sms(
        &self,
        from: &str,
        text: &str,
        sid: &str,
    ) -> Result<reqwest::StatusCode, reqwest::Error> {
        self.post_sms_to(from, switchboard_e2e::TWILIO_NUMBER, text, sid)
            .await
    }

    /// Post one inbound SMS written to our number `to`; returns the gateway's status.
    pub async fn post_sms_to(
        &self,
        from: &str,
        to: &str,
        text: &str,
        sid: &str,
    ) -> Result<reqwest::StatusCode, reqwest::Error> {
        let mut params = switchboard_e2e::twilio_sms_params(&self.account_sid, from, text, sid);
        for (k, v) in &mut params {
            if k == "To" {
                *v = to.to_string();
            }
        }
        let signature = switchboard_channels::twilio::twilio_signature(
            &self.auth_token,
            &self.sign_url,
            &params,
        );
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish();
        let resp = self
            .http
            .post(format!("{}/webhooks/twilio/sms", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        // Read the body so the connection goes back to the pool.
        let _ = resp.bytes().await;
        Ok(status)
    }
}
