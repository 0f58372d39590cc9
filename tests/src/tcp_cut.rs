//! A loopback TCP proxy a test can cut: every connection through it is dropped and new ones are
//! refused until it is restored, as a network that goes away (a tunnel, a closed laptop) does
//! to a browser's socket. The product behind it keeps running.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpStream;
use tokio::sync::watch;

pub struct CuttableProxy {
    /// Where clients connect instead of the target.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
}

impl CuttableProxy {
    pub async fn start(target: SocketAddr) -> CuttableProxy {
        let listener = switchboard_kit::net::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("its address");
        let cut = Arc::new(AtomicBool::new(false));
        let (cuts, _) = watch::channel(0u64);
        let (is_cut, cut_signal) = (cut.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if is_cut.load(Ordering::SeqCst) {
                    continue; // dropped: refused while cut
                }
                let mut cut_now = cut_signal.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut_now.changed() => {}
                    }
                });
            }
        });
        CuttableProxy { addr, cut, cuts }
    }

    /// Drop every connection and refuse new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}
