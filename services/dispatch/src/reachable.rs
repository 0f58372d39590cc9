//! Whether this process can still reach its database, asked only while something waits on it
//! (a check call being prepared while the runner is down): one trivial statement on a
//! connection of its own, every [`PING_EVERY`], shared by every turn asking at the time.
use std::time::Duration;

use sqlx::PgPool;
use switchboard_kit::coalesce::Coalescer;

/// How often a waiting task has the database pinged.
const PING_EVERY: Duration = Duration::from_millis(250);
/// A ping unanswered this long: the database is down or cut off (a pool reconnecting to a
/// server that refuses keeps trying until its own acquire timeout, seconds later).
const PING_TIMEOUT: Duration = Duration::from_millis(500);

pub(crate) struct DatabaseProbe {
    /// Every ping asked for while one is in flight is answered by the next one.
    pings: Coalescer<(), bool>,
}

impl DatabaseProbe {
    pub fn new(db: &PgPool) -> Self {
        // Its own connection: a pool busy with turns (or the heartbeat's) must not make a
        // reachable database look unreachable.
        let own = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(PING_TIMEOUT)
            .connect_lazy_with((*db.connect_options()).clone());
        let pings = Coalescer::new(usize::MAX, 1, move |asked: Vec<()>| {
            let own = own.clone();
            async move {
                let answered = tokio::time::timeout(
                    PING_TIMEOUT,
                    sqlx::query("SELECT 1").persistent(false).execute(&own),
                )
                .await;
                let reachable = match answered {
                    Ok(Ok(_)) => true,
                    // A statement refused for its own sake still says the server answered.
                    Ok(Err(e)) => !switchboard_kit::db::is_outage(&e),
                    Err(_) => false,
                };
                vec![reachable; asked.len()]
            }
        });
        Self { pings }
    }

    /// `work`'s output, or `None` when the database is found unreachable first (`work` is
    /// dropped then): for a step that must not wait out the pool's acquire timeout.
    pub async fn unless_unreachable<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::select! {
            biased;
            done = work => Some(done),
            () = self.unreachable() => None,
        }
    }

    /// Resolves once a ping finds the database unreachable; never while it answers.
    async fn unreachable(&self) {
        loop {
            tokio::time::sleep(PING_EVERY).await;
            if !self.pings.call(()).await.unwrap_or(true) {
                return;
            }
        }
    }
}
