//! Which sockets and waiting API requests this gateway replica holds, and the follower that
//! hands them the mailbox's announcements.
//!
//! Every replica follows every announcement (`{p}.mailbox.>`) and keeps those addressed to what
//! it holds; a person's sockets may sit on several replicas at once and each gets the reply.
//! Announcements are a fast path only: sockets and waiters also read the mailbox table, so a
//! lost announcement delays a reply, never loses it.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use switchboard_channels::MailboxEntry;
use switchboard_kit::shutdown::Shutdown;
use tokio::sync::mpsc;

/// A socket's queue of live replies; a socket that falls this far behind catches up from the
/// table instead.
const SOCKET_QUEUE: usize = 64;

type Registry<T> = Mutex<HashMap<String, Vec<(u64, T)>>>;

#[derive(Default)]
pub struct Hub {
    next_id: AtomicU64,
    /// By `channel` + address.
    sockets: Registry<mpsc::Sender<MailboxEntry>>,
    /// By correlation id.
    waiters: Registry<mpsc::Sender<MailboxEntry>>,
    /// Sockets open per user (a token's `sub`), every channel together.
    users: Mutex<HashMap<String, usize>>,
}

/// One of a user's sockets, counted while it lives.
pub struct UserSocket {
    hub: Arc<Hub>,
    sub: String,
}

impl Drop for UserSocket {
    fn drop(&mut self) {
        let mut users = self.hub.users.lock().expect("hub lock");
        if let Some(n) = users.get_mut(&self.sub) {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.sub);
            }
        }
    }
}

/// Removes its registration when dropped (the socket closed, the request ended).
pub struct Registration {
    hub: Arc<Hub>,
    key: String,
    id: u64,
    waiter: bool,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let registry = if self.waiter {
            &self.hub.waiters
        } else {
            metrics::gauge!("sb_gateway_chat_sockets").decrement(1.0);
            &self.hub.sockets
        };
        let mut map = registry.lock().expect("hub lock");
        if let Some(list) = map.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

fn socket_key(channel: &str, address: &str) -> String {
    format!("{channel}\u{0}{address}")
}

impl Hub {
    fn register(
        self: &Arc<Self>,
        key: String,
        waiter: bool,
        capacity: usize,
    ) -> (Registration, mpsc::Receiver<MailboxEntry>) {
        let (tx, rx) = mpsc::channel(capacity);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let registry = if waiter { &self.waiters } else { &self.sockets };
        registry
            .lock()
            .expect("hub lock")
            .entry(key.clone())
            .or_default()
            .push((id, tx));
        let registration = Registration {
            hub: self.clone(),
            key,
            id,
            waiter,
        };
        (registration, rx)
    }

    /// Live replies for a socket of `address` on `channel`, while the registration lives.
    pub fn socket(
        self: &Arc<Self>,
        channel: &str,
        address: &str,
    ) -> (Registration, mpsc::Receiver<MailboxEntry>) {
        metrics::gauge!("sb_gateway_chat_sockets").increment(1.0);
        self.register(socket_key(channel, address), false, SOCKET_QUEUE)
    }

    /// Count a new socket of `sub`, unless they already hold `max`: `None` then.
    pub fn claim_socket(self: &Arc<Self>, sub: &str, max: usize) -> Option<UserSocket> {
        let mut users = self.users.lock().expect("hub lock");
        let n = users.entry(sub.to_string()).or_default();
        if *n >= max {
            if *n == 0 {
                users.remove(sub);
            }
            return None;
        }
        *n += 1;
        Some(UserSocket {
            hub: self.clone(),
            sub: sub.to_string(),
        })
    }

    /// Replies to the message `correlation_id`, while the registration lives.
    pub fn waiter(
        self: &Arc<Self>,
        correlation_id: &str,
    ) -> (Registration, mpsc::Receiver<MailboxEntry>) {
        self.register(correlation_id.to_string(), true, 4)
    }

    /// Hand an announced entry to whoever here wants it. A full queue drops it: its socket
    /// reads the table on its next catch-up.
    pub fn route(&self, entry: &MailboxEntry) {
        let send = |registry: &Registry<mpsc::Sender<MailboxEntry>>, key: &str| {
            if let Some(list) = registry.lock().expect("hub lock").get(key) {
                for (_, tx) in list {
                    let _ = tx.try_send(entry.clone());
                }
            }
        };
        send(&self.sockets, &socket_key(&entry.channel, &entry.address));
        send(&self.waiters, &entry.correlation_id);
    }
}

/// Follow the mailbox's announcements until shutdown.
pub async fn follow(
    hub: Arc<Hub>,
    nats: async_nats::Client,
    subject: String,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut announcements = nats.subscribe(subject).await?;
    loop {
        let message = tokio::select! {
            m = announcements.next() => m,
            _ = shutdown.wait() => return Ok(()),
        };
        let Some(message) = message else {
            anyhow::bail!("the mailbox subscription ended");
        };
        match serde_json::from_slice::<MailboxEntry>(&message.payload) {
            Ok(entry) => hub.route(&entry),
            Err(e) => tracing::warn!(error = %e, "unreadable mailbox announcement"),
        }
    }
}
