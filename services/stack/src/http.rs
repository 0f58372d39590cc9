//! The little HTTP the stack needs, over std's TCP: NATS' health check on loopback, and the one
//! download that is no wheel (pgvector's source from Debian, over plain HTTP and checked by
//! sha256 afterwards). HTTP/1.1 with `Connection: close` (some proxies refuse HTTP/1.0 with 426),
//! chunked answers decoded; redirects to `http://` are followed; `http_proxy` (and `no_proxy`)
//! are honoured as curl and Python do.
use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("not an http:// URL: {0}")]
    Url(String),
    #[error("{url}: {source}")]
    Io {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: malformed response")]
    Malformed { url: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: too many redirects")]
    Redirects { url: String },
}

/// The parts of an `http://host[:port]/path` URL.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    path: String,
}

fn parse(url: &str) -> Result<Target, HttpError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| HttpError::Url(url.into()))?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().map_err(|_| HttpError::Url(url.into()))?),
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(HttpError::Url(url.into()));
    }
    Ok(Target {
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// The proxy for `host`, from `http_proxy`/`HTTP_PROXY`, unless `no_proxy` lists it.
fn proxy_for(host: &str, var: &dyn Fn(&str) -> Option<String>) -> Option<Target> {
    if matches!(host, "127.0.0.1" | "localhost") {
        return None;
    }
    let no_proxy = var("no_proxy")
        .or_else(|| var("NO_PROXY"))
        .unwrap_or_default();
    let excluded = no_proxy.split(',').map(str::trim).any(|d| {
        d == "*" || (!d.is_empty() && (host == d.trim_start_matches('.') || host.ends_with(d)))
    });
    if excluded {
        return None;
    }
    let proxy = var("http_proxy")
        .or_else(|| var("HTTP_PROXY"))
        .filter(|p| !p.is_empty())?;
    let proxy = if proxy.contains("://") {
        proxy
    } else {
        format!("http://{proxy}")
    };
    parse(&proxy).ok()
}

/// One request; the status and body (no redirect followed).
fn request(url: &str, timeout: Duration) -> Result<(u16, Option<String>, Vec<u8>), HttpError> {
    let target = parse(url)?;
    let env = |k: &str| std::env::var(k).ok();
    let (connect_to, request_target) = match proxy_for(&target.host, &env) {
        Some(proxy) => (proxy, url.to_string()),
        None => (
            Target {
                host: target.host.clone(),
                port: target.port,
                path: String::new(),
            },
            target.path.clone(),
        ),
    };
    let io = |source| HttpError::Io {
        url: url.into(),
        source,
    };
    let deadline = Instant::now() + timeout;
    let addr = (connect_to.host.as_str(), connect_to.port)
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| HttpError::Url(url.into()))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let host_header = if target.port == 80 {
        target.host.clone()
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let request = format!(
        "GET {request_target} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: switchboard-stack\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut response = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        if Instant::now() > deadline {
            return Err(HttpError::Timeout {
                url: url.into(),
                timeout,
            });
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        }
    }
    split_response(&response).ok_or_else(|| HttpError::Malformed { url: url.into() })
}

/// A response's status, `Location` header and body (chunks joined).
fn split_response(response: &[u8]) -> Option<(u16, Option<String>, Vec<u8>)> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&response[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let (mut location, mut chunked) = (None, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("location") {
            location = Some(value.trim().to_string());
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = &response[end + 4..];
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Some((status, location, body))
}

/// A chunked body's data: `<hex size>[;ext]\r\n<data>\r\n` ... `0\r\n\r\n`.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[..eol]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// GET `url`, following up to 5 redirects; the body of a 2xx answer.
pub fn get(url: &str, timeout: Duration) -> Result<Vec<u8>, HttpError> {
    let mut url = url.to_string();
    for _ in 0..=5 {
        let (status, location, body) = request(&url, timeout)?;
        match (status, location) {
            (200..=299, _) => return Ok(body),
            (301 | 302 | 303 | 307 | 308, Some(next)) => {
                url = if next.starts_with('/') {
                    let t = parse(&url)?;
                    format!("http://{}:{}{next}", t.host, t.port)
                } else {
                    next
                };
            }
            (status, _) => return Err(HttpError::Status { url, status }),
        }
    }
    Err(HttpError::Redirects { url })
}

/// Whether `url` answers with a status below 400 within `timeout` (`curl -f`).
pub fn answers(url: &str, timeout: Duration) -> bool {
    request(url, timeout).is_ok_and(|(status, _, _)| status < 400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            parse("http://127.0.0.1:25222/healthz?js-enabled-only=true").unwrap(),
            Target {
                host: "127.0.0.1".into(),
                port: 25222,
                path: "/healthz?js-enabled-only=true".into()
            }
        );
        assert_eq!(
            parse("http://deb.debian.org").unwrap(),
            Target {
                host: "deb.debian.org".into(),
                port: 80,
                path: "/".into()
            }
        );
        assert!(parse("https://deb.debian.org/").is_err());
        assert!(parse("http://:80/").is_err());
    }

    #[test]
    fn the_proxy_is_used_except_for_loopback_and_no_proxy() {
        let env = |k: &str| match k {
            "http_proxy" => Some("proxy.local:3128".to_string()),
            "no_proxy" => Some("internal.example, .corp".to_string()),
            _ => None,
        };
        let p = proxy_for("deb.debian.org", &env).unwrap();
        assert_eq!((p.host.as_str(), p.port), ("proxy.local", 3128));
        assert!(proxy_for("127.0.0.1", &env).is_none());
        assert!(proxy_for("internal.example", &env).is_none());
        assert!(proxy_for("a.corp", &env).is_none());
        assert!(proxy_for("deb.debian.org", &|_| None).is_none());
    }

    #[test]
    fn responses_give_status_location_and_body() {
        let r = b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\nlocation: /elsewhere\r\n\r\nbody";
        assert_eq!(
            split_response(r).unwrap(),
            (302, Some("/elsewhere".into()), b"body".to_vec())
        );
        assert!(split_response(b"HTTP/1.1 200 OK\r\n").is_none());
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\na;x=1\r\n0123456789\r\n0\r\n\r\n";
        assert_eq!(
            split_response(chunked).unwrap(),
            (200, None, b"abc0123456789".to_vec())
        );
        let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc";
        assert!(split_response(cut).is_none(), "a cut-off chunk");
    }

    #[test]
    fn a_local_server_is_asked_and_answers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for answer in ["HTTP/1.1 200 OK\r\n\r\nok", "HTTP/1.1 503 No\r\n\r\n"] {
                let (mut s, _) = listener.accept().unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.ends_with(b"\r\n\r\n") {
                    let n = s.read(&mut buf).unwrap();
                    req.extend_from_slice(&buf[..n]);
                }
                assert!(req.starts_with(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:"));
                s.write_all(answer.as_bytes()).unwrap();
            }
        });
        let url = format!("http://127.0.0.1:{port}/healthz");
        assert_eq!(get(&url, Duration::from_secs(5)).unwrap(), b"ok");
        assert!(!answers(&url, Duration::from_secs(5)));
        server.join().unwrap();
        assert!(!answers(&url, Duration::from_secs(1)), "nobody listens");
    }
}
