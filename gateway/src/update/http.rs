//! A minimal HTTP/1.1 GET client over `std::net::TcpStream` for fetching update bundles.
//! No TLS on purpose: the bundle's ed25519 signature is what makes it trustworthy.
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s}: not an http:// URL"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("{s}: bad port {p:?}"))?,
            ),
            _ => (hostport, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty()
            || path
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(format!("{s}: bad URL"));
        }
        Ok(Url {
            host: host.to_string(),
            port,
            path: path.to_string(),
        })
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "http://[{}]:{}{}", self.host, self.port, self.path)
        } else {
            write!(f, "http://{}:{}{}", self.host, self.port, self.path)
        }
    }
}

fn bad(s: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, s)
}

/// GET `url`: the body as a reader and its Content-Length when the server sent one.
pub fn get(url: &Url) -> io::Result<(Box<dyn Read>, Option<u64>)> {
    let addr = (url.host.as_str(), url.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| bad(format!("{}: no address", url.host)))?;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let host = if url.host.contains(':') {
        format!("[{}]", url.host)
    } else {
        url.host.clone()
    };
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {host}:{}\r\nUser-Agent: riceguard-update\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n",
        url.path, url.port
    );
    (&s).write_all(req.as_bytes())?;
    let mut r = BufReader::with_capacity(1 << 20, s);
    let mut line = Vec::new();
    let mut header_bytes = 0usize;
    let mut status = None;
    let mut len = None;
    loop {
        line.clear();
        // Headers are bounded: a hostile server cannot make us buffer without end.
        let n = (&mut r).take(8192).read_until(b'\n', &mut line)?;
        header_bytes += n;
        if n == 0 || header_bytes > 65536 || !line.ends_with(b"\n") {
            return Err(bad("malformed or oversized HTTP response header".into()));
        }
        let l = String::from_utf8_lossy(&line);
        let l = l.trim_end();
        if status.is_none() {
            let mut w = l.split_whitespace();
            let (v, code) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            if !v.starts_with("HTTP/1.") {
                return Err(bad(format!("not an HTTP response: {l:.60}")));
            }
            status = Some(code.to_string());
            if code != "200" {
                return Err(bad(format!("server answered {l:.80}")));
            }
            continue;
        }
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                len = Some(
                    v.parse::<u64>()
                        .map_err(|_| bad(format!("bad Content-Length {v:.30}")))?,
                );
            } else if k == "transfer-encoding" && !v.eq_ignore_ascii_case("identity") {
                return Err(bad(format!("unsupported Transfer-Encoding {v:.30}")));
            }
        }
    }
    match len {
        Some(n) => Ok((Box::new(r.take(n)), Some(n))),
        None => Ok((Box::new(r), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        assert_eq!(
            Url::parse("http://10.0.2.2:8000/b/x.bundle").unwrap(),
            Url {
                host: "10.0.2.2".into(),
                port: 8000,
                path: "/b/x.bundle".into()
            }
        );
        assert_eq!(Url::parse("http://h").unwrap().port, 80);
        assert_eq!(Url::parse("http://[::1]:81/x").unwrap().host, "::1");
        assert!(Url::parse("https://h/").is_err());
        assert!(Url::parse("http://h:x/").is_err());
        assert!(Url::parse("http:///x").is_err());
    }

    #[test]
    fn gets_from_loopback() {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            for body in [&b"hello"[..], b""] {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf).unwrap();
                if body.is_empty() {
                    c.write_all(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap();
                } else {
                    c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
                        .unwrap();
                }
            }
        });
        let u = Url::parse(&format!("http://127.0.0.1:{port}/b")).unwrap();
        let (mut r, len) = get(&u).unwrap();
        assert_eq!(len, Some(5));
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        let e = get(&u).err().unwrap();
        assert!(e.to_string().contains("404"), "{e}");
        t.join().unwrap();
    }
}
