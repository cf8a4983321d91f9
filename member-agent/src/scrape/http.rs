//! One pod's metrics over HTTP/1.1 or HTTPS: a GET of its metrics path, within one timeout
//! for connect, TLS and the whole response, with a capped body.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::Request;
use hyper::header::{ACCEPT, HOST, USER_AGENT};
use hyper::http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The largest metrics response read; a larger one makes the pod missing. A vLLM engine's
/// exposition is a few tens of KiB.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Why a pod has no value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum Miss {
    /// The port name is not among the pod's container ports.
    #[error("{0}")]
    NoPort(String),
    /// `status.podIP` does not parse.
    #[error("pod IP {0:?} is not an IP address")]
    BadAddress(String),
    /// Connect, TLS and response took longer than the target's timeout.
    #[error("timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The TCP connection failed or broke.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The TLS handshake failed.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The HTTP exchange failed (not HTTP, cut off).
    #[error("HTTP exchange failed: {0}")]
    Http(String),
    /// The response's status is not 2xx.
    #[error("HTTP status {0}")]
    Status(u16),
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("response larger than {} KiB", MAX_BODY_BYTES / 1024)]
    TooLarge,
    /// The body is not UTF-8.
    #[error("response is not UTF-8")]
    NotUtf8,
    /// The exposition has no series of the metric.
    #[error("no metric {0:?}")]
    NoMetric(String),
    /// A sample line of the metric does not parse.
    #[error("exposition: {0}")]
    Malformed(String),
}

impl Miss {
    /// The `outcome` label of the scrape.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Miss::NoPort(_) => "no_port",
            Miss::BadAddress(_) => "bad_address",
            Miss::Timeout(_) => "timeout",
            Miss::Connect(_) => "connect_error",
            Miss::Tls(_) => "tls_error",
            Miss::Http(_) => "http_error",
            Miss::Status(_) => "http_status",
            Miss::TooLarge => "too_large",
            Miss::NotUtf8 => "not_utf8",
            Miss::NoMetric(_) => "no_metric",
            Miss::Malformed(_) => "malformed",
        }
    }
}

/// Where and how to GET a pod's metrics.
#[derive(Debug, Clone)]
pub(crate) struct Fetch<'a> {
    /// The pod's IP and port.
    pub(crate) addr: SocketAddr,
    /// Path and query.
    pub(crate) path: &'a PathAndQuery,
    /// TLS configuration for `https`; `None` for plain HTTP.
    pub(crate) tls: Option<&'a Arc<ClientConfig>>,
    /// Covers connect, TLS and the whole response.
    pub(crate) timeout: Duration,
}

/// The body of a pod's metrics response.
pub(crate) async fn fetch(request: Fetch<'_>) -> Result<String, Miss> {
    let attempt = async {
        let tcp = TcpStream::connect(request.addr)
            .await
            .map_err(|e| Miss::Connect(e.to_string()))?;
        match request.tls {
            None => exchange(tcp, &request).await,
            Some(config) => {
                let name = ServerName::IpAddress(request.addr.ip().into());
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| Miss::Tls(e.to_string()))?;
                exchange(tls, &request).await
            }
        }
    };
    tokio::time::timeout(request.timeout, attempt)
        .await
        .unwrap_or(Err(Miss::Timeout(request.timeout)))
}

/// One GET on a fresh connection; the connection is driven alongside and closed when the
/// response has been read (the request sender is dropped first).
async fn exchange<S>(io: S, request: &Fetch<'_>) -> Result<String, Miss>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| Miss::Http(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(http)?;
    let get = Request::get(request.path.as_str())
        .header(HOST, request.addr.to_string())
        .header(ACCEPT, "text/plain")
        .header(
            USER_AGENT,
            concat!("kedge-agent/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|e| Miss::Http(e.to_string()))?;
    let response = async move {
        let response = sender.send_request(get).await.map_err(http)?;
        drop(sender);
        let status = response.status();
        if !status.is_success() {
            return Err(Miss::Status(status.as_u16()));
        }
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<LengthLimitError>() {
                    Miss::TooLarge
                } else {
                    Miss::Http(e.to_string())
                }
            })?
            .to_bytes();
        String::from_utf8(body.into()).map_err(|_| Miss::NotUtf8)
    };
    // A connection that ends cleanly has delivered the body to `response`: only its
    // errors end the exchange.
    let connection = async move {
        match connection.await {
            Err(e) => http(e),
            Ok(()) => std::future::pending().await,
        }
    };
    tokio::select! {
        response = response => response,
        error = connection => Err(error),
    }
}

/// TLS for pods' metrics endpoints, which serve self-signed certificates (vLLM's, as Kaito's
/// scaler assumes): any certificate is accepted, as Kaito's scaler does
/// (`InsecureSkipVerify`). The agent reaches the pod at the IP the API server gave it, inside
/// its own cluster, so the certificate adds no identity the pod IP does not; the handshake
/// signatures are still verified, so the session is encrypted with the key of the
/// certificate the pod presented.
pub(crate) fn insecure_client_config() -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = kedge_net::tls::AnyServerCertificate::new(&provider);
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// What a canned pod answers.
    #[derive(Debug, Clone)]
    pub(crate) struct Canned {
        pub(crate) status: u16,
        pub(crate) body: Vec<u8>,
        pub(crate) delay: Duration,
    }

    impl Canned {
        pub(crate) fn ok(body: &str) -> Self {
            Self {
                status: 200,
                body: body.as_bytes().to_vec(),
                delay: Duration::ZERO,
            }
        }
    }

    /// Serves `canned` to every connection on `listener` (over TLS with `tls`), sending the
    /// head of each request it read to the returned channel.
    pub(crate) fn serve(
        listener: TcpListener,
        canned: Canned,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> mpsc::UnboundedReceiver<String> {
        let (heads, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (canned, tls, heads) = (canned.clone(), tls.clone(), heads.clone());
                tokio::spawn(async move {
                    match tls {
                        None => answer(tcp, canned, heads).await,
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                answer(stream, canned, heads).await;
                            }
                        }
                    }
                });
            }
        });
        rx
    }

    async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
        mut stream: S,
        canned: Canned,
        heads: mpsc::UnboundedSender<String>,
    ) {
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = heads.send(String::from_utf8_lossy(&head).into_owned());
        tokio::time::sleep(canned.delay).await;
        let mut response = format!(
            "HTTP/1.1 {} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
            canned.status,
            canned.body.len()
        )
        .into_bytes();
        response.extend_from_slice(&canned.body);
        let _ = stream.write_all(&response).await;
        let _ = stream.shutdown().await;
    }

    /// A TLS acceptor with a fresh self-signed certificate.
    pub(crate) fn self_signed() -> tokio_rustls::TlsAcceptor {
        let key = rcgen::generate_simple_self_signed(vec!["pod.invalid".into()]).unwrap();
        let cert = key.cert.der().clone();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        tokio_rustls::TlsAcceptor::from(Arc::new(config))
    }

    async fn pod(canned: Canned, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(serve(listener, canned, tls));
        addr
    }

    async fn get(addr: SocketAddr, https: bool, timeout: Duration) -> Result<String, Miss> {
        let path: PathAndQuery = "/metrics?x=1".parse().unwrap();
        let config = insecure_client_config().unwrap();
        fetch(Fetch {
            addr,
            path: &path,
            tls: https.then_some(&config),
            timeout,
        })
        .await
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_pod_answers_its_exposition_to_a_plain_get() {
        let listener = TcpListener::bind("127.1.0.4:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut heads = serve(listener, Canned::ok("m 1\n"), None);
        assert_eq!(get(addr, false, SECOND).await.unwrap(), "m 1\n");
        let head = heads.recv().await.unwrap().to_ascii_lowercase();
        assert!(head.starts_with("get /metrics?x=1 http/1.1\r\n"), "{head}");
        assert!(head.contains("accept: text/plain\r\n"), "{head}");
        assert!(head.contains(&format!("host: {addr}\r\n")), "{head}");
    }

    #[tokio::test]
    async fn an_error_status_is_a_miss() {
        let mut canned = Canned::ok("m 1\n");
        canned.status = 500;
        let addr = pod(canned, None).await;
        assert_eq!(get(addr, false, SECOND).await, Err(Miss::Status(500)));
    }

    #[tokio::test]
    async fn a_slow_pod_times_out() {
        let mut canned = Canned::ok("m 1\n");
        canned.delay = Duration::from_secs(30);
        let addr = pod(canned, None).await;
        let started = std::time::Instant::now();
        let miss = get(addr, false, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(miss, Miss::Timeout(Duration::from_millis(200)));
        assert_eq!(miss.to_string(), "timed out after 200ms");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn an_oversized_body_is_a_miss() {
        let canned = Canned {
            status: 200,
            body: vec![b'#'; MAX_BODY_BYTES + 1],
            delay: Duration::ZERO,
        };
        let addr = pod(canned, None).await;
        assert_eq!(get(addr, false, SECOND).await, Err(Miss::TooLarge));
        // Exactly the limit is read.
        let canned = Canned {
            status: 200,
            body: vec![b'#'; MAX_BODY_BYTES],
            delay: Duration::ZERO,
        };
        let addr = pod(canned, None).await;
        assert_eq!(
            get(addr, false, SECOND).await.unwrap().len(),
            MAX_BODY_BYTES
        );
    }

    #[tokio::test]
    async fn a_body_that_is_not_utf8_is_a_miss() {
        let canned = Canned {
            status: 200,
            body: vec![b'm', b' ', 0xff, b'\n'],
            delay: Duration::ZERO,
        };
        let addr = pod(canned, None).await;
        assert_eq!(get(addr, false, SECOND).await, Err(Miss::NotUtf8));
    }

    #[tokio::test]
    async fn a_closed_port_and_a_non_http_answer_are_misses() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        let miss = get(closed, false, SECOND).await.unwrap_err();
        assert_eq!(miss.outcome(), "connect_error", "{miss}");

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.write_all(b"SSH-2.0-OpenSSH\r\n").await;
            let _ = tcp.shutdown().await;
        });
        let miss = get(addr, false, SECOND).await.unwrap_err();
        assert_eq!(miss.outcome(), "http_error", "{miss}");
    }

    #[tokio::test]
    async fn https_accepts_a_self_signed_certificate() {
        let addr = pod(Canned::ok("m 2\n"), Some(self_signed())).await;
        assert_eq!(get(addr, true, SECOND).await.unwrap(), "m 2\n");
        // A plain HTTP answer to TLS is a TLS failure.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            let _ = tcp.shutdown().await;
        });
        let miss = get(plain, true, SECOND).await.unwrap_err();
        assert_eq!(miss.outcome(), "tls_error", "{miss}");
    }
}
