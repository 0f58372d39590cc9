//! Wiring one process: configuration, connections, migrations, topology, admin endpoints, and
//! the stage tasks, all stopped by one [`Shutdown`].
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use sqlx::PgPool;

use crate::config::Config;
use crate::runtime::{BatchStage, Runtime, Stage};
use crate::shutdown::Shutdown;
use crate::stage::{StageOptions, StageSpec};
use crate::topology::Topology;

pub type Task = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Everything a Switchboard process shares.
#[derive(Clone)]
pub struct App {
    pub config: Arc<Config>,
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub db: PgPool,
    pub topology: Topology,
    pub shutdown: Shutdown,
    /// What the process has beyond its configuration, by type, for the stages to read when
    /// they are made: e.g. the channel adapters (`switchboard_channels::Channels`) when a test
    /// adds one. Set with [`App::with`] before the tasks are made.
    pub extensions: axum::http::Extensions,
}

impl App {
    /// Connect to NATS and Postgres. `name` shows up in the NATS server's connection list and
    /// as the Postgres connections' `application_name`.
    pub async fn connect(config: Config, name: &str) -> anyhow::Result<App> {
        // Install the metrics recorder before anything counts.
        let _ = crate::telemetry::metrics();
        // The URLs may carry passwords: both connects name them redacted in their errors, and
        // an empty one by its setting.
        let nats = crate::endpoint::nats_connect(
            &config.nats_url,
            async_nats::ConnectOptions::new().name(format!("switchboard-{name}")),
        )
        .await?;
        let js = jetstream::new(nats.clone());
        let db = crate::db::connect_as(
            &config.database_url,
            config.runtime.pool_size(),
            &format!("switchboard-{name}"),
        )
        .await?;
        let topology = Topology::new(&config.subject_prefix, config.runtime.turn_partitions);
        Ok(App {
            config: Arc::new(config),
            nats,
            js,
            db,
            topology,
            shutdown: Shutdown::new(),
            extensions: Default::default(),
        })
    }

    /// The same app with `value` among its [`extensions`](App::extensions) (replacing one of
    /// its type).
    pub fn with<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }

    /// [`App::connect`] and [`App::prepare`] for a long-running process, trying again for up
    /// to `wait` while NATS or Postgres cannot be reached or answer yet (starting beside this
    /// process, restarting, recovering from a crash): the process comes up when they do instead
    /// of exiting. What waiting cannot fix (the configuration, a refused login, a database
    /// that does not exist) ends it at once.
    pub async fn start(
        config: Config,
        name: &str,
        stages: &[Registration],
        wait: Duration,
    ) -> anyhow::Result<App> {
        check_overrides(&config, stages)?;
        let deadline = Instant::now() + wait;
        let mut delay = Duration::from_millis(250);
        loop {
            let attempt = async {
                let app = App::connect(config.clone(), name).await?;
                app.prepare(stages).await?;
                anyhow::Ok(app)
            }
            .await;
            match attempt {
                Ok(app) => return Ok(app),
                Err(e) if !cannot_wait_out(&e) && Instant::now() + delay < deadline => {
                    tracing::warn!(
                        error = %format!("{e:#}"),
                        retry_in_ms = delay.as_millis() as u64,
                        "NATS or Postgres is not ready; trying again"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(4));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Apply migrations and the stream topology with the consumers of `stages` (all
    /// idempotent), after checking that `[stages.<name>]` names only stages that exist.
    pub async fn prepare(&self, stages: &[Registration]) -> anyhow::Result<()> {
        check_overrides(&self.config, stages)?;
        crate::db::migrate(&self.db).await?;
        let specs: Vec<StageSpec> = stages.iter().map(|r| r.spec).collect();
        self.topology
            .apply(&self.js, &self.config.runtime, &specs)
            .await
            .context("applying the stream topology")?;
        Ok(())
    }

    pub fn runtime(&self) -> Runtime {
        Runtime::new(
            self.js.clone(),
            self.topology.clone(),
            self.config.runtime.clone(),
        )
    }

    /// The knobs `spec` runs with here: `[stages.<name>]`, else the spec, else `[runtime]`.
    pub fn stage_options(&self, spec: &StageSpec) -> StageOptions {
        StageOptions::resolve(
            spec,
            &self.config.runtime,
            self.config.stages.get(spec.name),
        )
    }

    /// A task running `stage` until shutdown.
    pub fn stage_task<S: Stage>(&self, stage: S) -> Task {
        self.shared_stage_task(Arc::new(stage))
    }

    /// Like [`App::stage_task`], for a stage the caller also uses (e.g. for a heartbeat).
    pub fn shared_stage_task<S: Stage>(&self, stage: Arc<S>) -> Task {
        let rt = self.runtime();
        let opts = self.stage_options(&S::SPEC);
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            rt.run_stage(stage, opts, shutdown).await?;
            Ok(())
        })
    }

    /// A task running a [`BatchStage`] until shutdown.
    pub fn batch_stage_task<S: BatchStage>(&self, stage: S) -> Task {
        let rt = self.runtime();
        let opts = self.stage_options(&S::SPEC);
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            rt.run_batch_stage(Arc::new(stage), opts, shutdown).await?;
            Ok(())
        })
    }

    pub fn readiness(&self) -> crate::admin::Readiness {
        crate::admin::Readiness {
            nats: self.nats.clone(),
            db: self.db.clone(),
        }
    }

    /// Serve `router` on `addr` until shutdown.
    pub async fn serve_http(&self, addr: &str, router: axum::Router) -> anyhow::Result<Task> {
        let listener = crate::net::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        self.serve_listener(listener, router)
    }

    /// Serve `router` on an already bound listener until shutdown.
    pub fn serve_listener(
        &self,
        listener: tokio::net::TcpListener,
        router: axum::Router,
    ) -> anyhow::Result<Task> {
        tracing::info!(addr = %listener.local_addr()?, "serving HTTP");
        let limits = crate::http::HttpLimits::from_config(
            &self.config.gateway,
            std::time::Duration::from_millis(self.config.runtime.shutdown_grace_ms),
        );
        let shutdown = self.shutdown.clone();
        Ok(Box::pin(crate::http::serve(
            listener, router, limits, shutdown,
        )))
    }

    /// Run `tasks` to completion; the first failure triggers shutdown of the rest.
    pub async fn run(self, tasks: Vec<Task>) -> anyhow::Result<()> {
        let mut set = tokio::task::JoinSet::new();
        for t in tasks {
            set.spawn(t);
        }
        let mut first_err = None;
        while let Some(res) = set.join_next().await {
            let res = res.map_err(anyhow::Error::from).and_then(|r| r);
            if let Err(e) = res {
                tracing::error!(error = %format!("{e:#}"), "task failed; shutting down");
                self.shutdown.trigger();
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// How long a starting process waits for NATS and Postgres ([`App::start`]).
pub const STARTUP_WAIT: Duration = Duration::from_secs(30);

/// Whether `e` is something waiting cannot fix: a missing or malformed URL, a login the server
/// refused, a database that does not exist. (Postgres answering "the database system is
/// starting up" is worth waiting for.)
fn cannot_wait_out(e: &anyhow::Error) -> bool {
    use crate::endpoint::EndpointError;
    e.chain().any(|c| {
        if let Some(sqlx::Error::Database(db)) = c.downcast_ref::<sqlx::Error>() {
            return db
                .code()
                .is_some_and(|code| code.starts_with("28") || code.starts_with("3D"));
        }
        if let Some(e) = c.downcast_ref::<async_nats::ConnectError>() {
            return matches!(
                e.kind(),
                async_nats::ConnectErrorKind::Authentication
                    | async_nats::ConnectErrorKind::AuthorizationViolation
                    | async_nats::ConnectErrorKind::ServerParse
                    | async_nats::ConnectErrorKind::Tls
            );
        }
        matches!(
            c.downcast_ref::<crate::db::DbError>(),
            Some(crate::db::DbError::NoUrl)
        ) || matches!(
            c.downcast_ref::<EndpointError>(),
            Some(
                EndpointError::NoUrl
                    | EndpointError::Invalid { .. }
                    | EndpointError::MixedCredentials { .. }
            )
        )
    })
}

/// `[stages.<name>]` must name a stage of `stages`: a typo would otherwise be ignored.
pub fn check_overrides(config: &Config, stages: &[Registration]) -> anyhow::Result<()> {
    for name in config.stages.keys() {
        if !stages.iter().any(|r| r.spec.name == name) {
            let known: Vec<&str> = stages.iter().map(|r| r.spec.name).collect();
            anyhow::bail!(
                "[stages.{name}] in the configuration: no such stage (stages: {})",
                known.join(", ")
            );
        }
    }
    Ok(())
}

/// A stage as the product lists it: its declaration, the worker it belongs to, and how to start
/// it in a process.
#[derive(Clone, Copy)]
pub struct Registration {
    pub spec: StageSpec,
    /// The worker (`switchboard worker <name>`) that runs this stage with its siblings of the
    /// same crate, e.g. `log` for `log-inbound` and `log-outbound`.
    pub worker: &'static str,
    /// The stage's task in `app`: builds its handler and runs it until shutdown.
    pub start: fn(&App) -> Task,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("spec", &self.spec)
            .field("worker", &self.worker)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_not_reachable_yet_is_waited_for_and_a_wrong_setting_is_not() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let refused = anyhow::Error::new(crate::db::DbError::Connect {
            url: "postgres://…".into(),
            source: refused,
        });
        assert!(!cannot_wait_out(&refused));
        assert!(!cannot_wait_out(
            &anyhow::Error::new(sqlx::Error::PoolTimedOut).context("applying migrations")
        ));
        assert!(cannot_wait_out(&anyhow::Error::new(
            crate::db::DbError::NoUrl
        )));
        assert!(cannot_wait_out(&anyhow::Error::new(
            crate::endpoint::EndpointError::Invalid {
                url: "nats://".into(),
                reason: "no host".into(),
            }
        )));
    }
}
