//! An explicit shutdown signal, shared by every task of a process.
//!
//! SIGTERM or Ctrl-C flips it once; tasks stop fetching new work, finish what they hold, and exit.
use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            rx,
            tx: std::sync::Arc::new(tx),
        }
    }

    /// Ask every holder to stop.
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown has been triggered.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|stop| *stop).await;
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
