//! An explicit shutdown signal, shared by every task of a process.
//!
//! SIGTERM or Ctrl-C flips it once; tasks stop fetching new work, finish what they hold, and exit.
use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask every holder to stop.
    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown has been triggered.
    pub async fn wait(&self) {
        self.token.cancelled().await;
    }

    /// Trigger on SIGTERM or Ctrl-C.
    pub fn trigger_on_signals(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("installing a SIGTERM handler");
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
            tracing::info!("shutdown requested: draining");
            this.trigger();
        });
    }
}
