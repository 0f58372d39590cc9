//! The load generator: many senders handing messages to the gateway, each on its channel
//! ([`LoadClients`]: Twilio, TextMagic, chat, API, Telegram, Slack, WhatsApp).
//!
//! Each sender's messages are posted one after another (the next only once the gateway accepted
//! the previous one), so a sender's arrival order is well defined and can be checked at the
//! runner and where the replies arrive. A message the gateway did not accept (error, 5xx,
//! gateway down) is posted again with the same ids (`MessageSid`, TextMagic id, chat client id,
//! `Idempotency-Key`, Telegram update, Slack event, wamid), as providers and clients retry.
//!
//! - Open loop ([`LoadGen::open_loop`]): messages go out at a target rate whatever happens
//!   downstream, round-robin over the senders.
//! - Closed loop ([`LoadGen::closed_loop`]): every sender has one turn in flight: it sends, waits
//!   for its reply at Twilio, and sends the next. Throughput is then what the pipeline sustains.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use super::channels::{Channel, LoadClients, Posted};
use super::observers::LoadTwilio;
use super::pipeline::GatewayClient;
use super::{message_text, now_us};

/// One message the gateway accepted (answered 200).
#[derive(Debug, Clone)]
pub struct Accepted {
    pub channel: Channel,
    pub sender: usize,
    pub index: u32,
    /// The id the product keeps for the message (Twilio's `MessageSid`, TextMagic's `id`, the
    /// key of a chat client id or an `Idempotency-Key`).
    pub sid: String,
    /// The correlation id the gateway answered with (chat and API say it).
    pub correlation_id: String,
    /// When the first attempt was sent, µs.
    pub sent_us: u64,
    /// When the 200 came back, µs.
    pub accepted_us: u64,
    pub attempts: u32,
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct LoadStats {
    pub accepted: u64,
    /// Posts answered with something other than success (e.g. 503 while NATS restarts).
    pub rejected: u64,
    /// Posts that failed at the HTTP level (gateway down, connection reset).
    pub errors: u64,
    /// Messages never accepted within the retry time.
    pub gave_up: u64,
    /// Closed loop: replies not seen within the wait.
    pub reply_timeouts: u64,
    /// Open loop: messages scheduled but still queued behind their sender's earlier ones when
    /// the run ended, so never sent (the offered rate was not reached).
    pub not_sent: u64,
    /// Refusals by status (HTTP) or chat error code.
    pub statuses: BTreeMap<String, u64>,
}

pub struct LoadGen {
    clients: Arc<LoadClients>,
    twilio: LoadTwilio,
    posts: Arc<Semaphore>,
    /// How long one message is retried before it is given up.
    pub retry_for: Duration,
    accepted: Mutex<Vec<Accepted>>,
    stats: Mutex<LoadStats>,
    accepted_n: AtomicU64,
    /// Messages given up (never accepted within `retry_for`): (sender, index).
    given_up: Mutex<Vec<(usize, u32)>>,
    stop: AtomicBool,
}

impl LoadGen {
    /// Twilio senders only; `max_posts`: HTTP posts in flight at most.
    pub fn new(gateway: GatewayClient, twilio: LoadTwilio, max_posts: usize) -> Arc<Self> {
        Self::mixed(
            Arc::new(LoadClients::twilio_only(gateway)),
            twilio,
            max_posts,
        )
    }

    /// Senders on the channels `clients` gives them.
    pub fn mixed(clients: Arc<LoadClients>, twilio: LoadTwilio, max_posts: usize) -> Arc<Self> {
        Arc::new(Self {
            clients,
            twilio,
            posts: Arc::new(Semaphore::new(max_posts.max(1))),
            retry_for: Duration::from_secs(120),
            accepted: Mutex::new(Vec::new()),
            stats: Mutex::new(LoadStats::default()),
            accepted_n: AtomicU64::new(0),
            given_up: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        })
    }

    pub fn with_retry_for(self: Arc<Self>, d: Duration) -> Arc<Self> {
        let mut this = Arc::try_unwrap(self).unwrap_or_else(|_| panic!("configure before use"));
        this.retry_for = d;
        Arc::new(this)
    }

    pub fn clients(&self) -> &LoadClients {
        &self.clients
    }

    pub fn accepted_count(&self) -> u64 {
        self.accepted_n.load(Ordering::Relaxed)
    }

    pub fn accepted(&self) -> Vec<Accepted> {
        self.accepted.lock().unwrap().clone()
    }

    /// Messages never accepted within `retry_for`: (sender, index), in the order given up.
    pub fn given_up(&self) -> Vec<(usize, u32)> {
        self.given_up.lock().unwrap().clone()
    }

    pub fn stats(&self) -> LoadStats {
        self.stats.lock().unwrap().clone()
    }

    /// Stop open and closed loops (messages being retried finish their retries).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Post one message until the gateway accepts it (or `retry_for` runs out).
    pub async fn send(&self, sender: usize, index: u32) -> Option<Accepted> {
        let sent_us = now_us();
        let give_up = Instant::now() + self.retry_for;
        let mut attempts = 0;
        let mut backoff = Duration::from_millis(100);
        loop {
            attempts += 1;
            let result = {
                let _permit = self.posts.acquire().await.expect("never closed");
                self.clients.post(sender, index).await
            };
            match result {
                Posted::Accepted {
                    provider_id,
                    correlation_id,
                } => {
                    let a = Accepted {
                        channel: self.clients.channel_of(sender),
                        sender,
                        index,
                        sid: provider_id,
                        correlation_id,
                        sent_us,
                        accepted_us: now_us(),
                        attempts,
                    };
                    self.accepted.lock().unwrap().push(a.clone());
                    self.accepted_n.fetch_add(1, Ordering::Relaxed);
                    self.stats.lock().unwrap().accepted += 1;
                    return Some(a);
                }
                Posted::Refused(status) => {
                    let mut s = self.stats.lock().unwrap();
                    s.rejected += 1;
                    *s.statuses.entry(status).or_default() += 1;
                }
                Posted::Failed => self.stats.lock().unwrap().errors += 1,
            }
            if Instant::now() >= give_up {
                self.stats.lock().unwrap().gave_up += 1;
                self.given_up.lock().unwrap().push((sender, index));
                return None;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Each of `senders` keeps one turn in flight until `until`: send, wait for the reply (at
    /// most `reply_wait`), send the next. Returns when every sender stopped.
    pub async fn closed_loop(
        self: &Arc<Self>,
        senders: usize,
        until: Instant,
        reply_wait: Duration,
    ) {
        let mut tasks = tokio::task::JoinSet::new();
        for sender in 0..senders {
            let this = self.clone();
            tasks.spawn(async move {
                let mut index = 0;
                while Instant::now() < until && !this.stop.load(Ordering::Relaxed) {
                    let reply = this.twilio.wait_for(&message_text(sender, index));
                    if this.send(sender, index).await.is_none() {
                        break;
                    }
                    let left = until.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(reply_wait.min(left + reply_wait), reply).await {
                        Ok(Ok(_)) => {}
                        _ => {
                            if Instant::now() < until {
                                this.stats.lock().unwrap().reply_timeouts += 1;
                            }
                        }
                    }
                    index += 1;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Post `rate` messages per second until `until` or until `schedule` runs out. Message
    /// number `n` goes to the sender and index `schedule(n)` names ([`round_robin`],
    /// [`in_groups`]). Returns when every message sent is accepted or given up.
    pub async fn open_loop(
        self: &Arc<Self>,
        senders: usize,
        rate: f64,
        until: Instant,
        schedule: impl Fn(u64) -> Option<(usize, u32)>,
    ) {
        let mut queues = Vec::with_capacity(senders);
        let mut tasks = tokio::task::JoinSet::new();
        for sender in 0..senders {
            let (tx, mut rx) = mpsc::unbounded_channel::<u32>();
            queues.push(tx);
            let this = self.clone();
            tasks.spawn(async move {
                while let Some(index) = rx.recv().await {
                    // Queued when the run ended: not sent (an open loop stops at `until`).
                    if Instant::now() >= until {
                        this.stats.lock().unwrap().not_sent += 1;
                        continue;
                    }
                    this.send(sender, index).await;
                }
            });
        }
        let start = Instant::now();
        let mut sent: u64 = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        'outer: loop {
            tick.tick().await;
            if Instant::now() >= until || self.stop.load(Ordering::Relaxed) {
                break;
            }
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while sent < due {
                let Some((sender, index)) = schedule(sent) else {
                    break 'outer;
                };
                let _ = queues[sender].send(index);
                sent += 1;
            }
        }
        drop(queues);
        while tasks.join_next().await.is_some() {}
    }
}

/// Message `n` of an endless round-robin over `senders`.
pub fn round_robin(senders: usize) -> impl Fn(u64) -> Option<(usize, u32)> {
    move |n| Some(((n % senders as u64) as usize, (n / senders as u64) as u32))
}

/// `per_sender` messages for each of `senders`, a group of `group` senders at a time: the
/// group's senders take turns, so one sender's messages come `group / rate` seconds apart
/// (close enough that a turn often waits for the one before it).
pub fn in_groups(
    senders: usize,
    per_sender: u32,
    group: usize,
) -> impl Fn(u64) -> Option<(usize, u32)> {
    let group = group.clamp(1, senders.max(1)) as u64;
    let (senders, per) = (senders as u64, per_sender as u64);
    move |n| {
        let full = senders / group;
        let g = n / (group * per);
        let (base, size, within) = if g < full {
            (g * group, group, n % (group * per))
        } else {
            // The last, smaller group.
            let size = senders % group;
            let within = n - full * group * per;
            if size == 0 || within >= size * per {
                return None;
            }
            (full * group, size, within)
        };
        Some(((base + within % size) as usize, (within / size) as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_every_message_once_in_order_per_sender() {
        let f = in_groups(10, 3, 4);
        let all: Vec<(usize, u32)> = (0..100).map_while(&f).collect();
        assert_eq!(all.len(), 30);
        let mut seen = std::collections::HashSet::new();
        let mut last = std::collections::HashMap::new();
        for (s, i) in &all {
            assert!(seen.insert((*s, *i)));
            if let Some(prev) = last.insert(*s, *i) {
                assert!(prev < *i);
            }
        }
    }
}
