//! A loopback TCP proxy a test can break the way networks break: `blackhole` keeps every
//! connection open but drops what the server sends (a dead Wi-Fi: the server believes it
//! delivered, the client hears nothing and no one closes anything), `cut` drops every
//! connection and refuses new ones, and `restore` lets everything through again. The product
//! behind it keeps running.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::watch;

pub struct CuttableProxy {
    /// Where clients connect instead of the target.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    blackholed: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

/// Copy `from` to `to` until either closes; while `discard` holds, read and drop.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    discard: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if discard.as_ref().is_some_and(|d| d.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl CuttableProxy {
    pub async fn start(target: SocketAddr) -> CuttableProxy {
        let listener = switchboard_kit::net::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let cut = Arc::new(AtomicBool::new(false));
        let blackholed = Arc::new(AtomicBool::new(false));
        let (cuts, _) = watch::channel(0u64);
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (is_cut, hole, cut_signal) = (cut.clone(), blackholed.clone(), cuts.clone());
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                if is_cut.load(Ordering::SeqCst) {
                    continue; // dropped: refused while cut
                }
                let mut cut_now = cut_signal.subscribe();
                let hole = hole.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        _ = pipe(client_read, server_write, None) => {}
                        _ = pipe(server_read, client_write, Some(hole)) => {}
                        _ = cut_now.changed() => {}
                    }
                });
            }
        });
        CuttableProxy {
            addr,
            cut,
            blackholed,
            cuts,
            accepted,
        }
    }

    /// Keep the connections, but drop everything the server sends on them.
    pub fn blackhole(&self) {
        self.blackholed.store(true, Ordering::SeqCst);
    }

    /// Drop every connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Let connections through again (and what the server sends on them).
    pub fn restore(&self) {
        self.blackholed.store(false, Ordering::SeqCst);
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Connections clients made through it so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}
