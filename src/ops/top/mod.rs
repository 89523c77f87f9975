//! `tollgate top`: the coordinator's hottest scopes, live, in a terminal.
//!
//! # Layout
//! - [`model`]: fetched scopes, rejection counts, sort, filter, selection
//!   and the freeze dialog — no terminal, driven by tests with [`Key`]s.
//! - [`view`]: the ratatui widget that draws a model, its [`view::COLUMNS`]
//!   table, and the buffer-to-text used by `--once`.
//! - here: [`Source`] (the Admin calls: one poll, one freeze), Watch as a
//!   nudge to poll early, and the terminal loop.
//!
//! Data flows Admin API → [`Source::fetch`] → [`Model::update`] →
//! [`view::Screen`]; keys flow terminal → [`Model::on_key`] → [`Action`] →
//! [`Source::apply`].

pub mod model;
pub mod view;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::Rect;
use ratatui::widgets::Widget;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tollgate_proto::v1::{self, admin_client::AdminClient, budget_client::BudgetClient};
use tollgate_vocab::clock::SystemClock;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status};

pub use model::{Action, Key, Model, ScopeRow, SortKey};

use super::{Client, EXIT_OK, Failure, Outcome};

/// GetScope calls in flight at once during a poll: enough to poll a few
/// hundred scopes in well under the interval, few enough not to load the
/// coordinator an SRE is watching in an incident.
const FETCH_CONCURRENCY: usize = 16;
/// Watch takes at most this many scopes per stream; `top` watches the
/// first rows and polls the rest.
const WATCH_SCOPES: usize = 64;

/// `tollgate top`'s own flags.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// How often to poll the Admin API (Watch events refresh sooner).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Scopes to fetch and rank at each poll, at most.
    #[arg(long, default_value_t = 200)]
    pub limit: usize,
    /// Caller-scope pattern.
    #[arg(long, default_value = "*")]
    pub caller_scope: String,
    /// Route pattern.
    #[arg(long, default_value = "*")]
    pub route: String,
    /// Print one frame to stdout and exit (for scripts and docs).
    #[arg(long)]
    pub once: bool,
    /// The frame's width for `--once`.
    #[arg(long, default_value_t = 140)]
    pub width: u16,
}

/// The Admin calls `top` makes, with the operator's token.
#[derive(Debug, Clone)]
pub struct Source {
    channel: Channel,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
    caller_scope: String,
    route: String,
    limit: usize,
}

impl Source {
    /// Polls `channel` as the holder of `token` (an admin token; none in
    /// open dev mode), every scope up to `limit`.
    ///
    /// A token that is not a valid header value is INVALID_ARGUMENT naming
    /// `--token`.
    pub fn new(channel: Channel, token: Option<&str>, limit: usize) -> Result<Source, Status> {
        let token = token
            .map(|t| format!("Bearer {t}").parse())
            .transpose()
            .map_err(|_| Status::invalid_argument("--token: not a valid header value"))?;
        Ok(Source {
            channel,
            token,
            caller_scope: "*".into(),
            route: "*".into(),
            limit,
        })
    }

    /// Only scopes matching these patterns (`exact`, `prefix*`, `*`).
    pub fn matching(mut self, caller_scope: String, route: String) -> Source {
        self.caller_scope = caller_scope;
        self.route = route;
        self
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(Duration::from_secs(10));
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// One poll: ListScopes, then GetScope for each listed scope.
    pub async fn fetch(&self) -> Result<Vec<v1::ScopeState>, Status> {
        let mut admin = AdminClient::new(self.channel.clone());
        let mut listed = Vec::new();
        let mut page_token = String::new();
        while listed.len() < self.limit {
            let page = admin
                .list_scopes(self.request(v1::ListScopesRequest {
                    caller_scope: self.caller_scope.clone(),
                    route: self.route.clone(),
                    frozen_only: false,
                    page_size: u32::try_from((self.limit - listed.len()).min(500)).unwrap_or(500),
                    page_token: std::mem::take(&mut page_token),
                    tenant: String::new(),
                }))
                .await?
                .into_inner();
            listed.extend(page.scopes);
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        let mut states = Vec::with_capacity(listed.len());
        for chunk in listed.chunks(FETCH_CONCURRENCY) {
            let mut calls = JoinSet::new();
            for s in chunk {
                let (mut admin, request) = (
                    admin.clone(),
                    self.request(v1::GetScopeRequest {
                        caller_scope: s.caller_scope.clone(),
                        route: s.route.clone(),
                    }),
                );
                calls.spawn(async move { admin.get_scope(request).await });
            }
            while let Some(joined) = calls.join_next().await {
                let reply = joined.map_err(|e| Status::internal(format!("a poll task: {e}")))?;
                states.push(reply?.into_inner());
            }
        }
        Ok(states)
    }

    /// Carries out `action` on the coordinator; returns a line for the
    /// status bar. `Quit` does nothing here.
    pub async fn apply(&self, action: &Action) -> Result<String, Status> {
        match action {
            Action::Quit => Ok(String::new()),
            Action::Freeze {
                caller_scope,
                route,
                reason,
            } => {
                AdminClient::new(self.channel.clone())
                    .freeze_scope(self.request(v1::FreezeScopeRequest {
                        caller_scope: caller_scope.clone(),
                        route: route.clone(),
                        reason: reason.clone(),
                        duration_ms: 0,
                    }))
                    .await?;
                Ok(format!("froze {caller_scope}|{route}"))
            }
        }
    }

    /// Polls once and renders one `width`-wide frame as text.
    pub async fn frame_text(
        &self,
        model: &mut Model,
        server: &str,
        width: u16,
    ) -> Result<String, Status> {
        model.update(self.fetch().await?);
        // Title, header, one line per scope, footer.
        let height = u16::try_from(model.visible().len() + 3).unwrap_or(u16::MAX);
        let area = Rect::new(0, 0, width, height);
        let mut buf = Buffer::empty(area);
        view::Screen { model, server }.render(area, &mut buf);
        Ok(view::buffer_text(&buf))
    }

    /// Watches `scopes` (1..=64; `top` passes its first rows) and sends `()`
    /// on `nudge` at every change of state, so a cooldown or freeze shows
    /// before the next poll.
    /// Ends when the stream or every receiver does; `Err` when the
    /// coordinator refuses the Watch (it takes a caller token, which an
    /// admin token is not, unless the coordinator runs in open dev mode).
    pub async fn watch(
        &self,
        scopes: Vec<v1::Scope>,
        nudge: mpsc::Sender<()>,
    ) -> Result<(), Status> {
        let mut stream = BudgetClient::new(self.channel.clone())
            .watch(self.request(v1::WatchRequest {
                scopes,
                worker_id: "tollgate-top".into(),
            }))
            .await?
            .into_inner();
        while let Some(event) = stream.message().await? {
            // A call-back changes no state shown, and comes up to a few
            // times a second while a stated quota goes unused.
            if event.kind() == v1::ScopeEventKind::CallBack {
                continue;
            }
            if nudge.send(()).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}

/// `tollgate top`: the terminal view, or one frame with `--once`.
pub(super) async fn run(client: &Client, server: &str, args: TopArgs) -> Outcome {
    if client.output != super::Output::Table {
        return Err(Failure::invalid(
            "-o: top draws a table; for scripts use `scopes list -o json` or `top --once`",
        ));
    }
    let source = Source::new(client.channel.clone(), client.token.as_deref(), args.limit)
        .map_err(|s| Failure::status("--token", &s))?
        .matching(args.caller_scope, args.route);
    let mut model = Model::new(Arc::new(SystemClock));
    if args.once {
        let text = source
            .frame_text(&mut model, server, args.width)
            .await
            .map_err(|s| Failure::status("reading scopes", &s))?;
        out!("{text}");
        return Ok(EXIT_OK);
    }
    let mut terminal = ratatui::try_init().map_err(|e| Failure {
        code: super::EXIT_FAILURE,
        message: format!("opening the terminal: {e}"),
    })?;
    let result = interactive(&mut terminal, &source, &mut model, server, args.interval).await;
    ratatui::restore();
    result.map(|()| EXIT_OK)
}

async fn interactive(
    terminal: &mut ratatui::DefaultTerminal,
    source: &Source,
    model: &mut Model,
    server: &str,
    interval: Duration,
) -> Result<(), Failure> {
    let mut keys = KeyReader::start();
    let (nudge, mut nudged) = mpsc::channel(1);
    let mut watching: Vec<v1::Scope> = Vec::new();
    let mut watch_task: Option<tokio::task::JoinHandle<()>> = None;
    let mut tick = tokio::time::interval(interval);
    loop {
        let draw = terminal.draw(|f| f.render_widget(view::Screen { model, server }, f.area()));
        draw.map_err(|e| Failure {
            code: super::EXIT_FAILURE,
            message: format!("drawing: {e}"),
        })?;
        tokio::select! {
            _ = tick.tick() => refresh(source, model).await,
            Some(()) = nudged.recv() => refresh(source, model).await,
            key = keys.rx.recv() => {
                let Some(key) = key else { break };
                match model.on_key(key) {
                    Some(Action::Quit) => break,
                    Some(action) => {
                        model.status = match source.apply(&action).await {
                            Ok(done) => done,
                            Err(s) => format!("failed: {}", s.message()),
                        };
                        refresh(source, model).await;
                    }
                    None => {}
                }
            }
        }
        let wanted = model.watch_scopes(WATCH_SCOPES);
        if wanted != watching && !wanted.is_empty() {
            if let Some(old) = watch_task.take() {
                old.abort();
            }
            watching = wanted.clone();
            let (source, nudge) = (source.clone(), nudge.clone());
            watch_task = Some(tokio::spawn(async move {
                // A refused or ended Watch leaves the polling in charge.
                let _ = source.watch(wanted, nudge).await;
            }));
        }
    }
    if let Some(task) = watch_task {
        task.abort();
    }
    Ok(())
}

async fn refresh(source: &Source, model: &mut Model) {
    match source.fetch().await {
        Ok(states) => model.update(states),
        Err(s) => model.status = format!("poll failed: {}", s.message()),
    }
}

/// Reads the terminal's keys on a thread of its own (crossterm's reads
/// block); the thread checks `stop` every 100 ms and ends with its owner.
struct KeyReader {
    rx: mpsc::Receiver<Key>,
    stop: Arc<AtomicBool>,
}

impl KeyReader {
    fn start() -> KeyReader {
        let (tx, rx) = mpsc::channel(16);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match event::poll(Duration::from_millis(100)) {
                    Ok(false) => continue,
                    Ok(true) => {}
                    Err(_) => break,
                }
                let Ok(Event::Key(press)) = event::read() else {
                    continue;
                };
                if press.kind != KeyEventKind::Press {
                    continue;
                }
                let key = match press.code {
                    KeyCode::Char(c) => Key::Char(c),
                    KeyCode::Enter => Key::Enter,
                    KeyCode::Esc => Key::Esc,
                    KeyCode::Backspace => Key::Backspace,
                    KeyCode::Up => Key::Up,
                    KeyCode::Down => Key::Down,
                    _ => continue,
                };
                if tx.blocking_send(key).is_err() {
                    break;
                }
            }
        });
        KeyReader { rx, stop }
    }
}

impl Drop for KeyReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
