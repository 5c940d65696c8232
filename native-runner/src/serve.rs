//! `runner serve`: a static HTTP server for the web demo, the wasm package and the models.
//!
//! Browsers read models with Range requests and run the wasm build with threads/WebGPU, so the
//! server must get ranges right (206, 416, If-Range) and send the cross-origin isolation headers
//! (COOP/COEP) that `SharedArrayBuffer` needs. File serving itself is tower-http's `ServeDir`;
//! this module adds only what it lacks (If-Range) and the headers. WebRTC signaling for the
//! shard fleet is served next to the files, at `/signal` (`signal`), and the models folder's
//! index at `/models/index.json` (`catalog`).

use std::convert::Infallible;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{
    ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_RANGE, LAST_MODIFIED, RANGE,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use axum::middleware::{self, Next};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_http::cors::{AllowHeaders, Any, CorsLayer};
use tower_http::services::fs::ServeFileSystemResponseBody;
use tower_http::services::ServeDir;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;
use webshard::shard::fleet_room;

use crate::catalog::catalog_routes;
use crate::signal::{signal_routes, SIGNAL_PATH};

/// Where the served directories are and where to listen.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Repository root: `web/` is served at `/` and `pkg/` at `/pkg/`.
    pub root: PathBuf,
    /// Served at `/models/`; `<root>/models` when `None`.
    pub models_dir: Option<PathBuf>,
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// Appends one JSON line per request to this file (tests count a page's requests).
    pub request_log: Option<PathBuf>,
    /// When set, `/signal` admits only this fleet's room (`webshard::shard::fleet_room`).
    pub fleet_token: Option<String>,
}

impl ServeOptions {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            models_dir: None,
            host: "127.0.0.1".to_string(),
            port: 0,
            request_log: None,
            fleet_token: None,
        }
    }

    pub fn models_path(&self) -> PathBuf {
        self.models_dir
            .clone()
            .unwrap_or_else(|| self.root.join("models"))
    }
}

/// A bound, not yet running server: files and `/signal`. Routes can be added before `run`.
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    app: Router,
    log: Option<RequestLog>,
}

impl Server {
    /// Binds the listener, so the actual address (port 0 resolved) is known before serving.
    pub async fn bind(opts: &ServeOptions) -> io::Result<Self> {
        let listener = TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .map_err(|err| bind_error(opts, err))?;
        let addr = listener.local_addr()?;
        let log = match &opts.request_log {
            Some(path) => Some(RequestLog::open(path)?),
            None => None,
        };
        Ok(Self {
            listener,
            addr,
            app: static_routes(opts).merge(signal_routes(opts.fleet_token.as_deref())),
            log,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://HOST:PORT/`.
    pub fn base_url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Adds routes next to the static ones; they get the same CORS and isolation headers.
    pub fn merge(mut self, routes: Router) -> Self {
        self.app = self.app.merge(routes);
        self
    }

    /// Serves until the process ends.
    pub async fn run(self) -> io::Result<()> {
        let mut app = with_headers(self.app);
        if let Some(log) = self.log {
            app = app.layer(middleware::from_fn_with_state(log, log_request));
        }
        // Signaling reads the peer's address.
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        // Without TCP_NODELAY a response written as headers then body (a GGUF range, an SSE
        // chunk) waits for the client's delayed ACK: 40 ms per small read on loopback, most of
        // a donor's load of its layers over HTTP.
        let listener = self.listener.tap_io(|tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::warn!(%error, "could not set TCP_NODELAY");
            }
        });
        axum::serve(listener, app).await
    }
}

/// The bind error naming the address, with what to do when the port is taken.
fn bind_error(opts: &ServeOptions, err: io::Error) -> io::Error {
    let address = format!("{}:{}", opts.host, opts.port);
    let message = match err.kind() {
        io::ErrorKind::AddrInUse => {
            format!(
                "port {} on {} is already in use: pick another with --port (0 picks a free one)",
                opts.port, opts.host
            )
        }
        _ => format!("cannot listen on {address}: {err}"),
    };
    io::Error::new(err.kind(), message)
}

/// Binds, prints the URLs (the first line is `serving http://HOST:PORT/`), and serves.
pub async fn serve(opts: &ServeOptions) -> io::Result<()> {
    if !opts.root.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "--root {} is not a folder (it should hold web/, pkg/ and models/)",
                opts.root.display()
            ),
        ));
    }
    let server = Server::bind(opts).await?;
    let mut stdout = io::stdout().lock();
    stdout.write_all(banner(&server.base_url(), opts).as_bytes())?;
    stdout.flush()?;
    drop(stdout);
    server.run().await
}

/// One string, written at once: a reader that takes only the first line and closes the pipe
/// must not make later lines fail.
pub fn banner(base: &str, opts: &ServeOptions) -> String {
    let web = opts.root.join("web");
    let pkg = opts.root.join("pkg");
    let signal = base.replacen("http://", "ws://", 1) + SIGNAL_PATH.trim_start_matches('/');
    let rooms = match &opts.fleet_token {
        Some(token) => format!("/{}  (the fleet's room only)", fleet_room(token)),
        None => "/ROOM  (any room)".to_string(),
    };
    format!(
        "serving {base}\n  web     {base}  <- {}\n  models  {base}models/  <- {}\n  pkg     {base}pkg/  <- {}\n  signal  {signal}{rooms}\n",
        web.display(),
        opts.models_path().display(),
        pkg.display()
    )
}

/// The file behind `--request-log`, shared by the connections.
#[derive(Clone)]
struct RequestLog(Arc<Mutex<std::fs::File>>);

impl RequestLog {
    fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self(Arc::new(Mutex::new(file))))
    }
}

/// `{"method", "path", "range", "status"}` of each request, written when its response starts.
async fn log_request(
    State(log): State<RequestLog>,
    req: Request<Body>,
    next: Next,
) -> axum::response::Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let range = req
        .headers()
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let response = next.run(req).await;
    let line = serde_json::json!({
        "method": method,
        "path": path,
        "range": range,
        "status": response.status().as_u16(),
    });
    if let Ok(mut file) = log.0.lock() {
        let _ = writeln!(file, "{line}");
    }
    response
}

fn static_routes(opts: &ServeOptions) -> Router {
    catalog_routes(&opts.models_path())
        .nest_service("/models", static_dir(&opts.models_path()))
        .nest_service("/pkg", static_dir(&opts.root.join("pkg")))
        .fallback_service(static_dir(&opts.root.join("web")))
}

fn with_headers(app: Router) -> Router {
    let expose = [CONTENT_RANGE, CONTENT_LENGTH, ETAG, ACCEPT_RANGES];
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::HEAD, Method::OPTIONS, Method::POST])
        // Mirrored rather than `*`: a wildcard does not cover `Authorization` (API keys).
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(expose);
    app.layer(isolation_header(
        "cross-origin-resource-policy",
        "cross-origin",
    ))
    .layer(isolation_header(
        "cross-origin-embedder-policy",
        "require-corp",
    ))
    .layer(isolation_header(
        "cross-origin-opener-policy",
        "same-origin",
    ))
    .layer(cors)
    .layer(TraceLayer::new_for_http())
}

fn isolation_header(
    name: &'static str,
    value: &'static str,
) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::overriding(
        HeaderName::from_static(name),
        HeaderValue::from_static(value),
    )
}

type FileResponse = Response<ServeFileSystemResponseBody>;

/// `ServeDir` with multi-range requests answered by the full file (200) and If-Range honoured.
fn static_dir(
    dir: &Path,
) -> impl tower::Service<
    Request<Body>,
    Response = FileResponse,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    let files = ServeDir::new(dir).ignore_multi_range_requests(true);
    tower::service_fn(move |req: Request<Body>| honor_if_range(files.clone(), req))
}

/// `ServeDir` ignores If-Range; without it a client resuming a changed file would splice
/// bytes of two versions. Probe the current validators with a HEAD and drop the Range header
/// when they no longer match (RFC 9110 §13.1.5: then the full representation is sent).
async fn honor_if_range(
    files: ServeDir,
    mut req: Request<Body>,
) -> Result<FileResponse, Infallible> {
    let if_range = req.headers().get(IF_RANGE).cloned();
    if let (Some(if_range), true) = (if_range, req.headers().contains_key(RANGE)) {
        let mut probe = Request::new(Body::empty());
        *probe.method_mut() = Method::HEAD;
        *probe.uri_mut() = req.uri().clone();
        let current = files.clone().oneshot(probe).await?;
        if !if_range_matches(&if_range, current.headers()) {
            req.headers_mut().remove(RANGE);
        }
    }
    files.oneshot(req).await
}

/// An entity tag matches only by strong comparison; a date matches the exact Last-Modified.
fn if_range_matches(if_range: &HeaderValue, current: &HeaderMap) -> bool {
    let wanted = if_range.as_bytes();
    if wanted.starts_with(b"W/") {
        return false;
    }
    let validator = if wanted.starts_with(b"\"") {
        ETAG
    } else {
        LAST_MODIFIED
    };
    current
        .get(validator)
        .is_some_and(|value| value.as_bytes() == wanted && !value.as_bytes().starts_with(b"W/"))
}
