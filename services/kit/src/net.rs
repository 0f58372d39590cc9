//! Listening sockets below Linux's ephemeral port range.
//!
//! Port 0 would let the kernel pick from the ephemeral range (32768–60999), the same range it
//! takes outgoing connections' local ports from; a listener there can collide with a client's
//! port, or take one a restarted process expects back. So "any free port" here means a free
//! port of [`FREE_PORTS`], which no stack of ours (`make run` 14222/15432, bench, chaos, tests
//! 24222/25432) uses.
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::Range;

/// Where "any free port" (port 0 in an address) is taken from.
pub const FREE_PORTS: Range<u16> = 20000..24000;

/// Bind `addr` (`host:port`); port 0 takes a free port of [`FREE_PORTS`].
pub async fn bind(addr: &str) -> io::Result<tokio::net::TcpListener> {
    let std = bind_std(addr)?;
    std.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std)
}

/// [`bind`] for blocking code.
pub fn bind_std(addr: &str) -> io::Result<std::net::TcpListener> {
    let resolved = resolve(addr)?;
    if resolved.port() != 0 {
        return std::net::TcpListener::bind(resolved);
    }
    bind_in(resolved, FREE_PORTS)
}

fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no address in {addr:?}"),
        )
    })
}

/// Bind a free port of `ports` on `addr`'s host.
fn bind_in(resolved: SocketAddr, ports: Range<u16>) -> io::Result<std::net::TcpListener> {
    let span = ports.end - ports.start;
    // Start somewhere different in each process and call, so concurrent callers rarely probe
    // the same ports in the same order.
    let start = (std::process::id() as u64 ^ now_nanos()) % span as u64;
    let mut last = None;
    for i in 0..span {
        let port = ports.start + ((start + i as u64) % span as u64) as u16;
        match std::net::TcpListener::bind(SocketAddr::new(resolved.ip(), port)) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)))
}

/// A port of [`FREE_PORTS`] free right now on `host` (for a child process to bind; it may be
/// taken before then, which that process reports).
pub fn free_port(host: &str) -> io::Result<u16> {
    Ok(bind_std(&format!("{host}:0"))?.local_addr()?.port())
}

/// [`free_port`] from `ports` instead: for a process that must get its port back after a
/// restart, away from [`FREE_PORTS`], where anyone's "any free port" may take it meanwhile.
pub fn free_port_in(host: &str, ports: Range<u16>) -> io::Result<u16> {
    Ok(bind_in(resolve(&format!("{host}:0"))?, ports)?
        .local_addr()?
        .port())
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_is_below_the_ephemeral_range() {
        let a = bind_std("127.0.0.1:0").unwrap();
        let b = bind_std("127.0.0.1:0").unwrap();
        for l in [&a, &b] {
            assert!(FREE_PORTS.contains(&l.local_addr().unwrap().port()));
        }
        assert_ne!(a.local_addr().unwrap(), b.local_addr().unwrap());
    }

    #[test]
    fn a_named_port_is_bound_as_asked() {
        let a = bind_std("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        drop(a);
        let b = bind_std(&format!("127.0.0.1:{port}")).unwrap();
        assert_eq!(b.local_addr().unwrap().port(), port);
    }
}
