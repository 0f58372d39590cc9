//! The tests' HTTP client, shared by the fakes' test modules: the crate has no HTTP client,
//! so a few lines of HTTP/1.1 on a socket (one request a connection, `Connection: close`).
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A response: its status, its headers (names lowercased, in order) and its body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The first header named `name` (lowercase).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `verb path` on the server at `base` (`http://host:port`), with `headers` after the
/// client's own (`Host`, `User-Agent`, `Connection: close`, `Content-Length`) and `body`.
pub(crate) async fn http(
    base: &str,
    verb: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let host = base.strip_prefix("http://").expect("an http base");
    let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
    let mut request = format!(
        "{verb} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: switchboard-test/1\r\n\
         Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8(raw[..split].to_vec()).expect("text headers");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    assert!(
        !headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")),
        "this client reads sized bodies only"
    );
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// `pairs` as `application/x-www-form-urlencoded` (a body or a query string).
pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        form.append_pair(k, v);
    }
    form.finish()
}
